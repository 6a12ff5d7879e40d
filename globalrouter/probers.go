package globalrouter

import (
	"sync"
	"sync/atomic"
)

// defaultProbers is how many long-lived goroutines a Router keeps for
// probing the pools of a decision beyond the one its caller probes.
const defaultProbers = 64

// probers is a fixed set of long-lived goroutines that run a decision's
// probes of its second and later pools, so that a decision starts no
// goroutine of its own (issue 15: none per request beyond the ext_proc
// stream's). A job is handed only to an idle prober (an unbuffered
// channel), never queued behind a slow probe; when every prober is busy —
// more concurrent multi-pool decisions than probers, or probes waiting out
// their deadlines — the job runs on a new goroutine, counted in overflow.
// Safe for concurrent use; after close every job runs on its own goroutine.
type probers struct {
	jobs     chan func()
	stop     chan struct{}
	wg       sync.WaitGroup
	once     sync.Once
	overflow atomic.Uint64
}

func newProbers(n int) *probers {
	p := &probers{jobs: make(chan func()), stop: make(chan struct{})}
	for range n {
		p.wg.Go(func() {
			for {
				select {
				case f := <-p.jobs:
					f()
				case <-p.stop:
					return
				}
			}
		})
	}
	return p
}

// run runs f on an idle prober, or on a new goroutine when none is idle.
// It does not wait for f.
func (p *probers) run(f func()) {
	if p != nil {
		select {
		case p.jobs <- f:
			return
		default:
			p.overflow.Add(1)
		}
	}
	go f()
}

// close stops the probers once their current jobs end.
func (p *probers) close() {
	if p == nil {
		return
	}
	p.once.Do(func() { close(p.stop) })
	p.wg.Wait()
}
