package kvevents

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/membership"
)

// PublisherConfig names the worker whose events a Publisher sends.
type PublisherConfig struct {
	Pool     string
	WorkerID string
	// DPRank is the data-parallel rank of PublishStored, PublishRemoved and
	// PublishCleared (Publish takes the rank explicitly).
	DPRank uint32
	// Logger defaults to slog.Default(); a component attribute is added.
	Logger *slog.Logger
	// Registerer receives the publisher's metrics; nil registers none.
	Registerer prometheus.Registerer
	// OnStale, when set, is told (from the publisher's own goroutine, one
	// call at a time) when the worker becomes stale, true, and fresh
	// again, false: stale once its NATS connection has been down, or its
	// publishes have failed without a success, for StaleAfter (routers
	// can then no longer follow its cache); fresh once the connection is
	// up and a flush goes through. The relay and the mocker mark their
	// registration stale with it (registry.Registration.SetStale).
	OnStale func(stale bool)
	// StaleAfter bounds how long publishing may fail before the worker
	// is stale (default 5 s).
	StaleAfter time.Duration
}

// Publisher sends one worker's KV events to its pool's NATS subject, the
// way a custom engine (or the relay, or the mocker) reports its cache. It
// stamps event ids, monotonic per (worker, dp rank) from 1, keeps the
// worker's current blocks, and answers dump requests on DumpSubject with a
// DumpReply, in pages when it is large and the requester takes pages
// (dump.go), so a router that missed events can resynchronise.
//
// Safe for concurrent use. Publishing never blocks on the network (nats.go
// buffers); events are sent in id order.
type Publisher struct {
	nc      *nats.Conn
	cfg     PublisherConfig
	subject string
	log     *slog.Logger
	sub     *nats.Subscription
	m       publisherMetrics

	mu       sync.Mutex // guards ranks, dropPage, failingSince and the order of ids on the wire
	ranks    map[uint32]*rankState
	dropPage func(page int) bool // test hook: pages of dump answers not sent
	// failingSince is the first publish failure since the last success
	// (zero: the last publish succeeded).
	failingSince time.Time

	stop chan struct{} // closed by Close: ends watchStale
	done chan struct{} // closed when watchStale returns
}

type rankState struct {
	lastID uint64
	// blocks are the rank's device (GPU) blocks; lower holds the other
	// tiers' (an engine that offloads keeps the same engine hash on
	// several tiers), allocated on first use.
	blocks map[uint64]pubBlock
	lower  [NumTiers]map[uint64]pubBlock
}

// find returns the block held under engine hash h on any tier.
func (rs *rankState) find(h uint64) (pubBlock, bool) {
	if b, ok := rs.blocks[h]; ok {
		return b, true
	}
	for _, m := range rs.lower {
		if b, ok := m[h]; ok {
			return b, true
		}
	}
	return pubBlock{}, false
}

// tier returns the block map of tier t, creating it.
func (rs *rankState) tier(t Tier) map[uint64]pubBlock {
	if t == TierGPU {
		return rs.blocks
	}
	if rs.lower[t] == nil {
		rs.lower[t] = make(map[uint64]pubBlock)
	}
	return rs.lower[t]
}

// pubBlock is what a dump needs of a block: where it hangs and its kvgate
// local hash (not its tokens: a dump is 4–8× smaller that way, and the
// publisher keeps 8 bytes per block instead of a block of token ids).
type pubBlock struct {
	parent    uint64
	hasParent bool
	local     uint64
	lora      string
	salt      string
}

type publisherMetrics struct {
	events    *prometheus.CounterVec
	errors    prometheus.Counter
	dumps     prometheus.Counter
	dumpPages prometheus.Counter
	dumpBytes prometheus.Histogram
	stale     prometheus.Gauge
}

// ErrPublisherClosed is returned by a closed Publisher.
var ErrPublisherClosed = errors.New("kv event publisher closed")

