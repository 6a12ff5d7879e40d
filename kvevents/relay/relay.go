// Package relay carries a vLLM or SGLang engine's KV events from its ZMQ
// PUB socket to kvgate's NATS subject, and registers the engine in etcd, so
// a vLLM deployment needs only `kvgate relay` beside each engine:
//
//	vLLM --kv-events-config '{"enable_kv_cache_events":true,"publisher":"zmq",
//	      "endpoint":"tcp://*:5557","topic":"kv-events"}'
//	kvgate relay --zmq tcp://127.0.0.1:5557 --pool a --worker-id w1 \
//	      --address 10.0.0.7:8000 --block-size 16 --nats-url … --etcd …
//
// Messages are decoded by a kvevents.EngineDecoder (Options.Decoder; the
// vLLM/SGLang msgpack one by default) and republished through a
// kvevents.Publisher, which stamps kvgate event ids and answers dump
// requests. A malformed message is logged, counted and skipped; a malformed
// event inside a good message is skipped and counted by reason
// (kvgate_relay_skipped_events_total{reason}), the rest of its batch
// relayed. When an engine's stores are all skipped for their block size
// (an engine started with another block size, SGLang's default page_size
// 1), the relay warns, naming the flags to fix, at most once a minute, and
// tells the routers (a kvevents.SkipNotice event), whose status shows it. One
// relay serves one worker: all its data-parallel ranks' sockets
// (Config.Endpoints), so one publisher answers its dumps. Engine sequence
// gaps are filled from vLLM's replay socket when one is configured
// (Config.ReplayEndpoints); a sequence going back means the engine
// restarted, and the blocks of that endpoint's ranks are cleared. The etcd
// registration (Config.Register) is membership/registry's.
//
// Files: relay.go (Config, Options, Relay, New, Run: receiving each
// endpoint's messages, decoding, republishing, the sequence check, the
// block-size guard and its metrics), replay.go (filling a sequence gap
// from vLLM's replay socket).
package relay

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvgate/kvgate/kvevents"
	"github.com/kvgate/kvgate/membership"
	"github.com/kvgate/kvgate/membership/registry"
)

// Config is what one relay serves: one engine, one worker identity.
type Config struct {
	// Endpoints are the engine's ZMQ PUB endpoints, e.g.
	// tcp://127.0.0.1:5557: one, or one per data-parallel rank (vLLM binds
	// rank r on the base port + r). One relay per worker, so that one
	// publisher answers the worker's dump requests for every rank.
	Endpoints []string
	// ReplayEndpoints, aligned with Endpoints ("" for none), are the
	// engines' replay sockets (vLLM kv-events-config "replay_endpoint"):
	// on a sequence gap the relay fetches the lost batches from there
	// instead of only counting the gap.
	ReplayEndpoints []string
	// Topic is the subscription prefix ("" receives every topic).
	Topic string
	Pool  string
	// Worker is the engine as routers see it; Worker.ID names the worker
	// in events. Worker.BlockSize is the pool's block size: stored blocks
	// of another size are skipped and counted.
	Worker membership.WorkerInfo
	// Register makes the relay register Worker in etcd (Options.Etcd must
	// be set).
	Register bool
	// LeaseTTL is the registration lease (10 s).
	LeaseTTL time.Duration
	// StaleAfter is how long publishing may fail before the registration
	// is marked stale (kvevents.PublisherConfig.StaleAfter, default 5 s).
	StaleAfter time.Duration
	// LoRANames maps the engine's adapter ids to names (see
	// kvevents.EngineDecoderConfig.LoRANames), for engines that send only
	// lora_id.
	LoRANames map[string]string
}

// Options are the relay's dependencies.
type Options struct {
	NATS *nats.Conn
	// Etcd is needed when Config.Register is set.
	Etcd       *clientv3.Client
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	// Decoder, when set, decodes the engine's messages instead of the
	// vLLM/SGLang msgpack decoder made from Config (Worker.BlockSize,
	// LoRANames). The relay calls it from one goroutine.
	Decoder kvevents.EngineDecoder
	// Now is the clock of the rate-limited warnings (time.Now).
	Now func() time.Time
}

// noticeEvery bounds the configuration warnings (log and SkipNotice) per
// endpoint.
const noticeEvery = time.Minute

