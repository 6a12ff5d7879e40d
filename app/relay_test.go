package app

import (
	"strings"
	"testing"
)

// TestRelayFlagsNotRead: the registration's flags given without -address
// (no registration) are warned about, naming where each was set; with
// -address they are read, and nothing is warned.
func TestRelayFlagsNotRead(t *testing.T) {
	env := map[string]string{"KVGATE_KV_CAPACITY_BLOCKS": "100"}
	var out strings.Builder
	if _, _, _, err := parseRelay([]string{"-worker-id=w", "-model=m", "-lease-ttl=5s"}, func(k string) string { return env[k] }, &out); err != nil {
		t.Fatal(err)
	}
	if want := "warning: -model, KVGATE_KV_CAPACITY_BLOCKS, -lease-ttl set but not read: read by the engine's etcd registration only, made with -address"; !strings.Contains(out.String(), want) {
		t.Errorf("output %q, want %q", out.String(), want)
	}
	out.Reset()
	cfg, _, _, err := parseRelay([]string{"-worker-id=w", "-model=m", "-lease-ttl=5s", "-address=h:1"}, func(k string) string { return env[k] }, &out)
	if err != nil || !cfg.Register || out.Len() != 0 {
		t.Errorf("with -address: register %v, %v, output %q; want registered, no warning", cfg.Register, err, out.String())
	}
}
