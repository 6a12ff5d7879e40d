package globalrouter_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/policies"
	"github.com/kvgate/kvgate/tokenizer"
)

// TestPinsRunTheChain is issue 13's case: x-kvgate-worker-id of a worker in
// a pool that header-match reserves for another tenant is refused (403
// naming the policy), never served from that pool; pins within the
// tenant's own pools still work, and a reserved priority tier refuses pins
// the same way.
func TestPinsRunTheChain(t *testing.T) {
	ctx := testenv.Context(t)
	c := newCluster(t)
	cfg := c.cfg
	cfg.Pools = slices.Clone(c.cfg.Pools)
	cfg.Chain = []policies.Spec{{Name: "model-match"}, {Name: "header-match"}, {Name: "cost"}}
	cfg.Pools[1].Policy = policies.PoolSection{"header-match": section(policies.HeaderMatchPool{Headers: map[string][]string{"x-tenant": {"beta"}}})}
	r, _ := newRouter(t, cfg)

	acme := map[string]string{"x-tenant": "acme"}
	with := func(h map[string]string, kv ...string) map[string]string {
		out := map[string]string{}
		for k, v := range h {
			out[k] = v
		}
		for i := 0; i+1 < len(kv); i += 2 {
			out[kv[i]] = kv[i+1]
		}
		return out
	}
	for name, h := range map[string]map[string]string{
		"worker in the reserved pool":            with(acme, globalrouter.HeaderWorkerID, "b-0"),
		"reserved pool":                          with(acme, globalrouter.HeaderPool, "pool-b"),
		"worker and the reserved pool":           with(acme, globalrouter.HeaderPool, "pool-b", globalrouter.HeaderWorkerID, "b-0"),
		"worker in the reserved pool, no tenant": {globalrouter.HeaderWorkerID: "b-1"},
	} {
		t.Run(name, func(t *testing.T) {
			d, err := r.Decide(ctx, &globalrouter.Request{Model: model, Prompt: longText(40), Headers: h})
			if d != nil {
				free(t, d)
				t.Fatalf("routed to %s/%s, want a refusal", d.Primary.Pool, d.Primary.WorkerID)
			}
			var ref *globalrouter.Refusal
			if !errors.Is(err, globalrouter.ErrForbidden) || !errors.As(err, &ref) || ref.Reason != "policy_refused" {
				t.Fatalf("got %v, want ErrForbidden (policy_refused)", err)
			}
			if msg := globalrouter.ClientMessage(err); !strings.Contains(msg, "header-match") {
				t.Errorf("client message %q does not name the policy", msg)
			}
		})
	}
	if b := c.b.ActiveRequests(); b != 0 {
		t.Errorf("refused pins left %d requests on pool-b", b)
	}
	// Pins the chain allows are honoured.
	for _, h := range []map[string]string{with(acme, globalrouter.HeaderWorkerID, "a-1"), with(map[string]string{"x-tenant": "beta"}, globalrouter.HeaderWorkerID, "b-1")} {
		d, err := r.Decide(ctx, &globalrouter.Request{Model: model, Prompt: longText(40), Headers: h})
		if err != nil {
			t.Fatalf("allowed pin %v: %v", h, err)
		}
		if d.Primary.WorkerID != h[globalrouter.HeaderWorkerID] {
			t.Errorf("pin %v: primary %+v", h, d.Primary)
		}
		free(t, d)
	}

	// A reserved priority tier: pool-b is for priority ≥ 10.
	cfg = c.cfg
	cfg.Chain = []policies.Spec{{Name: "model-match"}, {Name: "priority", Args: section(policies.PriorityArgs{Tiers: []policies.PriorityTier{{MinPriority: ptr(10), Pools: []string{"pool-b"}, Exclusive: true}}})}, {Name: "cost"}}
	r, _ = newRouter(t, cfg)
	_, err := r.Decide(ctx, &globalrouter.Request{Model: model, Prompt: longText(40), Headers: map[string]string{globalrouter.HeaderWorkerID: "b-0"}})
	if !errors.Is(err, globalrouter.ErrForbidden) || !strings.Contains(globalrouter.ClientMessage(err), "priority") {
		t.Errorf("pin into a reserved tier: got %v, want ErrForbidden naming priority", err)
	}
	d, err := r.Decide(ctx, &globalrouter.Request{Model: model, Prompt: longText(40), Headers: map[string]string{globalrouter.HeaderWorkerID: "b-0", globalrouter.HeaderPriority: "10"}})
	if err != nil {
		t.Fatalf("pin into the tier it belongs to: %v", err)
	}
	free(t, d)
}

func ptr[T any](v T) *T { return &v }

