// Package events feeds a local router's KV index from its pool's NATS event
// subject.
//
// Events are applied in id order per (worker, dp_rank). A worker that joins,
// an event-id gap, or a publisher restart (ids starting again at 1) makes the
// Subscriber ask that worker's publisher for a dump (kvevents.RequestDump)
// and rebuild the worker's part of the index from it; live events that
// arrive meanwhile are held and applied after the dump, skipping those the
// dump already covers. A big worker's dump arrives in pages (the server's
// max_payload bounds one message); RequestDump hands over only a whole
// dump, so a lost page is a failed dump like any other. A worker without a
// dump responder, or whose dump failed, is followed from the live stream as
// it is, and asked again later with backoff. When the NATS connection comes
// back after an outage every worker is asked for a dump (Resync): what was
// published meanwhile is lost, and an idle worker would never reveal it.
//
// An id 1 on a rank that has seen events is taken for a restart. The dump
// reply and the live events travel on different subjects, so an event the
// dump already covers may arrive after it; if that event is id 1 it costs
// one extra dump, never a wrong index.
package events

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvgate/kvgate/kvevents"
)

// Target is where events go: the router (localrouter.Router). ApplyEvent
// must be safe for concurrent use with the router's readers; it is called
// from one goroutine at a time.
type Target interface {
	ApplyEvent(ev kvevents.RouterEvent) error
}

// Options configure a Subscriber.
type Options struct {
	Pool string
	// Logger (default slog.Default()).
	Logger *slog.Logger
	// DumpTimeout bounds one dump request, every page of its answer
	// (default 5 s; a 100k-block dump takes a fraction of a second).
	DumpTimeout time.Duration
	// RetryMin and RetryMax bound the backoff between failed dumps
	// (default 1 s and 30 s).
	RetryMin, RetryMax time.Duration
	// MaxHeld bounds the live events held per worker while its dump is in
	// flight (default 65536); past it the held events are dropped and the
	// dump is requested again once it ends.
	MaxHeld int
}

// Stats are the Subscriber's counters since it started.
type Stats struct {
	Received    uint64 // messages on the subject
	Applied     uint64 // events the target accepted (live and dumped)
	Rejected    uint64 // events the target refused (unknown parent, non-member, …)
	Invalid     uint64 // messages that did not decode
	Stale       uint64 // events whose id was already applied or dumped
	Gaps        uint64 // event-id gaps and restarts seen
	Dumps       uint64 // dumps applied
	DumpErrors  uint64 // dump requests that failed
	HeldDropped uint64 // held events dropped past MaxHeld
	Reconnects  uint64 // NATS reconnections, each followed by a Resync
}

// Subscriber applies a pool's KV events to a Target.
//
// Concurrency: safe for concurrent use. One mutex guards the per-worker
// sequencing state; Target.ApplyEvent is called with it held (the target
// never calls back into the Subscriber, so there is no lock cycle).
type Subscriber struct {
	nc     *nats.Conn
	target Target
	opts   Options
	log    *slog.Logger
	sub    *nats.Subscription
	status chan nats.Status // reconnections (see watchReconnects)

	ctx    context.Context // cancelled by Close; bounds dump requests
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	workers map[string]*workerState
	gen     uint64 // last dump generation handed out (see startDump)
	closed  bool

	received, applied, rejected, invalid, stale, gaps, dumps, dumpErrors, heldDropped, reconnects atomic.Uint64
}

type workerState struct {
	id      string
	last    map[uint32]uint64 // per dp rank: the last event id applied or dumped
	dumping bool
	gen     uint64 // bumped by each dump and by removal, to drop stale answers
	held    []kvevents.RouterEvent
	redump  bool // held events were dropped: dump again when this one ends
	// restartHeld: the dump in flight was asked for by an id 1 taken for a
	// restart, which is held[0]. The dump is of that event's incarnation
	// (asked after it arrived), so when it answers the event is covered,
	// not a second restart.
	restartHeld bool
	synced      bool // a dump has been applied
	fails       int  // dumps failed in a row
	backoff     time.Duration
	retry       *time.Timer
}

