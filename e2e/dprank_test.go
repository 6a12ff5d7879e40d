package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/localrouter"
	"github.com/kvgate/kvgate/mocker"
)

// TestDataParallelRankReachesEngine: `kvgate up`'s DP=2 worker (pool-b-w1)
// serves each request on the rank kvgate chose. Idle, the mocker's own
// load balancer would pick rank 0, so a request pinned to rank 1 that the
// engine serves on rank 1 shows x-data-parallel-rank arrived; unpinned
// requests that land there are served on the rank the router reported.
func TestDataParallelRankReachesEngine(t *testing.T) {
	t.Parallel()
	s := startSystem(t)
	c := httpClient(t)
	ctx := testenv.ContextWithTimeout(t, testTimeout)
	p := s.Pool("pool-b")
	var dp *string
	for _, w := range p.Workers {
		if w.DPSize == 2 {
			dp = &w.ID
		}
	}
	if dp == nil {
		t.Fatal("kvgate up has no DP=2 worker in pool-b")
	}
	for _, rank := range []string{"1", "0", "1"} {
		r := chat(t, ctx, c, s, chatBody("mock-llama", "pinned to rank "+rank, false, 2),
			"x-kvgate-pool", "pool-b", "x-kvgate-worker-id", *dp, "x-kvgate-dp-rank", rank,
			"x-data-parallel-rank", "0") // a client's own rank is never trusted
		if r.status != 200 {
			t.Fatalf("rank %s: status %d: %s", rank, r.status, r.body)
		}
		if got := r.header.Get("x-kvgate-dp-rank"); got != rank {
			t.Errorf("x-kvgate-dp-rank %q, want the pinned %s", got, rank)
		}
		if got := r.header.Get(mocker.HeaderServedDPRank); got != rank {
			t.Errorf("engine served rank %q, want %s (the rank kvgate chose)", got, rank)
		}
	}
	// Rank 1's KV events are its own: a long prompt served there is then
	// cached on rank 1 in the local router's index, not on rank 0.
	pinned := func(rank string) reply {
		r := chat(t, ctx, c, s, chatBody("mock-llama", longPrompt("data-parallel", 0), false, 2),
			"x-kvgate-pool", "pool-b", "x-kvgate-worker-id", *dp, "x-kvgate-dp-rank", rank)
		if r.status != 200 || r.header.Get(mocker.HeaderServedDPRank) != rank {
			t.Fatalf("pinned to rank %s: status %d, served by rank %q", rank, r.status, r.header.Get(mocker.HeaderServedDPRank))
		}
		return r
	}
	pinned("1")
	rank1 := 0
	testenv.Eventually(t, 30*time.Second, func() (string, bool) {
		r := pinned("1")
		rank1 = r.overlap
		return fmt.Sprintf("rank 1 overlap %d, want its cached prefix", r.overlap), r.overlap > 20
	})
	// Rank 0 served the pinned requests above, whose rendered chat shares
	// its first block with this one (the system prompt in ChatML fills a
	// 16-token block): at most that much, never rank 1's prefix.
	if r := pinned("0"); r.overlap > 1 || r.overlap >= rank1 {
		t.Errorf("rank 0 overlap %d for a prompt only rank 1 cached (rank 1: %d), want at most the shared system-prompt block", r.overlap, rank1)
	}

	var w1 int
	for _, w := range p.Workers {
		if w.ID == *dp {
			if w.RankStats(1).PrefixQueryTokens == 0 {
				t.Error("rank 1's own engine saw no request")
			}
		}
	}
	for i := range 12 {
		r := chat(t, ctx, c, s, chatBody("mock-llama", fmt.Sprintf("request %d about data parallelism", i), false, 2), "x-kvgate-pool", "pool-b")
		if r.status != 200 {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
		if r.worker == *dp {
			w1++
			if got, want := r.header.Get(mocker.HeaderServedDPRank), r.header.Get("x-kvgate-dp-rank"); got != want {
				t.Errorf("request %d: engine served rank %q, kvgate chose %q", i, got, want)
			}
		}
	}
	t.Logf("%d of 12 unpinned requests went to the DP worker", w1)

	// The local router scrapes both ranks' engine metrics.
	testenv.Eventually(t, 30*time.Second, func() (string, bool) {
		r := p.Router.Router()
		_, ok0 := r.EngineSignals(localrouter.WorkerKey{ID: *dp, DPRank: 0})
		_, ok1 := r.EngineSignals(localrouter.WorkerKey{ID: *dp, DPRank: 1})
		return "engine signals of both ranks never scraped", ok0 && ok1
	})
	waitIdle(t, s)
}