// TestSteeringIsForTrustedCallers: pins, priorities, SLO targets and cost
// overrides are honoured for callers with a trusted token only (403
// otherwise, or for everyone with steering off); routing headers are
// exposed as trust.routing_headers says.
func TestSteeringIsForTrustedCallers(t *testing.T) {
	ctx := testenv.Context(t)
	c := newCluster(t)
	sum := sha256.Sum256([]byte("s3cret"))
	cfg := c.cfg
	cfg.Trust = globalrouter.TrustConfig{TokensSHA256: []string{hex.EncodeToString(sum[:])}, RoutingHeaders: globalrouter.AccessTrusted}
	r, _ := newRouterAsConfigured(t, cfg)

	for _, name := range []string{globalrouter.HeaderPool, globalrouter.HeaderWorkerID, globalrouter.HeaderPriority, globalrouter.HeaderTTFT, globalrouter.HeaderRouterTemperature} {
		for _, tok := range []string{"", "wrong"} {
			h := map[string]string{name: "x"}
			if tok != "" {
				h[globalrouter.DefaultTrustHeader] = tok
			}
			_, err := r.Decide(ctx, &globalrouter.Request{Model: model, Prompt: "hi", Headers: h})
			var ref *globalrouter.Refusal
			if !errors.Is(err, globalrouter.ErrForbidden) || !errors.As(err, &ref) || ref.Reason != "untrusted_header" || !strings.Contains(ref.Public, name) {
				t.Errorf("%s from an untrusted caller (token %q): got %v, want 403 untrusted_header naming it", name, tok, err)
			}
		}
	}
	d, err := r.Decide(ctx, &globalrouter.Request{Model: model, Prompt: "hi", Explain: true, Headers: map[string]string{
		globalrouter.DefaultTrustHeader: "s3cret", globalrouter.HeaderWorkerID: "a-1", globalrouter.HeaderPriority: "3"}})
	if err != nil {
		t.Fatalf("trusted pin: %v", err)
	}
	if d.Primary.WorkerID != "a-1" || !d.Expose || d.Explanation == "" {
		t.Errorf("trusted pin: primary %s expose %v explanation %q; want a-1, exposed and explained", d.Primary.WorkerID, d.Expose, d.Explanation)
	}
	free(t, d)
	d, err = r.Decide(ctx, &globalrouter.Request{Model: model, Prompt: "hi", Explain: true})
	if err != nil {
		t.Fatal(err)
	}
	if d.Expose || d.Explanation != "" {
		t.Errorf("untrusted caller: expose %v, explanation %q; want neither", d.Expose, d.Explanation)
	}
	free(t, d)

	cfg.Trust.Steering = globalrouter.AccessOff
	r, _ = newRouterAsConfigured(t, cfg)
	if _, err := r.Decide(ctx, &globalrouter.Request{Model: model, Prompt: "hi", Headers: map[string]string{
		globalrouter.DefaultTrustHeader: "s3cret", globalrouter.HeaderPool: "pool-a"}}); !errors.Is(err, globalrouter.ErrForbidden) {
		t.Errorf("steering off, trusted caller: got %v, want ErrForbidden", err)
	}
}

// TestOverlapOracleIsClosed is issue 13's oracle: another tenant's guess
// at a cached prompt must answer the same whether it is right or wrong.
// Without salting the guess reads the overlap (the leak); with per-tenant
// salting both guesses see no overlap.
func TestOverlapOracleIsClosed(t *testing.T) {
	ctx := testenv.Context(t)
	c := newCluster(t)
	secret := chat("the launch code is " + longText(60))
	wrong := chat("the launch code is " + longText(61)[1:])
	// The victim's prompt is cached (as its engine reported).
	for _, w := range []string{"a-0", "a-1", "a-2"} {
		c.a.Store(t, w, chatTokens(t, secret))
	}
	for _, w := range []string{"b-0", "b-1"} {
		c.b.Store(t, w, chatTokens(t, secret))
	}
	// Each guess comes from its own tenant: a placed request's blocks are
	// predicted on its worker (localrouter, predicted entries), so a
	// tenant's second guess would see its first one's prefix.
	guesses := 0
	guess := func(r *globalrouter.Router, msgs []tokenizer.Message) int {
		t.Helper()
		guesses++
		d, err := r.Decide(ctx, &globalrouter.Request{Model: model, Chat: tokenizer.NewChat(msgs...), Headers: map[string]string{"x-tenant": fmt.Sprint("mallory-", guesses)}})
		if err != nil {
			t.Fatal(err)
		}
		free(t, d)
		return d.Primary.OverlapBlocks
	}

	open, _ := newRouter(t, c.cfg)
	if right, bad := guess(open, secret), guess(open, wrong); right == bad {
		t.Fatalf("unsalted control: right guess %d blocks, wrong %d; the test shows no leak to close", right, bad)
	}
	cfg := c.cfg
	cfg.Tenancy = globalrouter.TenancyConfig{Header: "x-tenant", Salt: true, Identity: globalrouter.IdentityOn}
	salted, _ := newRouter(t, cfg)
	if right, bad := guess(salted, secret), guess(salted, wrong); right != bad {
		t.Errorf("salted: right guess %d blocks, wrong %d; want the same answer", right, bad)
	}
}

