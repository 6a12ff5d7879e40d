package globalrouter_test

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/policies"
	"github.com/kvgate/kvgate/pool"
	"github.com/kvgate/kvgate/pool/pooltest"
	"github.com/kvgate/kvgate/tokenizer"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

// golden compares got with testdata/name.golden (-update rewrites it).
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if diff := cmp.Diff(string(want), got); diff != "" {
		t.Errorf("%s differs (-want +got; run with -update to accept):\n%s", path, diff)
	}
}

// TestExplainGolden pins the explanation's text: one worker per pool (no
// random tie-break), a clock that stands still (every probe takes 0s).
func TestExplainGolden(t *testing.T) {
	ctx := testenv.Context(t)
	a := pooltest.Start(t, "pool-a", 16, pooltest.Workers("a", 1)...)
	b := pooltest.Start(t, "pool-b", 16, pooltest.Workers("b", 1)...)
	pre := pooltest.Start(t, "prefill", 16, pooltest.Workers("p", 1)...)
	dec := pooltest.Start(t, "decode", 16, pooltest.Workers("d", 1)...)
	epoch := time.Unix(0, 0)
	still := globalrouter.WithClock(func() time.Time { return epoch })
	msgs := chat(longText(100))
	b.Store(t, "b-0", chatTokens(t, msgs))

	cfg := globalrouter.DefaultConfig(
		pool.NewConfig("pool-a", 16, []string{model}, a.Addr),
		pool.NewConfig("pool-b", 16, []string{model}, b.Addr),
	)
	cfg.Probe.Timeout = 10 * time.Second
	r, _ := newRouter(t, cfg, still)

	pc := pool.NewConfig("prefill", 16, []string{model}, pre.Addr)
	pc.Role = policies.RolePrefill
	dc := pool.NewConfig("decode", 16, []string{model}, dec.Addr)
	dc.Role = policies.RoleDecode
	dcfg := globalrouter.DefaultConfig(pc, dc)
	dcfg.Probe.Timeout = 10 * time.Second
	dr, _ := newRouter(t, dcfg, still)

	var out strings.Builder
	for _, tt := range []struct {
		name string
		r    *globalrouter.Router
		req  *globalrouter.Request
	}{
		{"cached on pool-b", r, &globalrouter.Request{Model: model, Chat: tokenizer.NewChat(msgs...), Explain: true}},
		{"short prompt", r, &globalrouter.Request{Model: model, Prompt: "Say hello.", Explain: true}},
		{"pinned worker", r, &globalrouter.Request{Model: model, Chat: tokenizer.NewChat(msgs...), Explain: true, Headers: map[string]string{globalrouter.HeaderWorkerID: "a-0"}}},
		{"disaggregated", dr, &globalrouter.Request{Model: model, Prompt: longText(1000), Explain: true}},
	} {
		d, err := tt.r.Decide(ctx, tt.req)
		if err != nil {
			t.Fatalf("%s: Decide: %v", tt.name, err)
		}
		free(t, d)
		out.WriteString(tt.name + ":\n" + strings.ReplaceAll(d.Explanation, "; ", ";\n  ") + "\n\n")
	}
	golden(t, "explain", out.String())
}