// Relay is a running engine-to-NATS bridge; create with New, run with Run.
type Relay struct {
	cfg  Config
	opts Options
	log  *slog.Logger
	pub  *kvevents.Publisher
	m    metrics

	replayFor map[string]string // endpoint → replay endpoint
	dec       kvevents.EngineDecoder

	// Only the Run goroutine touches these.
	lastSeq map[string]uint64
	ranksOf map[string]map[uint32]struct{} // endpoint → dp ranks seen there
	guard   map[string]*guardState         // endpoint → configuration guard
}

// guardState follows whether an endpoint's stores are all being skipped.
type guardState struct {
	stored, skipped uint64 // stored events relayed, skipped for their block size
	lastNotice      time.Time
}

type metrics struct {
	messages      prometheus.Counter
	malformed     prometheus.Counter
	skipped       *prometheus.CounterVec
	skippedBlocks prometheus.Counter
	gaps          prometheus.Counter
	replayed      prometheus.Counter
	restarts      prometheus.Counter
	pubErrors     prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) metrics {
	m := metrics{
		messages: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvgate_relay_messages_total", Help: "Engine ZMQ messages received.",
		}),
		malformed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvgate_relay_malformed_messages_total", Help: "Engine messages skipped as malformed.",
		}),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_relay_skipped_events_total", Help: "Engine events not relayed, by reason: block_size, kv_group, medium, unknown_type, malformed.",
		}, []string{"reason"}),
		skippedBlocks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvgate_relay_skipped_blocks_total", Help: "Blocks of the stored events not relayed.",
		}),
		gaps: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvgate_relay_sequence_gaps_total", Help: "Engine sequence gaps not recovered by replay (messages lost between the engine and the relay).",
		}),
		replayed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvgate_relay_replayed_messages_total", Help: "Lost engine messages recovered from the engine's replay socket.",
		}),
		restarts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvgate_relay_engine_restarts_total", Help: "Engine sequence resets, taken as restarts (the worker's blocks are cleared).",
		}),
		pubErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvgate_relay_publish_errors_total", Help: "Events the relay could not publish to NATS.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.messages, m.malformed, m.skipped, m.skippedBlocks, m.gaps, m.replayed, m.restarts, m.pubErrors)
	}
	return m
}

