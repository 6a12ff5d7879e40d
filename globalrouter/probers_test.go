package globalrouter

import (
	"runtime"
	"sync"
	"testing"
)

// A job goes to an idle prober; with every prober busy it still runs, on a
// goroutine of its own, counted; after close too.
func TestProbers(t *testing.T) {
	p := newProbers(2)
	release := make(chan struct{})
	var wg sync.WaitGroup
	// onProber hands a job blocked on release to the probers until one of
	// them takes it: a job handed while no prober waits at the channel (at
	// start) runs on its own goroutine instead, and waits for release too.
	onProber := func() {
		for range 10000 {
			before := p.overflow.Load()
			wg.Add(1)
			p.run(func() { defer wg.Done(); <-release })
			if p.overflow.Load() == before {
				return
			}
			runtime.Gosched()
		}
		t.Fatal("no prober ever took a job")
	}
	onProber()
	onProber()
	before := p.overflow.Load()
	wg.Add(1)
	p.run(func() { wg.Done() }) // both probers are blocked
	if got := p.overflow.Load() - before; got != 1 {
		t.Errorf("with every prober busy the overflow grew by %d, want 1", got)
	}
	close(release)
	wg.Wait()
	p.close()
	wg.Add(1)
	p.run(func() { wg.Done() })
	wg.Wait()
}
