package localrouterd

import (
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/kvevents"
)

// TestWorkersShowConfigWarning: a worker whose engine stores blocks of
// another size than the pool's has nothing indexed; the Workers answer
// says why and which flag fixes it, and Stats shows the tier weights.
func TestWorkersShowConfigWarning(t *testing.T) {
	t.Parallel() // its own etcd and NATS (newEnv)
	e := newEnv(t)
	cfg := e.config("guard")
	cfg.Router.UseKVEvents = false
	svc, c, _ := e.start(cfg)
	e.putWorker("guard", worker("w1"), 0)
	waitWorkers(t, svc, "w1")
	bad := kvevents.RouterEvent{WorkerID: "w1", EventID: 1, Event: kvevents.Event{Stored: &kvevents.Stored{
		Blocks: []kvevents.Block{{EngineHash: 1, TokenIDs: seqTokens(0, 1)}}}}}
	if err := svc.Router().ApplyEvent(bad); err == nil {
		t.Fatal("a block of 1 token was accepted by a pool of 16")
	}
	ctx := testenv.Context(t)
	ws, err := c.Workers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ws) != 1 || !strings.Contains(ws[0].GetConfigWarning(), "--page-size 16") {
		t.Errorf("Workers = %v, want w1 with a warning naming --page-size 16", ws)
	}
	st, err := c.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := st.GetConfig().GetTierWeights(); got != "cpu=0.8,disk=0.3,external=0.2" {
		t.Errorf("Stats tier weights = %q", got)
	}
}

// TestWorkersShowUnreadSettings: a router setting its worker chain does
// not read is in every Worker's config warning and in Stats, naming who
// reads it and the running chain.
func TestWorkersShowUnreadSettings(t *testing.T) {
	t.Parallel() // its own etcd and NATS (newEnv)
	e := newEnv(t)
	cfg := e.config("unread")
	cfg.Router.UseKVEvents = false
	cfg.Router.OverlapScoreCredit = 0.5 // read by the cost scorer; the chain is the default
	svc, c, _ := e.start(cfg)
	e.putWorker("unread", worker("w1"), 0)
	waitWorkers(t, svc, "w1")
	ctx := testenv.Context(t)
	ws, err := c.Workers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := "overlap_score_credit (--router-overlap-score-credit, DYN_ROUTER_KV_OVERLAP_SCORE_CREDIT) = 0.5 is read by the `cost` scorer only; this router's chain is saturation,ttft=1"
	if len(ws) != 1 || ws[0].GetConfigWarning() != want {
		t.Errorf("Workers = %v, want w1 warning %q", ws, want)
	}
	st, err := c.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := st.GetConfig().GetWarnings(); len(got) != 1 || got[0] != want || st.GetConfig().GetWorkerChain() != "saturation,ttft=1" {
		t.Errorf("Stats config warnings %q chain %q, want [%q] under saturation,ttft=1", got, st.GetConfig().GetWorkerChain(), want)
	}
}
