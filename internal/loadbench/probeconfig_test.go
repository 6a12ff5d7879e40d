package loadbench

import (
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/globalrouter"
)

// TestParseProbeConfig: the benchmarks' -probe-config file decodes the
// global router's probe section strictly; an unknown key, a bad value or a
// commit mode the global router refuses is an error naming the file.
func TestParseProbeConfig(t *testing.T) {
	p, err := ParseProbeConfig("probe.yaml", []byte("probe:\n  commit: pipelined\n  timeout: 40ms\n"))
	if err != nil {
		t.Fatal(err)
	}
	if p.Commit != globalrouter.CommitPipelined || p.Timeout != 40*time.Millisecond {
		t.Errorf("got %+v, want commit pipelined, timeout 40ms", p)
	}
	for _, bad := range []string{
		"probe:\n  comit: decide\n",
		"probe:\n  commit: nonsense\n",
		"probe:\n  timeout: soon\n",
		"pools: []\n",
		"",
		"probe: [\n",
	} {
		if _, err := ParseProbeConfig("probe.yaml", []byte(bad)); err == nil || !strings.Contains(err.Error(), "probe") {
			t.Errorf("%q: got %v, want an error naming the file", bad, err)
		}
	}
}

// FuzzParseProbeConfig: any file is decoded or refused, never a panic.
func FuzzParseProbeConfig(f *testing.F) {
	for _, s := range []string{"probe:\n  commit: decide\n", "probe:\n  timeout: 1s\n  min_timeout: 2s\n", "probe: 3\n", "- a\n", "{"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		_, _ = ParseProbeConfig("fuzz.yaml", data)
	})
}
