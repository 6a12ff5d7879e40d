package app

import (
	"context"
	"runtime/debug"
	"strings"
	"testing"
)

// TestUsageExitStatus: no subcommand is bad usage (2); -h, help and every
// subcommand's -h print their usage and succeed (0); an unknown subcommand
// is bad usage.
func TestUsageExitStatus(t *testing.T) {
	tests := []struct {
		args   []string
		status int
	}{
		{nil, 2},
		{[]string{"-h"}, 0},
		{[]string{"--help"}, 0},
		{[]string{"help"}, 0},
		{[]string{"help", "policy"}, 0},
		{[]string{"nosuch"}, 2},
		{[]string{"policy", "replay", "-h"}, 0},
		{[]string{"policy", "check", "-h"}, 0},
		{[]string{"version", "extra"}, 2},
	}
	for _, c := range commands(nil) {
		tests = append(tests, struct {
			args   []string
			status int
		}{[]string{c.name, "-h"}, 0})
	}
	for _, tt := range tests {
		t.Run(strings.Join(append([]string{"kvgate"}, tt.args...), " "), func(t *testing.T) {
			err := Run(context.Background(), tt.args)
			if got := exitStatus(err); got != tt.status {
				t.Errorf("exit status %d (err %v), want %d", got, err, tt.status)
			}
		})
	}
}

func TestWriteVersion(t *testing.T) {
	bi := &debug.BuildInfo{GoVersion: "go1.26", Main: debug.Module{Path: "github.com/kvgate/kvgate", Version: "v0.3.0"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.modified", Value: "true"}, {Key: "vcs.time", Value: "2026-12-01T00:00:00Z"}}}
	var b strings.Builder
	writeVersion(&b, bi)
	want := "kvgate v0.3.0\nmodule   github.com/kvgate/kvgate\nrevision abc123 (modified)\ntime     2026-12-01T00:00:00Z\ngo       go1.26\n"
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
	b.Reset()
	writeVersion(&b, &debug.BuildInfo{GoVersion: "go1.26", Main: debug.Module{Path: "m"}})
	if !strings.Contains(b.String(), "kvgate (devel)") || !strings.Contains(b.String(), "revision unknown") {
		t.Errorf("without VCS information: got\n%s", b.String())
	}
}
