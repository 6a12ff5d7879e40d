package app

import (
	"context"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/lib/config"
)

// TestListenFlags: every listen flag of every subcommand reads an address
// one way (config.Listen: a port alone is loopback, docs/security.md
// "Addresses"). The table names each; a flag that looks like a listen
// address and is missing from it fails, so a new one cannot slip in as
// a plain string with Go's every-interface meaning.
func TestListenFlags(t *testing.T) {
	listen := map[string][]string{
		"extproc":     {"addr", "admin-addr", "metrics-addr", "health-addr", "subtree-listen"},
		"localrouter": {"addr", "grpc-addr", "admin-addr", "metrics-addr", "health-addr"},
		"mocker":      {"addr"},
		"relay":       {"admin-addr", "metrics-addr"},
		"up":          {"gateway-addr", "extproc-addr", "admin-addr"},
	}
	// Addresses that are not listened on: registered, or dialled.
	notListen := []string{"advertise-addr", "advertise", "subtree-advertise", "address", "otlp-endpoint"}
	line := regexp.MustCompile(`(?m)^  -([a-z0-9-]+)(?: (\S+))?$`)
	for _, c := range commands(nil) {
		t.Run(c.name, func(t *testing.T) {
			usage := usageOf(t, c.name)
			kinds := map[string]string{}
			for _, m := range line.FindAllStringSubmatch(usage, -1) {
				kinds[m[1]] = m[2]
			}
			if _, ok := listen[c.name]; ok && len(kinds) < 3 {
				t.Fatalf("read %d flags from the usage:\n%s", len(kinds), usage)
			}
			for _, f := range listen[c.name] {
				if k, ok := kinds[f]; !ok || k != config.ListenKind {
					t.Errorf("-%s: kind %q (present %v), want %s", f, k, ok, config.ListenKind)
				}
			}
			for f, k := range kinds {
				looks := f == "addr" || strings.HasSuffix(f, "-addr") || strings.HasSuffix(f, "listen")
				if (looks || k == config.ListenKind) && !slices.Contains(listen[c.name], f) && !slices.Contains(notListen, f) {
					t.Errorf("-%s (kind %q) is not in the table of listen flags", f, k)
				}
			}
		})
	}
}

// usageOf runs `kvgate name -h` and returns what it printed.
func usageOf(t *testing.T, name string) string {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "usage")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	saved := os.Stderr
	os.Stderr = f
	err = Run(context.Background(), []string{name, "-h"})
	os.Stderr = saved
	if exitStatus(err) != 0 {
		t.Fatalf("kvgate %s -h: %v", name, err)
	}
	b, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