// NewPublisher starts a publisher on nc (which the caller keeps owning and
// closes after Close) and subscribes to the worker's dump subject.
func NewPublisher(nc *nats.Conn, cfg PublisherConfig) (*Publisher, error) {
	if cfg.Pool == "" || cfg.WorkerID == "" {
		return nil, fmt.Errorf("publisher: pool %q and worker id %q must be set", cfg.Pool, cfg.WorkerID)
	}
	if err := membership.ValidateWorkerID(cfg.WorkerID); err != nil {
		return nil, fmt.Errorf("publisher: %w", err)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	p := &Publisher{
		nc:      nc,
		cfg:     cfg,
		subject: EventsSubject(cfg.Pool),
		log:     log.With("component", "kvevents-publisher", "pool", cfg.Pool, "worker", cfg.WorkerID),
		ranks:   make(map[uint32]*rankState),
		m:       newPublisherMetrics(cfg.Registerer),
	}
	sub, err := nc.Subscribe(DumpSubject(cfg.Pool, cfg.WorkerID), p.answerDump)
	if err != nil {
		return nil, fmt.Errorf("publisher: subscribe to dump requests: %w", err)
	}
	p.sub = sub
	p.stop, p.done = make(chan struct{}), make(chan struct{})
	if cfg.OnStale != nil {
		if p.cfg.StaleAfter <= 0 {
			p.cfg.StaleAfter = 5 * time.Second
		}
		go p.watchStale()
	} else {
		close(p.done)
	}
	return p, nil
}

// watchStale checks the connection and the publishes every quarter of
// StaleAfter and tells OnStale when the worker's staleness changes.
func (p *Publisher) watchStale() {
	defer close(p.done)
	every := max(p.cfg.StaleAfter/4, 10*time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	var downSince time.Time
	stale := false
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
		}
		now := time.Now()
		connected := p.nc.IsConnected()
		if connected {
			downSince = time.Time{}
		} else if downSince.IsZero() {
			downSince = now
		}
		p.mu.Lock()
		failingSince := p.failingSince
		p.mu.Unlock()
		if connected && !failingSince.IsZero() {
			// Failures with the connection up (a full buffer drained
			// since): the connection carries publishes again if a
			// flush goes through.
			if err := p.nc.FlushTimeout(every); err == nil {
				p.mu.Lock()
				if p.failingSince.Equal(failingSince) {
					p.failingSince = time.Time{}
				}
				p.mu.Unlock()
				failingSince = time.Time{}
			}
		}
		next := (!downSince.IsZero() && now.Sub(downSince) >= p.cfg.StaleAfter) ||
			(!failingSince.IsZero() && now.Sub(failingSince) >= p.cfg.StaleAfter)
		if !next && stale && !connected {
			next = true // fresh again only once connected
		}
		if next != stale {
			stale = next
			if stale {
				p.m.stale.Set(1)
				p.log.Warn("cannot publish KV events; marking the worker stale", "nats_connected", connected, "failing_since", failingSince, "down_since", downSince)
			} else {
				p.m.stale.Set(0)
				p.log.Info("publishing KV events again; the worker is fresh")
			}
			p.cfg.OnStale(stale)
		}
	}
}

func newPublisherMetrics(reg prometheus.Registerer) publisherMetrics {
	m := publisherMetrics{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_publisher_events_total",
			Help: "KV events published, by kind.",
		}, []string{"kind"}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvgate_publisher_publish_errors_total",
			Help: "KV events that could not be handed to NATS (their id is spent: routers see a gap and ask for a dump).",
		}),
		dumps: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvgate_publisher_dump_requests_total",
			Help: "Dump requests answered.",
		}),
		dumpPages: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvgate_publisher_dump_pages_total",
			Help: "Messages of dump answers sent (a small dump is one page).",
		}),
		dumpBytes: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvgate_publisher_dump_reply_bytes",
			Help:    "Size of dump answers, all pages together.",
			Buckets: prometheus.ExponentialBuckets(256, 4, 10),
		}),
		stale: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvgate_publisher_stale",
			Help: "1 while the worker cannot publish its KV events (PublisherConfig.OnStale), else 0.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.events, m.errors, m.dumps, m.dumpPages, m.dumpBytes, m.stale)
	}
	return m
}

