package replica_test

import (
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/kvevents"
	"github.com/kvgate/kvgate/localrouter"
	"github.com/kvgate/kvgate/localrouter/replica"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testenv.IgnoreLeaks()...)
}

func newReplica(t *testing.T, url, id string, cfg localrouter.Config) (*localrouter.Router, *replica.Sync) {
	t.Helper()
	r, err := localrouter.New(cfg, localrouter.Options{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	r.AddWorker("w1", 1)
	s, err := replica.New(testenv.ConnectNATS(t, url), r, replica.Options{Pool: "p", RouterID: id, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return r, s
}

func TestSync(t *testing.T) {
	url := testenv.StartNATS(t)
	cfg := localrouter.DefaultConfig()
	cfg.UseKVEvents = false
	ra, a := newReplica(t, url, "a", cfg)
	rb, _ := newReplica(t, url, "b", cfg)
	key := localrouter.WorkerKey{ID: "w1"}
	local, _ := kvevents.LocalHashes(make([]uint32, 64), 16, "")

	a.Added("r1", routing.Selection{WorkerID: key.ID, DPRank: key.DPRank, OverlapBlocks: 1}, local, 64, true)
	testenv.Eventually(t, 30*time.Second, func() (string, bool) {
		l := rb.Active().Load(key)
		return fmt.Sprintf("b's load %+v", l), l.ActiveRequests == 1 && l.PrefillTokens == 48
	})
	if n := rb.Index().TreeSize(key); n != 4 {
		t.Errorf("b's approximate index holds %d blocks for w1, want 4", n)
	}
	a.PrefillCompleted("r1")
	testenv.Eventually(t, 30*time.Second, func() (string, bool) {
		l := rb.Active().Load(key)
		return fmt.Sprintf("b's load %+v", l), l.ActiveRequests == 1 && l.PrefillTokens == 0
	})
	a.Freed("r1")
	testenv.Eventually(t, 30*time.Second, func() (string, bool) {
		l := rb.Active().Load(key)
		return fmt.Sprintf("b's load %+v", l), l.ActiveRequests == 0
	})
	// a ignored its own three messages: its router never saw r1.
	testenv.Eventually(t, 30*time.Second, func() (string, bool) {
		st := a.Stats()
		return fmt.Sprintf("a's stats %+v", st), st.Ignored == 3 && st.Sent == 3 && st.Received == 0
	})
	if n := ra.Active().Stats().Requests; n != 0 {
		t.Errorf("a holds %d requests, want 0", n)
	}
}
