package loadbench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/pool"
	"github.com/kvgate/kvgate/pool/pooltest"
)

// activeActiveRun is one burst on fresh global routers.
//
// The counts checked, each against what the client knows at the time:
//   - during the burst (sampled every millisecond until every exchange
//     ended its request phase): each live router's streams in flight
//     (its ext_proc server's gauge) lie between the exchanges the client
//     had routed through it before the sample and those it had opened
//     after; the local routers' requests in flight are at most the
//     exchanges opened times holds (the entries one request may have at
//     once), and, with probe.commit: decide (the decision waits for the
//     commit), at least those the live routers had routed;
//   - at the hold (every exchange routed or failed, the routed ones still
//     open): each live router's gauge is exactly its routed exchanges, the
//     local routers hold exactly the live routers' routed requests (the
//     killed router's are freed), and the placement counted on the local
//     routers equals the one the routing headers announced;
//   - after the streams close: every gauge and every local router at 0.
func activeActiveRun(ctx context.Context, cfg ActiveActiveConfig, servers []*pooltest.Server, pcs []pool.Config, tok globalrouter.Tokenizer, body []byte) (ActiveActiveRun, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var run ActiveActiveRun
	v := &aaViolations{}
	sides := make([]*aaSide, cfg.Routers)
	defer func() {
		for _, s := range sides {
			if s != nil {
				s.stop()
			}
		}
	}()
	for i := range sides {
		s, err := startAASide(ctx, cfg.Process, pcs, cfg.Probe, tok)
		if err != nil {
			return run, err
		}
		sides[i] = s
	}
	if _, n := poolLoads(servers); n != 0 {
		return run, fmt.Errorf("the local routers hold %d requests before the burst", n)
	}
	workers := 0
	workerAt := map[string]string{} // address → "pool/worker"
	for i, n := range cfg.Pools {
		workers += n
		for _, w := range pooltest.Workers(fmt.Sprint("p", i), n) {
			workerAt[w.Address] = fmt.Sprintf("pool-%d/%s", i, w.ID)
		}
	}
	// The kill: router 0, once it routed half of its share.
	share0 := (cfg.Burst + cfg.Routers - 1) / cfg.Routers
	killAt := max(1, share0/2)
	var (
		start   = make(chan struct{})
		release = make(chan struct{})
		wg      sync.WaitGroup // the exchanges' request phases
		held    sync.WaitGroup // the exchanges' streams
		mu      sync.Mutex
		failed  int
		firstEr error
		byDest  = map[string]int{} // the routing headers' primaries of the live routers
	)
	decideMode := cfg.Probe.Commit == "" || cfg.Probe.Commit == globalrouter.CommitDecide
	// holds is how many entries one request may have on the local routers
	// at once: one per pool, for a moment, with decide (a contended commit
	// that moves commits on the new pool, then frees the old: commit.go's
	// recheck) and with reserving probes (probe.commit: reserve: a
	// reservation on every pool probed until the losers' are released; a
	// reservation counts as a request in flight on its worker); one with
	// pipelined.
	holds := len(cfg.Pools)
	if cfg.Probe.Commit == globalrouter.CommitPipelined {
		holds = 1
	}
	// Router 0's exchanges past the first killAt hold their bodies back
	// until the kill: it is then mid-burst for certain, with requests
	// routed (held open) and others not yet decided, while the other
	// routers' exchanges go on.
	killed := make(chan struct{})
	var killOnce sync.Once
	for i := range cfg.Burst {
		side := sides[i%cfg.Routers]
		var gate <-chan struct{}
		if cfg.Kill && i%cfg.Routers == 0 && i/cfg.Routers >= killAt {
			gate = killed
		}
		wg.Add(1)
		held.Add(1)
		go func() {
			defer held.Done()
			<-start
			st, dest, err := aaExchange(ctx, side, body, gate)
			mu.Lock()
			if err == nil {
				byDest[dest]++
			}
			if err != nil {
				failed++
				if firstEr == nil && !side.killed.Load() {
					firstEr = err
				}
			}
			mu.Unlock()
			if cfg.Kill && side == sides[0] && err == nil && side.routed.Load() >= int64(killAt) {
				killOnce.Do(func() {
					side.kill()
					close(killed)
				})
			}
			wg.Done()
			if err == nil {
				<-release
			}
			st.Close()
		}()
	}
	// The sampler: counts during the burst.
	burstDone := make(chan struct{})
	sampled := make(chan int)
	heldTwice := 0 // the sampler's until it sent on sampled
	go func() {
		n := 0
		defer func() { sampled <- n }()
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-burstDone:
				return
			case <-tick.C:
			}
			n++
			routedBefore := make([]int, len(sides))
			for i, s := range sides {
				routedBefore[i] = int(s.routed.Load())
			}
			_, local := poolLoads(servers)
			gauges := make([]int, len(sides))
			for i, s := range sides {
				g, err := s.inflight()
				if err != nil && !errors.Is(err, errKilled) {
					v.add("router %d: %v", i, err)
				}
				gauges[i] = g
			}
			openedAfter, liveRouted := 0, 0
			for i, s := range sides {
				o := int(s.opened.Load())
				openedAfter += o
				if s.killed.Load() {
					continue
				}
				liveRouted += routedBefore[i]
				if g := gauges[i]; g < routedBefore[i] || g > o {
					v.add("during the burst: router %d has %d streams in flight, the client had %d routed and %d opened", i, g, routedBefore[i], o)
				}
			}
			if local > openedAfter {
				heldTwice = max(heldTwice, local-openedAfter)
			}
			if local > openedAfter*holds {
				v.add("during the burst: the local routers hold %d requests, the client had opened %d exchanges (each holding at most %d)", local, openedAfter, holds)
			}
			if decideMode && !cfg.Kill && local < liveRouted {
				v.add("during the burst: the local routers hold %d requests, the routers had routed %d (decide waits for its commit)", local, liveRouted)
			}
		}
	}()
	close(start)
	wg.Wait()
	close(burstDone)
	run.Samples = <-sampled
	run.HeldTwice = heldTwice
	for _, s := range sides {
		m, _ := s.moved()
		run.Moved += m
	}
	if firstEr != nil {
		close(release)
		held.Wait()
		return run, fmt.Errorf("%d of %d exchanges failed, the first on a live router: %w", failed, cfg.Burst, firstEr)
	}
	run.Failed = failed
	live := 0
	for _, s := range sides {
		run.Routed = append(run.Routed, int(s.routed.Load()))
		if !s.killed.Load() {
			live += int(s.routed.Load())
		}
	}
	// The hold: exact counts. A pipelined commit, or the break of a killed
	// router's channel, lands on the local router a moment later: wait for
	// it, within the run's deadline.
	if err := pollUntil(ctx, func() error {
		if _, n := poolLoads(servers); n != live {
			return fmt.Errorf("at the hold: the local routers hold %d requests, the live routers routed %d (reservations: %s)", n, live, reservationStats(servers))
		}
		return nil
	}); err != nil {
		v.add("%v", err)
	}
	for i, s := range sides {
		if s.killed.Load() {
			continue
		}
		if g, err := s.inflight(); err != nil || g != run.Routed[i] {
			v.add("at the hold: router %d has %d streams in flight (%v), want its %d routed", i, g, err, run.Routed[i])
		}
	}
	run.Placed, _ = poolLoads(servers)
	if !cfg.Kill { // with a kill, the killed router's routed requests were freed
		announced := map[string]int{}
		for addr, n := range byDest {
			announced[workerAt[addr]] += n
		}
		if fmt.Sprint(announced) != fmt.Sprint(run.Placed) {
			v.add("at the hold: the routing headers placed %v, the local routers count %v", announced, run.Placed)
		}
	}
	if !cfg.Kill {
		run.Even = len(run.Placed) == workers
		for _, n := range run.Placed {
			run.Even = run.Even && n*workers == cfg.Burst
		}
	}
	close(release)
	held.Wait()
	if err := pollUntil(ctx, func() error {
		if _, n := poolLoads(servers); n != 0 {
			return fmt.Errorf("after the burst: the local routers still hold %d requests", n)
		}
		for i, s := range sides {
			if s.killed.Load() {
				continue
			}
			if g, err := s.inflight(); err != nil || g != 0 {
				return fmt.Errorf("after the burst: router %d has %d streams in flight (%v)", i, g, err)
			}
		}
		return nil
	}); err != nil {
		v.add("%v", err)
	}
	run.Violations = v.list
	return run, nil
}
