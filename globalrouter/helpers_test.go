package globalrouter_test

import (
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/policies"
	"github.com/kvgate/kvgate/pool"
	"github.com/kvgate/kvgate/pool/pooltest"
	"github.com/kvgate/kvgate/tokenizer"
)

const model = "llama-3-8b"

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// cluster is pool-a (3 workers) and pool-b (2 workers), as `kvgate up`
// runs them, each behind a real local router on loopback.
type cluster struct {
	a, b *pooltest.Server
	cfg  globalrouter.Config
}

func newCluster(t testing.TB) *cluster {
	t.Helper()
	c := &cluster{
		a: pooltest.Start(t, "pool-a", 16, pooltest.Workers("a", 3)...),
		b: pooltest.Start(t, "pool-b", 16, pooltest.Workers("b", 2)...),
	}
	c.cfg = globalrouter.DefaultConfig(
		pool.NewConfig("pool-a", 16, []string{model}, c.a.Addr),
		pool.NewConfig("pool-b", 16, []string{model}, c.b.Addr),
	)
	// Generous: these tests are about behaviour on a shared machine, not
	// speed (the benchmark measures that).
	c.cfg.Probe.Timeout = 10 * time.Second
	return c
}

// newRouter builds a Router of cfg run as an operator's own deployment:
// trust.steering and trust.routing_headers on, every caller trusted (the
// tests about trust use newRouterAsConfigured).
func newRouter(t testing.TB, cfg globalrouter.Config, opts ...globalrouter.Option) (*globalrouter.Router, *prometheus.Registry) {
	t.Helper()
	cfg.Trust.Steering, cfg.Trust.RoutingHeaders = globalrouter.AccessOn, globalrouter.AccessOn
	return newRouterAsConfigured(t, cfg, opts...)
}

// newRouterAsConfigured builds a Router of cfg, its trust as configured.
func newRouterAsConfigured(t testing.TB, cfg globalrouter.Config, opts ...globalrouter.Option) (*globalrouter.Router, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	r, err := globalrouter.New(cfg, append([]globalrouter.Option{globalrouter.WithLogger(quiet()), globalrouter.WithRegisterer(reg), globalrouter.WithTokenizer(model, sharedTokenizer(t))}, opts...)...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r, reg
}

func chat(text string) []tokenizer.Message {
	return []tokenizer.Message{{Role: "system", Content: "You are a helpful assistant."}, {Role: "user", Content: text}}
}

var (
	tokOnce sync.Once
	tok     *tokenizer.Model
	tokErr  error
)

// sharedTokenizer is the default tokenizer, loaded once for the package's
// tests (loading it is most of a small test's time under -race).
func sharedTokenizer(t testing.TB) *tokenizer.Model {
	t.Helper()
	tokOnce.Do(func() {
		cfg := globalrouter.DefaultTokenizer
		cfg.Logger = quiet()
		tok, tokErr = tokenizer.Load(cfg)
	})
	if tokErr != nil {
		t.Fatal(tokErr)
	}
	return tok
}

// chatTokens are the tokens the router computes for msgs with the default
// tokenizer.
func chatTokens(t testing.TB, msgs []tokenizer.Message) []uint32 {
	t.Helper()
	tok := sharedTokenizer(t)
	tm := make([]tokenizer.Message, len(msgs))
	for i, m := range msgs {
		tm[i] = tokenizer.Message{Role: m.Role, Content: m.Content}
	}
	ids, err := tok.EncodeChat(tokenizer.NewChat(tm...))
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

func free(t testing.TB, d *globalrouter.Decision) {
	t.Helper()
	if err := d.Lease.Free(testenv.Context(t)); err != nil {
		t.Errorf("Free: %v", err)
	}
}

func longText(words int) string {
	b := make([]byte, 0, words*8)
	for i := range words {
		b = append(b, "token"...)
		b = append(b, byte('a'+i%26), byte('a'+i/26%26), ' ')
	}
	return string(b)
}

func section(v any) policies.Section { return policies.SectionOf(v) }

// otherPools are d's fallbacks outside the primary's pool (the same pool's
// other workers come after them).
func otherPools(d *globalrouter.Decision) []globalrouter.Endpoint {
	var out []globalrouter.Endpoint
	for _, f := range d.Fallbacks {
		if f.Pool != d.Primary.Pool {
			out = append(out, f)
		}
	}
	return out
}
