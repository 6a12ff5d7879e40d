package chaos

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/internal/up"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testenv.IgnoreLeaks()...) }

// TestShortRun: a few streams, a worker killed and restarted: the report
// counts requests, nothing hung, no load leaked, and the fault is timed.
func TestShortRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg := DefaultConfig()
	cfg.Streams, cfg.Duration, cfg.Hold, cfg.Kill = 4, 3*time.Second, 300*time.Millisecond, []string{FaultWorker}
	cfg.Up.Pools = []up.PoolSpec{{Name: "pool-a", Workers: 2}, {Name: "pool-b", Workers: 1}}
	cfg.Up.Speedup, cfg.Up.NumBlocks = 20, 2048
	rep, err := Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Requests == 0 || rep.OK == 0 {
		t.Errorf("report %+v: want requests served", rep)
	}
	if rep.Hung != 0 {
		t.Errorf("%d requests hung", rep.Hung)
	}
	for p, n := range rep.LeakedLoad {
		if n != 0 {
			t.Errorf("pool %s: %d requests still counted after the run", p, n)
		}
	}
	if len(rep.Faults) != 1 || rep.Faults[0].Fault != FaultWorker || rep.Faults[0].Err != "" {
		t.Errorf("faults %+v: want the worker fault, run", rep.Faults)
	}
	var b bytes.Buffer
	rep.Print(&b)
	if !strings.Contains(b.String(), "leaked load") {
		t.Errorf("printed report lacks the leaked load:\n%s", b.String())
	}
	if _, err := Run(ctx, Config{Kill: []string{"moon"}}); err == nil || !strings.Contains(err.Error(), "moon") {
		t.Errorf("unknown fault: got %v, want an error naming it", err)
	}
}

// TestAccountingRun: -accounting samples the routers' and the engines'
// counts through the run and reports them, both 0 after.
func TestAccountingRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg := DefaultConfig()
	cfg.Streams, cfg.Duration, cfg.Kill, cfg.Accounting = 4, 2*time.Second, nil, true
	cfg.Up.Pools = []up.PoolSpec{{Name: "pool-a", Workers: 2}, {Name: "pool-b", Workers: 1}}
	cfg.Up.Speedup, cfg.Up.NumBlocks = 20, 2048
	rep, err := Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	a := rep.Accounting
	if a == nil || a.Samples < 2 || a.AfterRouters != 0 || a.AfterEngines != 0 {
		t.Fatalf("accounting %+v: want samples, and both counts 0 after the run", a)
	}
	if p := a.PerRequest; p == nil || p.Both == 0 || p.Open != 0 || p.CommitToAdmit.N != p.Both {
		t.Errorf("per request %+v: want requests both sides counted, none open", p)
	}
	var b bytes.Buffer
	rep.Print(&b)
	if !strings.Contains(b.String(), "accounting (every 100ms)") || !strings.Contains(b.String(), "per request") {
		t.Errorf("printed report lacks the accounting:\n%s", b.String())
	}
}
