package localrouterd

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/localrouter"
	"github.com/kvgate/kvgate/localrouter/client"
)

// TestAnonymousCommitExpiry: on a router without client identity, a
// request an unauthenticated caller committed by a unary Commit is freed
// after -anonymous-commit-expiry; one freed before is not freed twice; one
// recorded on a Track stream committed before it stays until its stream
// frees it.
func TestAnonymousCommitExpiry(t *testing.T) {
	t.Parallel() // its own etcd and NATS (newEnv)
	e := newEnv(t)
	cfg := e.config("anon")
	cfg.Router.UseKVEvents = false
	cfg.AnonymousCommitExpiry = 100e6
	svc, c, _ := e.start(cfg)
	if svc.anon == nil {
		t.Fatal("a router without mutual TLS has no anonymous-commit expiry")
	}
	e.putWorker("anon", worker("w1"), 0)
	waitWorkers(t, svc, "w1")
	ctx := testenv.Context(t)
	p := client.TokenPrompt(seqTokens(0, 64))
	w1 := localrouter.WorkerKey{ID: "w1"}
	active := func(id string) bool { _, ok := svc.Router().Active().Has(id); return ok }

	tr, err := c.Track(ctx, "tracked", w1, p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Commit(ctx, "freed", w1, p); err != nil {
		t.Fatal(err)
	}
	if err := c.Free(ctx, "freed"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Commit(ctx, "phantom", w1, p); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, testTimeout, func() (string, bool) {
		return "the anonymous unary commit is still active", !active("phantom")
	})
	if got := testutil.ToFloat64(svc.anon.freed); got != 1 {
		t.Errorf("kvgate_localrouter_anonymous_expired_total = %v, want 1 (the freed request is not freed again)", got)
	}
	if !active("tracked") {
		t.Error("a request on a Track stream was expired with the anonymous ones")
	}
	if err := tr.Free(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, testTimeout, func() (string, bool) {
		n := svc.Router().Active().Stats().Requests
		if n != 0 {
			return testenv.Errorf("%d requests active, want 0", n)
		}
		return "", true
	})
}