// PublishStored reports the complete blocks of tokenIDs (len(engineHashes)
// × blockSize tokens, block i holding engineHashes[i]) stored as a chain
// under parentHash (nil: at the root).
func (p *Publisher) PublishStored(tokenIDs []uint32, blockSize int, engineHashes []uint64, parentHash *uint64, loraName string) error {
	if blockSize <= 0 {
		return fmt.Errorf("%w: got %d", ErrBlockSize, blockSize)
	}
	if len(engineHashes) == 0 || len(tokenIDs) != len(engineHashes)*blockSize {
		return fmt.Errorf("%w: %d tokens for %d blocks of %d", ErrInvalidEvent, len(tokenIDs), len(engineHashes), blockSize)
	}
	st := &Stored{ParentHash: parentHash, LoRAName: loraName, Blocks: make([]Block, len(engineHashes))}
	for i, h := range engineHashes {
		st.Blocks[i] = Block{EngineHash: h, TokenIDs: tokenIDs[i*blockSize : (i+1)*blockSize : (i+1)*blockSize]}
	}
	_, err := p.Publish(p.cfg.DPRank, Event{Stored: st})
	return err
}

// PublishRemoved reports blocks evicted, by engine hash.
func (p *Publisher) PublishRemoved(engineHashes []uint64) error {
	if len(engineHashes) == 0 {
		return nil
	}
	_, err := p.Publish(p.cfg.DPRank, Event{Removed: &Removed{EngineHashes: engineHashes}})
	return err
}

// PublishCleared reports that every block was dropped.
func (p *Publisher) PublishCleared() error {
	_, err := p.Publish(p.cfg.DPRank, Event{Cleared: true})
	return err
}

// Publish stamps ev with the next id of dpRank, records its effect on the
// worker's block set and sends it. It returns the event as sent. An event
// that fails validation is refused without spending an id; a NATS failure
// spends the id (routers see the gap and ask for a dump) and is returned.
func (p *Publisher) Publish(dpRank uint32, ev Event) (RouterEvent, error) {
	re := RouterEvent{WorkerID: p.cfg.WorkerID, DPRank: dpRank, Event: ev}
	if err := re.Validate(); err != nil {
		return RouterEvent{}, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ranks == nil {
		return RouterEvent{}, ErrPublisherClosed
	}
	rs := p.rank(dpRank)
	rs.lastID++
	re.EventID = rs.lastID
	rs.apply(ev)
	kind := ev.Kind()
	data, err := EncodeMsgpack(re)
	if err == nil {
		err = p.nc.Publish(p.subject, data)
	}
	if err != nil {
		p.m.errors.Inc()
		if p.failingSince.IsZero() {
			p.failingSince = time.Now()
		}
		return re, fmt.Errorf("publish %s event %d: %w", kind, re.EventID, err)
	}
	p.failingSince = time.Time{}
	p.m.events.WithLabelValues(kind).Inc()
	return re, nil
}

// LastEventID returns the id of the last event published for dpRank.
func (p *Publisher) LastEventID(dpRank uint32) uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if rs, ok := p.ranks[dpRank]; ok {
		return rs.lastID
	}
	return 0
}

// Blocks returns the engine hashes the worker holds on dpRank.
func (p *Publisher) Blocks(dpRank uint32) map[uint64]struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[uint64]struct{}{}
	if rs, ok := p.ranks[dpRank]; ok {
		for h := range rs.blocks {
			out[h] = struct{}{}
		}
	}
	return out
}

// Close stops answering dump requests and watching for staleness (OnStale
// is not called after it returns); later publishes fail with
// ErrPublisherClosed. It does not close the NATS connection.
func (p *Publisher) Close() error {
	p.mu.Lock()
	closed := p.ranks == nil
	p.ranks = nil
	p.mu.Unlock()
	if !closed {
		close(p.stop)
	}
	<-p.done
	if err := p.sub.Unsubscribe(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) && !errors.Is(err, nats.ErrBadSubscription) {
		return fmt.Errorf("publisher: unsubscribe: %w", err)
	}
	return nil
}

