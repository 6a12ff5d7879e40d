package sim

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// progress draws a one-line bar of finished simulated requests. A nil
// writer draws nothing. Safe for concurrent use (simulations run in
// parallel).
type progress struct {
	mu    sync.Mutex
	w     io.Writer
	total int
	done  int
	shown int // permille last drawn
	start time.Time
}

func newProgress(w io.Writer, total int) *progress {
	return &progress{w: w, total: total, shown: -1, start: time.Now()}
}

func (p *progress) add(n int) {
	if p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done += n
	if pm := p.done * 1000 / max(1, p.total); pm != p.shown {
		p.shown = pm
		p.draw()
	}
}

func (p *progress) draw() {
	const width = 40
	fill := p.done * width / max(1, p.total)
	fmt.Fprintf(p.w, "\r[%s%s] %5.1f%% %d/%d requests, %.0fs", strings.Repeat("#", fill), strings.Repeat(".", width-fill),
		float64(p.done)*100/float64(max(1, p.total)), p.done, p.total, time.Since(p.start).Seconds())
}

func (p *progress) finish() {
	if p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintln(p.w)
}