// New subscribes to kvevents.EventsSubject(opts.Pool) on nc (which the
// caller owns and closes after Close) and applies events to target.
// Workers are followed from WorkerUp on; events of other workers are passed
// to target, which refuses and counts them.
func New(nc *nats.Conn, target Target, opts Options) (*Subscriber, error) {
	if opts.Pool == "" {
		return nil, errors.New("events: empty pool")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.DumpTimeout <= 0 {
		opts.DumpTimeout = 5 * time.Second
	}
	if opts.RetryMin <= 0 {
		opts.RetryMin = time.Second
	}
	if opts.RetryMax < opts.RetryMin {
		opts.RetryMax = max(30*time.Second, opts.RetryMin)
	}
	if opts.MaxHeld <= 0 {
		opts.MaxHeld = 1 << 16
	}
	s := &Subscriber{
		nc: nc, target: target, opts: opts,
		log:     opts.Logger.With("component", "localrouter.events", "pool", opts.Pool),
		workers: map[string]*workerState{},
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	sub, err := nc.Subscribe(kvevents.EventsSubject(opts.Pool), s.onMsg)
	if err != nil {
		s.cancel()
		return nil, fmt.Errorf("events: subscribe %s: %w", kvevents.EventsSubject(opts.Pool), err)
	}
	// A slow consumer loses messages (seen as gaps, then dumps); allow a
	// deep backlog before that happens.
	if err := sub.SetPendingLimits(1<<20, 256<<20); err != nil {
		_ = sub.Unsubscribe()
		s.cancel()
		return nil, fmt.Errorf("events: %w", err)
	}
	if err := nc.FlushTimeout(5 * time.Second); err != nil { // the subscription is live
		_ = sub.Unsubscribe()
		s.cancel()
		return nil, fmt.Errorf("events: %w", err)
	}
	s.sub = sub
	s.status = nc.StatusChanged(nats.CONNECTED)
	s.wg.Add(1)
	go s.watchReconnects()
	return s, nil
}

// watchReconnects resynchronises every worker after the connection comes
// back: nats.go resubscribes by itself, but the events published while the
// router was away are lost, and an idle worker's next event (the gap that
// would reveal the loss) may never come.
func (s *Subscriber) watchReconnects() {
	defer s.wg.Done()
	for {
		select {
		case <-s.ctx.Done():
			return
		case st, ok := <-s.status:
			if !ok {
				return
			}
			if st == nats.CONNECTED {
				s.reconnects.Add(1)
				s.log.Info("nats reconnected; asking every worker for a dump")
				s.Resync()
			}
		}
	}
}

// Resync asks workers ids (none: every worker followed) for a dump and
// rebuilds their index parts from it; a worker whose dump is in flight is
// asked again once it ends (the answer may predate what was lost).
func (s *Subscriber) Resync(ids ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	resync := func(w *workerState) {
		if w.dumping {
			w.redump = true
			return
		}
		s.startDump(w)
	}
	if len(ids) == 0 {
		for _, w := range s.workers {
			resync(w)
		}
		return
	}
	for _, id := range ids {
		if w := s.workers[id]; w != nil {
			resync(w)
		}
	}
}

// Close unsubscribes, cancels dumps in flight and waits for them.
func (s *Subscriber) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	for _, w := range s.workers {
		if w.retry != nil {
			w.retry.Stop()
		}
	}
	s.mu.Unlock()
	s.nc.RemoveStatusListener(s.status)
	err := s.sub.Unsubscribe()
	if errors.Is(err, nats.ErrConnectionClosed) {
		err = nil
	}
	s.cancel()
	s.wg.Wait()
	return err
}

// Stats returns the counters.
func (s *Subscriber) Stats() Stats {
	return Stats{
		Received: s.received.Load(), Applied: s.applied.Load(), Rejected: s.rejected.Load(),
		Invalid: s.invalid.Load(), Stale: s.stale.Load(), Gaps: s.gaps.Load(), Dumps: s.dumps.Load(),
		DumpErrors: s.dumpErrors.Load(), HeldDropped: s.heldDropped.Load(), Reconnects: s.reconnects.Load(),
	}
}

// Synced reports whether a dump of worker id has been applied since it
// joined.
func (s *Subscriber) Synced(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.workers[id]
	return w != nil && w.synced
}

// WorkerUp starts following worker id: its index part is rebuilt from a
// dump. Calling it for a worker already followed does nothing.
func (s *Subscriber) WorkerUp(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.workers[id] != nil {
		return
	}
	w := &workerState{id: id, last: map[uint32]uint64{}, backoff: s.opts.RetryMin}
	s.workers[id] = w
	s.startDump(w)
}

// WorkerDown stops following worker id (the router drops its index part).
func (s *Subscriber) WorkerDown(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if w := s.workers[id]; w != nil {
		w.gen++
		if w.retry != nil {
			w.retry.Stop()
		}
		delete(s.workers, id)
	}
}

func (s *Subscriber) onMsg(m *nats.Msg) {
	s.received.Add(1)
	ev, err := kvevents.DecodeMsgpack(m.Data)
	if err != nil {
		s.invalid.Add(1)
		s.log.Debug("dropping undecodable kv event", "err", err)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	w := s.workers[ev.WorkerID]
	if w == nil {
		s.apply(ev) // refused and counted by the target unless it is a member
		return
	}
	if w.dumping {
		s.hold(w, ev)
		return
	}
	s.sequence(w, ev)
}

// sequence applies ev if it is the next of its rank, skips it if it is
// old, and starts a dump (holding ev) on a gap or a restart. s.mu is held.
func (s *Subscriber) sequence(w *workerState, ev kvevents.RouterEvent) {
	last := w.last[ev.DPRank]
	switch {
	case ev.EventID == last+1:
		w.last[ev.DPRank] = ev.EventID
		s.apply(ev)
	case ev.EventID == 1 && last >= 1:
		s.gaps.Add(1)
		s.log.Info("kv event publisher restarted; requesting a dump", "worker", w.id, "dp_rank", ev.DPRank, "last_event_id", last)
		s.hold(w, ev)
		w.restartHeld = len(w.held) == 1
		s.startDump(w)
	case ev.EventID <= last:
		s.stale.Add(1)
	default:
		s.gaps.Add(1)
		s.log.Info("kv event id gap; requesting a dump", "worker", w.id, "dp_rank", ev.DPRank, "want", last+1, "got", ev.EventID)
		s.hold(w, ev)
		s.startDump(w)
	}
}

func (s *Subscriber) apply(ev kvevents.RouterEvent) {
	if err := s.target.ApplyEvent(ev); err != nil {
		s.rejected.Add(1)
		s.log.Debug("kv event rejected", "worker", ev.WorkerID, "dp_rank", ev.DPRank, "event_id", ev.EventID, "err", err)
		return
	}
	s.applied.Add(1)
}

func (s *Subscriber) hold(w *workerState, ev kvevents.RouterEvent) {
	if len(w.held) >= s.opts.MaxHeld {
		s.heldDropped.Add(uint64(len(w.held)))
		w.held = w.held[:0]
		w.redump = true
	}
	w.held = append(w.held, ev)
}

// startDump requests a dump of w in the background. s.mu is held.
func (s *Subscriber) startDump(w *workerState) {
	if w.dumping || s.closed {
		return
	}
	if w.retry != nil {
		w.retry.Stop()
		w.retry = nil
	}
	w.dumping = true
	// Generations are the subscriber's, not the worker's: a worker that
	// leaves and joins again gets a new state, whose first dump must not
	// match an answer the old state is still waiting for.
	s.gen++
	w.gen = s.gen
	gen, id := w.gen, w.id
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		ctx, cancel := context.WithTimeout(s.ctx, s.opts.DumpTimeout)
		reply, err := kvevents.RequestDump(ctx, s.nc, s.opts.Pool, id)
		cancel()
		s.finishDump(id, gen, reply, err)
	}()
}

func (s *Subscriber) finishDump(id string, gen uint64, reply kvevents.DumpReply, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.workers[id]
	if s.closed || w == nil || w.gen != gen {
		return // removed, or superseded, meanwhile
	}
	w.dumping = false
	restartHeld := w.restartHeld
	w.restartHeld = false
	if err == nil && reply.WorkerID != "" && reply.WorkerID != id {
		err = fmt.Errorf("dump reply names worker %q", reply.WorkerID)
	}
	if err != nil {
		s.dumpErrors.Add(1)
		w.fails++
		lvl := slog.LevelWarn
		if w.fails > 1 { // said once per worker; the metric counts the rest
			lvl = slog.LevelDebug
		}
		s.log.Log(s.ctx, lvl, "kv dump failed; following the live stream, will ask again", "worker", id, "retry_in", w.backoff.String(), "failures", w.fails, "err", err)
		// Follow the live stream as it is: the first held event of each
		// rank sets its position (even an id 1 after a restart), later ones
		// apply if newer. Gaps among them are accepted here; the retry
		// will repair what they lost.
		held := w.held
		w.held, w.redump = nil, false
		seen := map[uint32]bool{}
		for _, ev := range held {
			if !seen[ev.DPRank] || ev.EventID > w.last[ev.DPRank] {
				seen[ev.DPRank] = true
				w.last[ev.DPRank] = ev.EventID
				s.apply(ev)
			} else {
				s.stale.Add(1)
			}
		}
		s.scheduleRetry(w)
		return
	}
	s.rebuild(w, reply)
	w.backoff, w.fails = s.opts.RetryMin, 0
	held := w.held
	w.held = nil
	if w.redump {
		w.redump = false
		s.startDump(w)
		w.held = append(w.held, held...)
		return
	}
	for i, ev := range held {
		if w.dumping { // a gap among the held events started another dump
			w.held = append(w.held, held[i:]...)
			return
		}
		if ev.EventID == 1 && w.last[ev.DPRank] > 1 && !(i == 0 && restartHeld) {
			// The publisher restarted while the dump was in flight, and the
			// answer may come from the incarnation before it: ask again
			// (the new one answers; at worst one extra dump).
			s.gaps.Add(1)
			s.log.Info("kv event publisher restarted during a dump; requesting another", "worker", w.id, "dp_rank", ev.DPRank, "dump_last", w.last[ev.DPRank])
			s.startDump(w)
			w.held = append(w.held, held[i+1:]...)
			return
		}
		if ev.EventID <= w.last[ev.DPRank] {
			s.stale.Add(1) // the dump covers it
			continue
		}
		if ev.EventID > w.last[ev.DPRank]+1 {
			// Ahead of a dump just taken: not a loss during the dump (those
			// events would be here, in order) but a stray or a message of
			// another incarnation. Asking again at once would loop for as
			// long as the publisher stays behind it; drop it, and let the
			// next live event show whether a real gap remains.
			s.stale.Add(1)
			s.log.Debug("held kv event ahead of the dump dropped", "worker", w.id, "dp_rank", ev.DPRank, "event_id", ev.EventID, "dump_last", w.last[ev.DPRank])
			continue
		}
		s.sequence(w, ev)
	}
}

// rebuild replaces w's part of the index with the dump. s.mu is held.
func (s *Subscriber) rebuild(w *workerState, reply kvevents.DumpReply) {
	ranks := map[uint32]uint64{}
	for _, r := range reply.Ranks {
		ranks[r.DPRank] = r.LastEventID
	}
	clear := func(rank uint32) {
		_ = s.target.ApplyEvent(kvevents.RouterEvent{WorkerID: w.id, DPRank: rank, Event: kvevents.Event{Cleared: true}})
	}
	for rank := range w.last {
		if _, ok := ranks[rank]; !ok {
			clear(rank)
		}
	}
	for rank := range ranks {
		clear(rank)
	}
	var applied, rejected int
	for _, ev := range reply.Events {
		if _, ok := ranks[ev.DPRank]; !ok {
			rejected++
			continue
		}
		if err := s.target.ApplyEvent(ev); err != nil {
			rejected++
			s.log.Debug("dumped kv event rejected", "worker", w.id, "dp_rank", ev.DPRank, "err", err)
			continue
		}
		applied++
	}
	s.applied.Add(uint64(applied))
	s.rejected.Add(uint64(rejected))
	w.last = ranks
	w.synced = true
	s.dumps.Add(1)
	s.log.Info("kv index of worker rebuilt from dump", "worker", w.id, "ranks", len(ranks), "events", applied, "rejected", rejected)
}

func (s *Subscriber) scheduleRetry(w *workerState) {
	delay := w.backoff
	w.backoff = min(2*w.backoff, s.opts.RetryMax)
	id, gen := w.id, w.gen
	w.retry = time.AfterFunc(delay, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if w2 := s.workers[id]; w2 != nil && w2.gen == gen && !s.closed {
			w2.retry = nil
			s.startDump(w2)
		}
	})
}