// New checks cfg and prepares a relay.
func New(cfg Config, opts Options) (*Relay, error) {
	if cfg.Worker.DPSize == 0 {
		cfg.Worker.DPSize = 1
	}
	switch {
	case len(cfg.Endpoints) == 0 || slices.Contains(cfg.Endpoints, ""):
		return nil, errors.New("relay: missing zmq endpoint")
	case cfg.Pool == "":
		return nil, errors.New("relay: empty pool")
	case opts.NATS == nil:
		return nil, errors.New("relay: no NATS connection")
	case len(cfg.ReplayEndpoints) > len(cfg.Endpoints):
		return nil, errors.New("relay: more replay endpoints than endpoints")
	case cfg.Register && opts.Etcd == nil:
		return nil, errors.New("relay: registration needs an etcd client")
	}
	if cfg.Worker.Address == "" && !cfg.Register {
		cfg.Worker.Address = "-" // only the id and block size matter then
	}
	if err := cfg.Worker.Validate(); err != nil {
		return nil, fmt.Errorf("relay: %w", err)
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	dec := opts.Decoder
	if dec == nil {
		var err error
		if dec, err = kvevents.NewVLLMDecoder(kvevents.EngineDecoderConfig{BlockSize: cfg.Worker.BlockSize, LoRANames: cfg.LoRANames}); err != nil {
			return nil, fmt.Errorf("relay: %w", err)
		}
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	replayFor := map[string]string{}
	for i, rep := range cfg.ReplayEndpoints {
		if rep != "" {
			replayFor[cfg.Endpoints[i]] = rep
		}
	}
	return &Relay{
		cfg:       cfg,
		replayFor: replayFor,
		dec:       dec,
		opts:      opts,
		log:       log.With("component", "relay", "pool", cfg.Pool, "worker", cfg.Worker.ID),
		m:         newMetrics(opts.Registerer),
		lastSeq:   map[string]uint64{},
		ranksOf:   map[string]map[uint32]struct{}{},
		guard:     map[string]*guardState{},
	}, nil
}

// Run registers the worker (if configured), subscribes to the engine and
// relays until ctx ends, then deregisters. It returns nil on cancellation.
// The engine need not be up yet: the subscriber dials until it is, and
// reconnects when it restarts.
func (r *Relay) Run(ctx context.Context) error {
	// A relay that cannot publish marks its registration stale, so
	// routers stop sending it requests they could not follow.
	stale := &registry.StaleMarker{Logger: r.log}
	pcfg := kvevents.PublisherConfig{
		Pool: r.cfg.Pool, WorkerID: r.cfg.Worker.ID, Logger: r.opts.Logger, Registerer: r.opts.Registerer,
		StaleAfter: r.cfg.StaleAfter,
	}
	if r.cfg.Register {
		pcfg.OnStale = stale.OnStale
	}
	pub, err := kvevents.NewPublisher(r.opts.NATS, pcfg)
	if err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	defer pub.Close()
	r.pub = pub

	if r.cfg.Register {
		reg, err := registry.Register(ctx, r.opts.Etcd, r.cfg.Pool, r.cfg.Worker, r.cfg.LeaseTTL, r.opts.Logger)
		if err != nil {
			return fmt.Errorf("relay: %w", err)
		}
		defer func() {
			pub.Close() // no staleness write races the deregistration
			if err := reg.Close(); err != nil {
				r.log.Warn("deregister", "err", err)
			}
		}()
		stale.Attach(reg)
	}

	// One subscriber per endpoint feeds a single handling loop, so events
	// keep one order per worker and the publisher needs no more locking.
	recvCtx, stopRecv := context.WithCancel(ctx)
	msgs := make(chan received, 64)
	errs := make(chan error, len(r.cfg.Endpoints))
	var wg sync.WaitGroup
	// Stop the receivers, then wait for them (defers run last first): a
	// receiver blocked on msgs or in Recv must see its context end.
	defer wg.Wait()
	defer stopRecv()
	for _, ep := range r.cfg.Endpoints {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := r.receive(recvCtx, ep, msgs); err != nil {
				errs <- err
			}
		}()
	}
	r.log.Info("relaying engine kv events", "endpoints", r.cfg.Endpoints, "subject", kvevents.EventsSubject(r.cfg.Pool))
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errs:
			return err
		case m := <-msgs:
			r.handle(ctx, m.endpoint, m.frames)
		}
	}
}

type received struct {
	endpoint string
	frames   [][]byte
}

// receive subscribes to one endpoint and forwards its messages until ctx
// ends. The engine need not be up: the socket dials until it is, and again
// after it restarts.
func (r *Relay) receive(ctx context.Context, endpoint string, out chan<- received) error {
	sub := zmq4.NewSub(ctx,
		zmq4.WithAutomaticReconnect(true),
		zmq4.WithDialerRetry(250*time.Millisecond),
		zmq4.WithDialerMaxRetries(-1),
	)
	defer sub.Close()
	if err := sub.SetOption(zmq4.OptionSubscribe, r.cfg.Topic); err != nil {
		return fmt.Errorf("relay: subscribe: %w", err)
	}
	if err := sub.Dial(endpoint); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("relay: %w", err)
	}
	for {
		msg, err := sub.Recv()
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			r.log.Warn("receive from engine", "endpoint", endpoint, "err", err)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		select {
		case out <- received{endpoint, msg.Frames}:
		case <-ctx.Done():
			return nil
		}
	}
}

// handle decodes one engine message and publishes its events.
func (r *Relay) handle(ctx context.Context, endpoint string, frames [][]byte) {
	r.m.messages.Inc()
	b, err := r.dec.Decode(frames)
	if err != nil {
		r.m.malformed.Inc()
		r.log.Warn("skipping malformed engine message", "endpoint", endpoint, "err", err, "frames", len(frames))
		if len(frames) == 3 && len(frames[1]) == 8 {
			// Its sequence number is still good: it may show a restart or a
			// gap, and no gap is to be reported after it.
			r.sequence(ctx, endpoint, string(frames[0]), binary.BigEndian.Uint64(frames[1]))
		}
		return
	}
	r.sequence(ctx, endpoint, b.Topic, b.Seq)
	r.publishBatch(endpoint, b)
}

