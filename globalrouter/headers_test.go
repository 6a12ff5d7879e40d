package globalrouter_test

import (
	"errors"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/policies"
	"github.com/kvgate/kvgate/tokenizer"
)

// countingTokenizer counts the encodes it is asked for (a seam: the
// tokenizer the router is given, nothing else replaced).
type countingTokenizer struct {
	globalrouter.Tokenizer
	n atomic.Int64
}

func (c *countingTokenizer) Encode(text string) ([]uint32, error) {
	c.n.Add(1)
	return c.Tokenizer.Encode(text)
}

func (c *countingTokenizer) EncodeChat(req *tokenizer.ChatRequest) ([]uint32, error) {
	c.n.Add(1)
	return c.Tokenizer.EncodeChat(req)
}

// TestBadHeaderRefusedBeforeTokenizing: a malformed x-kvgate-* header is
// refused without tokenizing (or hashing) the body.
func TestBadHeaderRefusedBeforeTokenizing(t *testing.T) {
	ctx := testenv.Context(t)
	c := newCluster(t)
	tok := &countingTokenizer{Tokenizer: sharedTokenizer(t)}
	r, _ := newRouter(t, c.cfg, globalrouter.WithTokenizer(model, tok))
	for _, tt := range []struct {
		name    string
		headers map[string]string
		want    error
	}{
		{"priority", map[string]string{globalrouter.HeaderPriority: "high"}, globalrouter.ErrBadRequest},
		{"ttft", map[string]string{globalrouter.HeaderTTFT: "soon"}, globalrouter.ErrBadRequest},
		{"itl", map[string]string{globalrouter.HeaderITL: "NaN"}, globalrouter.ErrBadRequest},
		{"override", map[string]string{globalrouter.HeaderRouterTemperature: "-1"}, globalrouter.ErrBadRequest},
		{"override inf", map[string]string{globalrouter.HeaderOverlapScoreCredit: "+Inf"}, globalrouter.ErrBadRequest},
		{"pinned rank", map[string]string{globalrouter.HeaderWorkerID: "a-0", globalrouter.HeaderDPRank: "one"}, globalrouter.ErrPinRefused},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for _, req := range []*globalrouter.Request{
				{Model: model, Prompt: longText(50), Headers: tt.headers},
				{Model: model, Chat: tokenizer.NewChat(chat(longText(50))...), Headers: tt.headers},
			} {
				if _, err := r.Decide(ctx, req); !errors.Is(err, tt.want) {
					t.Fatalf("Decide: got %v, want %v", err, tt.want)
				}
			}
			if n := tok.n.Load(); n != 0 {
				t.Errorf("the tokenizer ran %d times for a request refused on its headers, want 0", n)
			}
		})
	}
	// The same request with good headers is tokenized once.
	d, err := r.Decide(ctx, &globalrouter.Request{Model: model, Prompt: longText(50), Headers: map[string]string{globalrouter.HeaderPriority: "2"}})
	if err != nil {
		t.Fatalf("Decide: %v", err)
	}
	free(t, d)
	if n := tok.n.Load(); n != 1 {
		t.Errorf("the tokenizer ran %d times for one request, want 1", n)
	}
}

// countedPolicy is a policy whose factory counts the chains built.
type countedPolicy struct{}

func (countedPolicy) Name() string { return "counted" }
func (countedPolicy) Rank(_ *policies.Request, c []policies.Candidate) ([]policies.Candidate, error) {
	return c, nil
}

// TestChainBuiltOncePerConfiguration: New, Reload and ReloadFile each
// build the policy chain once.
func TestChainBuiltOncePerConfiguration(t *testing.T) {
	c := newCluster(t)
	reg := builtins(t)
	var builds atomic.Int64
	if err := reg.Register("counted", func(policies.Args) (policies.Policy, error) {
		builds.Add(1)
		return countedPolicy{}, nil
	}); err != nil {
		t.Fatal(err)
	}
	cfg := c.cfg
	cfg.Chain = []policies.Spec{{Name: policies.NameModelMatch}, {Name: "counted"}, {Name: policies.NameCost}}
	r, _ := newRouter(t, cfg, globalrouter.WithPolicies(reg))
	if n := builds.Swap(0); n != 1 {
		t.Errorf("New built the chain %d times, want 1", n)
	}
	if err := r.Reload(cfg); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	if n := builds.Swap(0); n != 1 {
		t.Errorf("Reload built the chain %d times, want 1", n)
	}
	dir := write(t, map[string]string{"pools.yaml": configText(map[string]string{"pool-a": c.a.Addr, "pool-b": c.b.Addr}, "[model-match, counted, cost]")})
	if err := r.ReloadFile(filepath.Join(dir, "pools.yaml")); err != nil {
		t.Fatalf("ReloadFile: %v", err)
	}
	if n := builds.Swap(0); n != 1 {
		t.Errorf("ReloadFile built the chain %d times, want 1", n)
	}
	// A refused configuration builds nothing more than its check.
	bad := cfg
	bad.Pools = nil
	if err := r.Reload(bad); err == nil {
		t.Fatal("Reload of a configuration without pools succeeded")
	}
	if n := builds.Load(); n != 0 {
		t.Errorf("a configuration refused before its chain built it %d times", n)
	}
}