// TestPassiveHealthEjectsWorker: a worker whose connections fail is out of
// the candidates at once (the router's next best is chosen, asked of the
// local router), until its ejection ends; a pinned pool whose workers are
// all ejected is an outage (503), not a refusal.
func TestPassiveHealthEjectsWorker(t *testing.T) {
	ctx := testenv.Context(t)
	c := newCluster(t)
	now := time.Unix(1000, 0)
	cfg := c.cfg
	cfg.Probe.EjectBase, cfg.Probe.EjectMax = 10*time.Second, time.Minute
	r, _ := newRouter(t, cfg, globalrouter.WithClock(func() time.Time { return now }))
	msgs := chat(longText(100))
	c.b.Store(t, "b-1", chatTokens(t, msgs))
	decide := func(h map[string]string) (*globalrouter.Decision, error) {
		d, err := r.Decide(ctx, &globalrouter.Request{Model: model, Chat: tokenizer.NewChat(msgs...), Headers: h})
		if d != nil {
			free(t, d)
		}
		return d, err
	}
	d, err := decide(nil)
	if err != nil || d.Primary.WorkerID != "b-1" {
		t.Fatalf("before: %+v %v, want b-1 (it caches the prompt)", d, err)
	}
	dead := d.Primary
	r.ConnectFailed(dead.Pool, dead.Address)
	for i := range 3 {
		d, err := decide(nil)
		if err != nil {
			t.Fatal(err)
		}
		if d.Primary.Address == dead.Address {
			t.Fatalf("decision %d went to the ejected worker", i)
		}
		for _, f := range d.Fallbacks {
			if f.Address == dead.Address {
				t.Errorf("decision %d: the ejected worker is a fallback", i)
			}
		}
	}
	d, err = decide(map[string]string{globalrouter.HeaderPool: "pool-b"})
	if err != nil || d.Primary.Pool != "pool-b" || d.Primary.WorkerID != "b-0" {
		t.Fatalf("pinned to pool-b with b-1 ejected: %+v %v, want b-0", d, err)
	}
	if _, err := decide(map[string]string{globalrouter.HeaderWorkerID: "b-1"}); !errors.Is(err, globalrouter.ErrNoPool) {
		t.Errorf("pinned to the ejected worker: got %v, want ErrNoPool (an outage)", err)
	}
	r.ConnectFailed("pool-b", d.Primary.Address) // b-0 too: every worker of pool-b
	if _, err := decide(map[string]string{globalrouter.HeaderPool: "pool-b"}); !errors.Is(err, globalrouter.ErrNoPool) || errors.Is(err, globalrouter.ErrPinRefused) {
		t.Errorf("pinned pool with every worker ejected: got %v, want ErrNoPool (503), not a refusal", err)
	}
	// The ejection ends: b-1 is a candidate again. (Not necessarily the
	// first: the decisions that went to b-0 meanwhile left the prompt
	// predicted there, localrouter's predicted entries.)
	now = now.Add(10 * time.Second)
	if d, err := decide(map[string]string{globalrouter.HeaderWorkerID: "b-1"}); err != nil || d.Primary.WorkerID != "b-1" {
		t.Errorf("after the ejection, pinned to b-1: %+v %v, want b-1 again", d, err)
	}
}

