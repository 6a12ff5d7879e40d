// Package replica shares request lifecycle events between the replicas of
// one pool's local router over NATS (kvevents.ActiveSeqsSubject), so each
// replica sees the whole pool's load (Dynamo's replica_sync).
//
// A replica publishes what it records itself (a request added to a worker,
// its prefill completed, its free) and applies what the others publish to
// its own lifecycle state; it ignores its own messages. KV events are not
// shared: each replica consumes them itself. In approximate mode an added
// request also carries its blocks, so every replica's approximate index
// learns from every replica's decisions.
package replica

import (
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/kvevents"
	"github.com/kvgate/kvgate/localrouter"
)

// Ops of a Message.
const (
	OpAdd             = "add"
	OpPrefillComplete = "prefill_complete"
	OpFree            = "free"
)

// Message is one lifecycle event on the wire (msgpack).
type Message struct {
	// RouterID is the replica that published it.
	RouterID  string `msgpack:"router_id"`
	Op        string `msgpack:"op"`
	RequestID string `msgpack:"request_id"`
	// Add only.
	WorkerID      string   `msgpack:"worker_id,omitempty"`
	DPRank        uint32   `msgpack:"dp_rank,omitempty"`
	LocalHashes   []uint64 `msgpack:"local_hashes,omitempty"`
	ISL           int      `msgpack:"isl,omitempty"`
	OverlapBlocks int      `msgpack:"overlap_blocks,omitempty"`
	// Record: the blocks were recorded in the approximate index too.
	Record bool `msgpack:"record,omitempty"`
}

// Options configure a Sync.
type Options struct {
	Pool     string
	RouterID string
	Logger   *slog.Logger
	// Clock (default time.Now) stamps remote additions for forced expiry.
	Clock func() time.Time
}

// Stats are a Sync's counters.
type Stats struct {
	Sent, Received, Ignored, Failed uint64
}

// Sync publishes this replica's lifecycle events and applies the others'.
// Its publishing methods never block on the network and are safe for
// concurrent use.
type Sync struct {
	nc      *nats.Conn
	router  *localrouter.Router
	opts    Options
	subject string
	log     *slog.Logger
	sub     *nats.Subscription

	sent, received, ignored, failed atomic.Uint64
}

// New subscribes to the pool's lifecycle subject on nc (owned by the
// caller, closed after Close) and applies other replicas' events to router.
func New(nc *nats.Conn, router *localrouter.Router, opts Options) (*Sync, error) {
	if opts.Pool == "" || opts.RouterID == "" {
		return nil, fmt.Errorf("replica sync: pool %q and router id %q must be set", opts.Pool, opts.RouterID)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	s := &Sync{
		nc: nc, router: router, opts: opts, subject: kvevents.ActiveSeqsSubject(opts.Pool),
		log: opts.Logger.With("component", "localrouter.replica", "pool", opts.Pool),
	}
	sub, err := nc.Subscribe(s.subject, s.onMsg)
	if err != nil {
		return nil, fmt.Errorf("replica sync: subscribe %s: %w", s.subject, err)
	}
	// The subscription is live once the server has it: what other
	// replicas publish from now on reaches this one.
	if err := nc.FlushTimeout(5 * time.Second); err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("replica sync: %w", err)
	}
	s.sub = sub
	return s, nil
}

// Close unsubscribes.
func (s *Sync) Close() error {
	err := s.sub.Unsubscribe()
	if errors.Is(err, nats.ErrConnectionClosed) {
		return nil
	}
	return err
}

// Flush waits until the server has received what was published, bounded by
// timeout (tests use it before checking another replica).
func (s *Sync) Flush(timeout time.Duration) error { return s.nc.FlushTimeout(timeout) }

// Stats returns the counters.
func (s *Sync) Stats() Stats {
	return Stats{Sent: s.sent.Load(), Received: s.received.Load(), Ignored: s.ignored.Load(), Failed: s.failed.Load()}
}

// Added publishes a request recorded on sel.Worker. localHashes are its
// blocks' local hashes (not retained), isl its prompt tokens; record says
// whether the blocks also went into the approximate index.
func (s *Sync) Added(id string, sel routing.Selection, localHashes []uint64, isl int, record bool) {
	s.publish(Message{
		Op: OpAdd, RequestID: id, WorkerID: sel.WorkerID, DPRank: sel.DPRank,
		LocalHashes: localHashes, ISL: isl, OverlapBlocks: sel.OverlapBlocks, Record: record,
	})
}

// PrefillCompleted publishes that request id's prefill is done.
func (s *Sync) PrefillCompleted(id string) { s.publish(Message{Op: OpPrefillComplete, RequestID: id}) }

// Freed publishes that request id is freed.
func (s *Sync) Freed(id string) { s.publish(Message{Op: OpFree, RequestID: id}) }

func (s *Sync) publish(m Message) {
	m.RouterID = s.opts.RouterID
	b, err := msgpack.Marshal(&m)
	if err == nil {
		err = s.nc.Publish(s.subject, b)
	}
	if err != nil {
		s.failed.Add(1)
		s.log.Warn("replica sync publish failed", "op", m.Op, "request_id", m.RequestID, "err", err)
		return
	}
	s.sent.Add(1)
}

// DecodeMessage parses one replica-sync message from the wire: msgpack
// whose lengths fit the message (checked before decoding), with a known op
// and a request id.
func DecodeMessage(b []byte) (Message, error) {
	var m Message
	if err := kvevents.CheckMsgpack(b); err != nil {
		return Message{}, fmt.Errorf("replica sync message: %w", err)
	}
	if err := msgpack.Unmarshal(b, &m); err != nil {
		return Message{}, fmt.Errorf("replica sync message: %w", err)
	}
	switch m.Op {
	case OpAdd, OpPrefillComplete, OpFree:
	default:
		return Message{}, fmt.Errorf("replica sync message: unknown op %q", m.Op)
	}
	if m.RequestID == "" {
		return Message{}, fmt.Errorf("replica sync message: %s without a request id", m.Op)
	}
	return m, nil
}

func (s *Sync) onMsg(nm *nats.Msg) {
	m, err := DecodeMessage(nm.Data)
	if err != nil {
		s.failed.Add(1)
		s.log.Debug("undecodable replica sync message", "err", err)
		return
	}
	if m.RouterID == s.opts.RouterID {
		s.ignored.Add(1)
		return
	}
	s.received.Add(1)
	if err := s.apply(m); err != nil {
		s.failed.Add(1)
		s.log.Debug("replica sync message not applied", "op", m.Op, "request_id", m.RequestID, "from", m.RouterID, "err", err)
	}
}

func (s *Sync) apply(m Message) error {
	active := s.router.Active()
	switch m.Op {
	case OpAdd:
		cfg := s.router.Config()
		key := localrouter.WorkerKey{ID: m.WorkerID, DPRank: m.DPRank}
		now := s.opts.Clock()
		if err := active.Add(now, m.RequestID, key, kvevents.SequenceHashes(m.LocalHashes), m.ISL, m.OverlapBlocks, cfg.BlockSize); err != nil {
			return err
		}
		if m.Record {
			s.router.Index().Record(now, key, m.LocalHashes)
		}
	case OpPrefillComplete:
		if !active.MarkPrefillComplete(m.RequestID) {
			return localrouter.ErrUnknownRequest
		}
	case OpFree:
		if !active.Free(m.RequestID) {
			return localrouter.ErrUnknownRequest
		}
	default:
		return fmt.Errorf("unknown op %q", m.Op)
	}
	return nil
}
