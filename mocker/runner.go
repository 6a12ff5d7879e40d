package mocker

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/kvgate/kvgate/kvevents"
)

// Clock is the time source of a live engine: the wall clock in production
// (RealClock), a fake in tests that need one.
type Clock interface {
	Now() time.Time
	// After is time.After.
	After(d time.Duration) <-chan time.Time
}

// RealClock is the wall clock.
type RealClock struct{}

// Now implements Clock.
func (RealClock) Now() time.Time { return time.Now() }

// After implements Clock.
func (RealClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// KVSink receives the engine's KV events, batch by batch, in order, from a
// single goroutine. A sink may block briefly (the engine waits); an error
// is logged and counted, never retried.
type KVSink interface {
	PublishKV(ctx context.Context, ts time.Time, events []kvevents.Event) error
}

// stream is one request's output from the engine loop. Tokens queue in
// pending (the loop never blocks on a slow reader) and ready is signalled;
// the queue holds at most the tokens generated and not yet read, never
// more than the request's max tokens, and no buffer is sized by a number
// the client sent.
type stream struct {
	mu      sync.Mutex
	pending []Token
	ready   chan struct{}   // buffered 1: tokens were queued
	done    chan Completion // buffered 1
}

func newStream() *stream {
	return &stream{ready: make(chan struct{}, 1), done: make(chan Completion, 1)}
}

// push queues t and wakes the reader; it never blocks.
func (s *stream) push(t Token) {
	s.mu.Lock()
	s.pending = append(s.pending, t)
	s.mu.Unlock()
	select {
	case s.ready <- struct{}{}:
	default:
	}
}

// take returns and clears the queued tokens.
func (s *stream) take() []Token {
	s.mu.Lock()
	out := s.pending
	s.pending = nil
	s.mu.Unlock()
	return out
}

// live runs an Engine in real time: one goroutine steps it at the times it
// asks for, fans tokens out to request streams and KV events to the sink.
// Lock order: live.mu only (the engine has no locks of its own).
type live struct {
	clock Clock
	sink  KVSink
	log   *slog.Logger
	m     *serverMetrics
	rank  string // the engine label of its metrics

	mu      sync.Mutex
	eng     *Engine
	streams map[string]*stream
	// obs (nil: none) is told of admissions and departures; index is the
	// rank's number for it.
	obs   RequestObserver
	index int

	wake chan struct{}
}

func newLive(eng *Engine, clock Clock, sink KVSink, log *slog.Logger, m *serverMetrics) *live {
	return &live{clock: clock, sink: sink, log: log, m: m, eng: eng, streams: map[string]*stream{}, wake: make(chan struct{}, 1)}
}

// submit queues r and returns its stream; clientID is the request's
// X-Request-Id, for the observer.
func (l *live) submit(r Request, clientID string) (*stream, error) {
	st := newStream()
	l.mu.Lock()
	now := l.clock.Now()
	err := l.eng.Submit(now, r)
	if err == nil {
		l.streams[r.ID] = st
		if l.obs != nil {
			l.obs.Admitted(l.index, r.ID, clientID, now)
		}
	}
	l.mu.Unlock()
	if err != nil {
		return nil, err
	}
	select {
	case l.wake <- struct{}{}:
	default:
	}
	return st, nil
}

// abort drops a request whose client went away.
func (l *live) abort(id string) {
	l.mu.Lock()
	if _, ok := l.streams[id]; ok {
		if l.eng.Abort(id) && l.obs != nil {
			l.obs.Left(l.index, id, l.clock.Now(), FinishAbort)
		}
		delete(l.streams, id)
	}
	l.mu.Unlock()
}

// resetPrefixCache resets the engine's prefix cache and wakes the loop to
// publish the Cleared event.
func (l *live) resetPrefixCache() bool {
	l.mu.Lock()
	ok := l.eng.ResetPrefixCache()
	l.mu.Unlock()
	if ok {
		select {
		case l.wake <- struct{}{}:
		default:
		}
	}
	return ok
}

func (l *live) stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.eng.Stats()
}

// run steps the engine until ctx ends.
func (l *live) run(ctx context.Context) {
	for {
		l.mu.Lock()
		now := l.clock.Now()
		res := l.eng.Step(now)
		for _, tok := range res.Tokens {
			if st, ok := l.streams[tok.RequestID]; ok {
				st.push(tok)
			}
			l.m.token(l.rank, tok)
		}
		for _, c := range res.Completed {
			if l.obs != nil {
				// The count dropped now, in this Step, whenever the
				// iteration that finished it ended (c.Finished).
				l.obs.Left(l.index, c.RequestID, now, c.Reason)
			}
			if st, ok := l.streams[c.RequestID]; ok {
				st.done <- c
				delete(l.streams, c.RequestID)
			}
			l.m.observe(l.rank, c)
		}
		l.mu.Unlock()
		if len(res.Events) > 0 && l.sink != nil {
			if err := l.sink.PublishKV(ctx, now, res.Events); err != nil {
				l.m.sinkErrors.Inc()
				l.log.Warn("publish kv events", "err", err, "events", len(res.Events))
			}
		}
		var timer <-chan time.Time
		if !res.Next.IsZero() {
			timer = l.clock.After(res.Next.Sub(l.clock.Now()))
		}
		select {
		case <-ctx.Done():
			return
		case <-l.wake:
		case <-timer:
		}
	}
}