// TestNoPoolNamesTheRealCause: the tenant's only pool is down and the
// other pool is reserved for another tenant; the answer is an outage of
// that pool (503 no_pool_reachable naming it), not "policy header-match
// dropped all candidates"; once its workers are known, best effort routes
// there instead (header-match still applies).
func TestNoPoolNamesTheRealCause(t *testing.T) {
	ctx := testenv.Context(t)
	c := newCluster(t)
	cfg := c.cfg
	cfg.Pools = slices.Clone(c.cfg.Pools)
	cfg.Chain = []policies.Spec{{Name: "model-match"}, {Name: "header-match"}, {Name: "cost"}}
	cfg.Pools[0].Policy = policies.PoolSection{"header-match": section(policies.HeaderMatchPool{Headers: map[string][]string{"x-tenant": {"beta"}}})}
	cfg.Pools[1].Policy = policies.PoolSection{"header-match": section(policies.HeaderMatchPool{Headers: map[string][]string{"x-tenant": {"acme"}}})}
	acme := &globalrouter.Request{Model: model, Prompt: longText(40), Headers: map[string]string{"x-tenant": "acme"}}

	warm, _ := newRouter(t, cfg)
	d, err := warm.Decide(ctx, acme) // warm learns pool-b's workers
	if err != nil {
		t.Fatal(err)
	}
	free(t, d)
	c.b.Stop()
	// cold starts with pool-b down: it never learned pool-b's workers (a
	// pool learns them from its routers as soon as it has them).
	cold, _ := newRouter(t, cfg)

	_, err = cold.Decide(ctx, acme)
	var ref *globalrouter.Refusal
	if !errors.Is(err, globalrouter.ErrNoPool) || !errors.As(err, &ref) || ref.Reason != "no_pool_reachable" {
		t.Fatalf("acme with pool-b down: got %v, want 503 no_pool_reachable", err)
	}
	if msg := globalrouter.ClientMessage(err); !strings.Contains(msg, "pool-b is unreachable") || strings.Contains(msg, "header-match") {
		t.Errorf("client message %q: want pool-b named unreachable, not the policy", msg)
	}
	d, err = warm.Decide(ctx, acme)
	if err != nil {
		t.Fatalf("acme with pool-b down, its workers known: %v, want best effort", err)
	}
	if !d.BestEffort || d.Primary.Pool != "pool-b" {
		t.Errorf("acme with pool-b down: %+v, want best effort on pool-b", d.Primary)
	}
	free(t, d)
	// A tenant no pool serves is refused by the policy, with its name.
	_, err = cold.Decide(ctx, &globalrouter.Request{Model: model, Prompt: "hi", Headers: map[string]string{"x-tenant": "zed"}})
	if !errors.As(err, &ref) || ref.Reason != "no_pool_allowed" || !strings.Contains(globalrouter.ClientMessage(err), "header-match") {
		t.Errorf("tenant zed: got %v, want no_pool_allowed naming header-match", err)
	}
}

// TestTenantSaltReachesEngine: with salting on, a tenant's decision names
// the cache_salt the engine must get (the tenant's, the client's own salt
// combined after it, never dropped); an untenanted request leaves the body
// alone, and one whose cache_salt spells a tenant's salt is refused. The
// tenant header is believed from trusted callers only (identity trusted,
// the default): without the trust token, or with a wrong one, naming a
// tenant is 403. Without tenancy, no decision names a salt.
func TestTenantSaltReachesEngine(t *testing.T) {
	ctx := testenv.Context(t)
	c := newCluster(t)
	msgs := chat(longText(40))
	cfg := c.cfg
	sum := sha256.Sum256([]byte("gw-token"))
	cfg.Trust.TokensSHA256 = []string{hex.EncodeToString(sum[:])}
	cfg.Tenancy = globalrouter.TenancyConfig{Header: "x-tenant", Salt: true}
	salted, _ := newRouter(t, cfg)
	open, _ := newRouter(t, c.cfg)
	const gw = "gw-token"
	p := globalrouter.TenantSaltPrefix
	tests := []struct {
		name         string
		r            *globalrouter.Router
		tenant, salt string
		token        string
		want         string
		refused      error
	}{
		{"tenant", salted, "acme", "", gw, p + "acme", nil},
		{"tenant and client salt", salted, "acme", "mine", gw, p + "acme\x00mine", nil},
		{"untenanted", salted, "", "mine", "", "", nil},
		{"untenanted spelling a tenant", salted, "", p + "acme", "", "", globalrouter.ErrBadRequest},
		{"forged tenant", salted, "acme", "", "", "", globalrouter.ErrForbidden},
		{"forged tenant, wrong token", salted, "acme", "", "guess", "", globalrouter.ErrForbidden},
		{"tenant not UTF-8", salted, "\xff", "", gw, "", globalrouter.ErrBadRequest},
		{"no tenancy", open, "acme", "mine", "", "", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := map[string]string{}
			if tt.tenant != "" {
				h["x-tenant"] = tt.tenant
			}
			if tt.token != "" {
				h[globalrouter.DefaultTrustHeader] = tt.token
			}
			d, err := tt.r.Decide(ctx, &globalrouter.Request{Model: model, Chat: tokenizer.NewChat(msgs...), Headers: h, CacheSalt: tt.salt})
			if tt.refused != nil {
				if !errors.Is(err, tt.refused) {
					t.Fatalf("got %v, want %v", err, tt.refused)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			free(t, d)
			if d.CacheSalt != tt.want {
				t.Errorf("Decision.CacheSalt %q, want %q", d.CacheSalt, tt.want)
			}
		})
	}
}
