package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/chaos"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/internal/up"
)

// accountingWindow is issue 27's target: the routers' in-flight count
// equals the engines' running+waiting within 1 s.
const accountingWindow = time.Second

// hogCPU runs spinning goroutines, perP for each P, until the returned stop
// is called: the rest of the process (the whole `kvgate up` system runs
// in it) waits behind them in the run queues, so probes run past their
// adaptive deadlines as on a starved machine.
func hogCPU(perP int) (stop func()) {
	var done atomic.Bool
	var wg sync.WaitGroup
	for range perP * runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			x := 0
			for !done.Load() {
				for i := range 100000 {
					x += i
				}
			}
			sink.Add(int64(x))
		}()
	}
	return func() { done.Store(true); wg.Wait() }
}

var sink atomic.Int64 // keeps the spinning loops' work observable

// TestAccountingUnderCPUPressure (issue 27 item 4): n streams open while
// the process is starved of CPU, so that some probes run past their
// deadline and their decisions are retried or made best effort. Once every
// stream is mid-answer (the engines run them all: long answers the
// clients do not read yet), the routers' in-flight count equals the
// engines' running+waiting, n, within accountingWindow of the last
// opening — a best-effort decision included, through its late commit.
// When the clients then go away mid-answer (a disconnect burst), both
// are 0. Every request gets
// 200. The counts sampled every 100 ms throughout are logged
// (up.AnalyzeAccounting).
//
// Not parallel: its CPU hog would starve the other tests' systems.
func TestAccountingUnderCPUPressure(t *testing.T) {
	s := startSystem(t, func(c *up.Config) { c.Speedup = 1 })
	ctx := testenv.ContextWithTimeout(t, 2*testTimeout)
	c := httpClient(t)
	sctx, stopSampling := context.WithCancel(ctx)
	sampled := make(chan []up.AccountingSample, 1)
	go func() { sampled <- s.SampleAccounting(sctx, 100*time.Millisecond) }()

	const n = 40
	stopHog := hogCPU(8)
	var wg sync.WaitGroup
	statuses := make([]int, n)
	opened := make(chan struct{}, n)
	release := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { opened <- struct{}{} }()
			req, _ := http.NewRequestWithContext(ctx, "POST", s.GatewayURL()+"/v1/chat/completions",
				strings.NewReader(chatBody("mock-llama", longPrompt(fmt.Sprintf("pressure %d", i%5), i), true, 2000)))
			req.Header.Set("content-type", "application/json")
			resp, err := c.Do(req)
			if err != nil {
				statuses[i] = -1
				return
			}
			statuses[i] = resp.StatusCode
			br := bufio.NewReader(resp.Body)
			_, _ = br.ReadString('\n') // mid-answer: the engine runs it
			opened <- struct{}{}
			<-release
			resp.Body.Close() // the client goes away mid-answer
		}()
	}
	for range n {
		<-opened
	}
	last := time.Now()
	var r, e, d int
	for {
		d = s.Global.Leases()
		if r, e = s.InFlight(); r == n && e == n && d == n {
			break
		}
		if time.Since(last) > accountingWindow {
			break
		}
		time.Sleep(10 * time.Millisecond) // polling interval, well inside the window
	}
	took := time.Since(last)
	stopHog()
	if r != n || e != n || d != n {
		t.Errorf("%v after the last of %d streams opened under CPU pressure: the routers count %d, the engines run %d, the global router has %d decisions in flight; want all %d within %v", took, n, r, e, d, n, accountingWindow)
	}
	close(release)
	wg.Wait()
	for range n { // the deferred sends of the streams that failed early
		select {
		case <-opened:
		default:
		}
	}
	// 0 after: the last frees land.
	testenv.Eventually(t, testTimeout, func() (string, bool) {
		if r, e := s.InFlight(); r != 0 || e != 0 {
			return fmt.Sprintf("after the clients went away: routers hold %d, engines %d", r, e), false
		}
		return "", true
	})
	stopSampling()
	rep := up.AnalyzeAccounting(<-sampled, accountingWindow)
	waitIdle(t, s)
	for i, st := range statuses {
		if st != 200 {
			t.Errorf("stream %d under CPU pressure: status %d, want 200", i, st)
		}
	}
	be := chaos.BestEffortCounts(s.Registry)
	t.Logf("routers = engines = %d within %v of the last opening; sampled: %+v; best effort: %v", n, took.Round(time.Millisecond), rep, be)
	if be["dropped"] != 0 {
		t.Errorf("%v best-effort commits dropped, want 0", be["dropped"])
	}
}