func (p *Publisher) rank(r uint32) *rankState {
	rs, ok := p.ranks[r]
	if !ok {
		rs = &rankState{blocks: make(map[uint64]pubBlock)}
		p.ranks[r] = rs
	}
	return rs
}

func (rs *rankState) apply(ev Event) {
	switch {
	case ev.Stored != nil:
		st := ev.Stored
		parent, has := uint64(0), false
		if st.ParentHash != nil {
			parent, has = *st.ParentHash, true
		}
		seed := ChainSeed(st.LoRAName, st.CacheSalt)
		t, _ := TierOf(st.Medium)
		m := rs.tier(t)
		for _, b := range st.Blocks {
			if len(b.TokenIDs) == 0 && b.LocalHash == nil {
				// A lower-tier copy by engine hash: it is what another
				// tier holds under that hash.
				if src, ok := rs.find(b.EngineHash); ok {
					m[b.EngineHash] = src
				}
				continue
			}
			m[b.EngineHash] = pubBlock{parent: parent, hasParent: has, local: b.Hash(seed), lora: st.LoRAName, salt: st.CacheSalt}
			parent, has = b.EngineHash, true
		}
	case ev.Removed != nil:
		t, _ := TierOf(ev.Removed.Medium)
		m := rs.tier(t)
		for _, h := range ev.Removed.EngineHashes {
			delete(m, h)
		}
	case ev.Cleared:
		clear(rs.blocks)
		for _, m := range rs.lower {
			clear(m)
		}
	}
}

// answerDump replies to a dump request (wire format in dump.go). The ranks'
// last ids and block sets are copied under the publishing lock, so they
// agree; chains and pages are built after it, so publishing waits only for
// the copy.
func (p *Publisher) answerDump(msg *nats.Msg) {
	maxPayload := p.nc.MaxPayload()
	limit, paged, err := dumpPageLimit(msg.Header.Get(DumpPageBytesHeader), maxPayload)
	p.mu.Lock()
	if p.ranks == nil {
		p.mu.Unlock()
		return
	}
	snap := p.copyRanks()
	drop := p.dropPage
	p.mu.Unlock()
	reply := p.snapshot(snap)

	var pages [][]byte
	if err == nil {
		pages, err = encodeDump(reply, paged, limit, maxPayload)
	}
	if err != nil {
		p.log.Error("answer dump request", "err", err)
		rep := nats.NewMsg(msg.Reply)
		rep.Header.Set(DumpErrorHeader, err.Error())
		if err := msg.RespondMsg(rep); err != nil {
			p.log.Warn("answer dump request", "err", err)
		}
		return
	}
	total := 0
	for i, data := range pages {
		total += len(data)
		if drop != nil && drop(i) {
			continue
		}
		if err := msg.Respond(data); err != nil {
			// The requester misses the rest and fails its dump.
			p.log.Warn("answer dump request", "page", i, "pages", len(pages), "err", err)
			return
		}
	}
	p.m.dumps.Inc()
	p.m.dumpPages.Add(float64(len(pages)))
	p.m.dumpBytes.Observe(float64(total))
}

// dumpPageLimit reads a request's DumpPageBytesHeader: whether it takes a
// paged answer, and the page size to cut (bounded by the publisher's own
// max payload, at least MinDumpPageBytes).
func dumpPageLimit(header string, maxPayload int64) (int, bool, error) {
	if header == "" {
		return 0, false, nil
	}
	n, err := strconv.ParseInt(header, 10, 64)
	if err != nil || n <= 0 {
		return 0, false, fmt.Errorf("dump request header %s: got %q, want a positive byte count", DumpPageBytesHeader, header)
	}
	n = max(n, MinDumpPageBytes)
	if maxPayload > 0 {
		n = min(n, maxPayload)
	}
	return int(min(n, math.MaxInt32)), true, nil
}

