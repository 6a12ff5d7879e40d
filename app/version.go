package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/debug"
)

// runVersion is `kvgate version`: the module version and the VCS revision
// the binary was built from (runtime/debug.ReadBuildInfo).
func runVersion(_ context.Context, args []string) error {
	if len(args) > 0 {
		if args[0] == "-h" || args[0] == "-help" || args[0] == "--help" {
			fmt.Fprintln(os.Stderr, "usage: kvgate version\n\nPrints the module version, the VCS revision and time, and the Go version.")
			return flag.ErrHelp
		}
		return &usageError{fmt.Errorf("unexpected arguments %q", args)}
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return errors.New("no build information in this binary")
	}
	writeVersion(os.Stdout, bi)
	return nil
}

// writeVersion prints bi as `kvgate version`: one key per line.
func writeVersion(w io.Writer, bi *debug.BuildInfo) {
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	v := bi.Main.Version
	if v == "" {
		v = "(devel)"
	}
	fmt.Fprintf(w, "kvgate %s\n", v)
	fmt.Fprintf(w, "module   %s\n", bi.Main.Path)
	rev := settings["vcs.revision"]
	if rev == "" {
		rev = "unknown (built without VCS information)"
	} else if settings["vcs.modified"] == "true" {
		rev += " (modified)"
	}
	fmt.Fprintf(w, "revision %s\n", rev)
	if t := settings["vcs.time"]; t != "" {
		fmt.Fprintf(w, "time     %s\n", t)
	}
	fmt.Fprintf(w, "go       %s\n", bi.GoVersion)
}