// sequence follows an endpoint's message sequence numbers: a number that
// went back is an engine restart (its cache is empty), a jump is lost
// messages (recovered from the replay socket when there is one).
func (r *Relay) sequence(ctx context.Context, endpoint, topic string, seq uint64) {
	stream := endpoint + "\x00" + topic
	if last, ok := r.lastSeq[stream]; ok {
		switch {
		case seq <= last:
			// The engine restarted (sequences start again at 0) with an
			// empty cache; vLLM sends no AllBlocksCleared for that.
			r.m.restarts.Inc()
			r.log.Warn("engine sequence went back; treating as a restart and clearing the worker's blocks", "endpoint", endpoint, "seq", seq, "last", last)
			r.clearEndpoint(endpoint)
		case seq != last+1:
			rep := r.replayFor[endpoint]
			if rep == "" || !r.recoverGap(ctx, endpoint, rep, last, seq) {
				// Lost for good: the removals among them would leave phantom
				// blocks, the stores would make later chains "unknown
				// parent". Clearing underestimates the worker's cache until
				// it refills, instead of drifting from it indefinitely.
				r.m.gaps.Inc()
				r.log.Warn("engine messages lost; clearing the worker's blocks", "endpoint", endpoint, "from_seq", last+1, "to_seq", seq-1)
				r.clearEndpoint(endpoint)
			}
		}
	}
	r.lastSeq[stream] = seq
}

// clearEndpoint publishes Cleared for every rank seen on endpoint.
func (r *Relay) clearEndpoint(endpoint string) {
	for rank := range r.ranksOf[endpoint] {
		if _, err := r.pub.Publish(rank, kvevents.Event{Cleared: true}); err != nil {
			r.m.pubErrors.Inc()
			r.log.Warn("publish", "err", err)
		}
	}
}

// publishBatch counts a decoded batch's skips and publishes its events.
func (r *Relay) publishBatch(endpoint string, b kvevents.EngineBatch) {
	if r.ranksOf[endpoint] == nil {
		r.ranksOf[endpoint] = map[uint32]struct{}{}
	}
	r.ranksOf[endpoint][b.DPRank] = struct{}{}
	for reason, n := range b.Skipped {
		r.m.skipped.WithLabelValues(string(reason)).Add(float64(n))
	}
	if b.SkippedBlocks > 0 {
		r.m.skippedBlocks.Add(float64(b.SkippedBlocks))
		r.log.Debug("skipped engine events", "skipped", b.Skipped, "blocks", b.SkippedBlocks, "block_size", r.cfg.Worker.BlockSize)
	}
	r.checkConfig(endpoint, b)
	for _, ev := range b.Events {
		if _, err := r.pub.Publish(b.DPRank, ev); err != nil {
			r.m.pubErrors.Inc()
			r.log.Warn("publish", "err", err, "seq", b.Seq, "dp_rank", strconv.FormatUint(uint64(b.DPRank), 10))
		}
	}
}

// checkConfig is the configuration guard: when an endpoint's stores are
// all skipped for their block size, it warns (naming the flags to fix) and
// tells the routers, at most once per noticeEvery.
func (r *Relay) checkConfig(endpoint string, b kvevents.EngineBatch) {
	g := r.guard[endpoint]
	if g == nil {
		g = &guardState{}
		r.guard[endpoint] = g
	}
	for _, ev := range b.Events {
		if ev.Stored != nil {
			g.stored++
		}
	}
	n := b.Skipped[kvevents.SkipBlockSize]
	if n == 0 {
		return
	}
	g.skipped += uint64(n)
	now := r.opts.Now()
	if g.stored > 0 || (!g.lastNotice.IsZero() && now.Sub(g.lastNotice) < noticeEvery) {
		return
	}
	g.lastNotice = now
	notice := kvevents.SkipNotice{Reason: string(kvevents.SkipBlockSize), Events: g.skipped,
		EngineBlockSize: uint32(max(b.EngineBlockSize, 0)), BlockSize: uint32(r.cfg.Worker.BlockSize)}
	r.log.Warn("every stored event of this engine is skipped: "+notice.Message(), "endpoint", endpoint,
		"engine_block_size", b.EngineBlockSize, "block_size", r.cfg.Worker.BlockSize, "skipped_events", g.skipped)
	if _, err := r.pub.Publish(b.DPRank, kvevents.Event{Skipped: &notice}); err != nil {
		r.m.pubErrors.Inc()
		r.log.Warn("publish", "err", err)
	}
}