// encodeDump encodes reply as the answer's messages: one message for an
// unpaged request (an error past the max payload), pages otherwise.
func encodeDump(reply DumpReply, paged bool, limit int, maxPayload int64) ([][]byte, error) {
	if !paged {
		data, err := EncodeDumpReply(reply)
		if err != nil {
			return nil, err
		}
		if maxPayload > 0 && int64(len(data)) > maxPayload {
			return nil, fmt.Errorf("dump reply of %d bytes exceeds the NATS max payload %d and the requester takes no pages; update it (kvevents.RequestDump pages) or raise max_payload on the server", len(data), maxPayload)
		}
		return [][]byte{data}, nil
	}
	return encodeDumpPages(reply, limit, rand.Uint64()|1)
}

// rankSnapshot is one rank's state as a dump sees it.
type rankSnapshot struct {
	rank   uint32
	lastID uint64
	blocks map[uint64]pubBlock
	lower  [NumTiers]map[uint64]pubBlock
}

// copyRanks copies every rank's last id and blocks, in rank order; p.mu
// must be held.
func (p *Publisher) copyRanks() []rankSnapshot {
	out := make([]rankSnapshot, 0, len(p.ranks))
	for r, rs := range p.ranks {
		snap := rankSnapshot{rank: r, lastID: rs.lastID, blocks: maps.Clone(rs.blocks)}
		for t, m := range rs.lower {
			if len(m) > 0 {
				snap.lower[t] = maps.Clone(m)
			}
		}
		out = append(out, snap)
	}
	slices.SortFunc(out, func(a, b rankSnapshot) int { return cmp.Compare(a.rank, b.rank) })
	return out
}

// snapshot builds the DumpReply of copied ranks.
func (p *Publisher) snapshot(ranks []rankSnapshot) DumpReply {
	reply := DumpReply{WorkerID: p.cfg.WorkerID}
	for _, rs := range ranks {
		reply.Ranks = append(reply.Ranks, DumpRank{DPRank: rs.rank, LastEventID: rs.lastID, Blocks: len(rs.blocks)})
		for _, st := range chains(rs.blocks) {
			reply.Events = append(reply.Events, RouterEvent{WorkerID: p.cfg.WorkerID, DPRank: rs.rank, EventID: rs.lastID, Event: Event{Stored: st}})
		}
		for t, m := range rs.lower {
			for _, st := range chains(m) {
				st.Medium = Tier(t).String()
				reply.Events = append(reply.Events, RouterEvent{WorkerID: p.cfg.WorkerID, DPRank: rs.rank, EventID: rs.lastID, Event: Event{Stored: st}})
			}
		}
	}
	return reply
}

// chains lists a rank's blocks as Stored chains, parents before children,
// in a deterministic order.
func chains(blocks map[uint64]pubBlock) []*Stored {
	children := make(map[uint64][]uint64, len(blocks))
	var roots []uint64
	for h, b := range blocks {
		if _, ok := blocks[b.parent]; b.hasParent && ok && b.parent != h {
			children[b.parent] = append(children[b.parent], h)
		} else {
			roots = append(roots, h)
		}
	}
	slices.Sort(roots)
	for _, c := range children {
		slices.Sort(c)
	}
	var out []*Stored
	stack := slices.Clone(roots)
	slices.Reverse(stack)
	for len(stack) > 0 {
		h := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		b := blocks[h]
		st := &Stored{LoRAName: b.lora, CacheSalt: b.salt}
		if b.hasParent {
			parent := b.parent
			st.ParentHash = &parent
		}
		for {
			local := b.local
			st.Blocks = append(st.Blocks, Block{EngineHash: h, LocalHash: &local})
			kids := children[h]
			if len(kids) == 1 && blocks[kids[0]].lora == st.LoRAName && blocks[kids[0]].salt == st.CacheSalt {
				h, b = kids[0], blocks[kids[0]]
				continue
			}
			for i := len(kids) - 1; i >= 0; i-- {
				stack = append(stack, kids[i])
			}
			break
		}
		out = append(out, st)
	}
	return out
}
