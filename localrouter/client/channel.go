package client

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	localrouterv1 "github.com/kvgate/kvgate/api/localrouter/v1"
	"github.com/kvgate/kvgate/api/routing"
)

// DefaultChannelMaxInFlight bounds a Channel's unanswered probes and
// commits when ChannelOptions.MaxInFlight is zero (the server's own bound,
// the server's ChannelMaxInFlight).
const DefaultChannelMaxInFlight = 1024

// ChannelOptions configure a Channel.
type ChannelOptions struct {
	// MaxInFlight bounds the probes and commits awaiting an answer on the
	// stream (default DefaultChannelMaxInFlight): past it a probe or commit
	// waits, within its context, for a slot.
	MaxInFlight int
	// PackedHashes sends block hashes as packed_hashes (little-endian
	// bytes, a view of the hashes without copying on a little-endian host)
	// instead of the prompt's repeated field. Measured no faster
	// (BENCHMARKS.md): the server's decode makes one copy either way.
	PackedHashes bool
	// Metadata is sent when the stream opens (each time it is opened): it
	// applies to every message on it (a tree of global routers' hop
	// count, pool.HopsMetadata).
	Metadata metadata.MD
}

// Channel multiplexes probes (BestWorker without a request id), commits and
// lifecycle events over one long-lived Channel stream to the router, each
// message tagged by an id, instead of a call per probe and a Track stream
// per request. The stream is opened on first use and again after it
// breaks. When it breaks (the connection, the router, Close), the router
// frees every request committed on it; the Trackers of those requests
// then free nothing more and report the end.
//
// A probe whose context ends returns at once: the router is told to drop
// it, and its answer, if one still comes, is discarded. Safe for
// concurrent use; Close it.
type Channel struct {
	c    *Client
	opts ChannelOptions

	sess atomic.Pointer[chanSession] // the live stream, or nil

	mu     sync.Mutex // serialises opening
	closed bool
}

// Channel returns a Channel over the client's connection. It opens no
// stream until used.
func (c *Client) Channel(opts ChannelOptions) *Channel {
	if opts.MaxInFlight <= 0 {
		opts.MaxInFlight = DefaultChannelMaxInFlight
	}
	return &Channel{c: c, opts: opts}
}

var errChannelClosed = errors.New("channel closed")

// Close ends the stream: the router frees the requests committed on it.
// Waiting probes fail. The Client stays open.
func (ch *Channel) Close() error {
	ch.mu.Lock()
	ch.closed = true
	s := ch.sess.Swap(nil)
	ch.mu.Unlock()
	if s != nil {
		s.cancel()
		<-s.done
	}
	return nil
}

// session returns the live stream, opening one (the connection being
// ready, waited for within ctx) when there is none or it broke.
func (ch *Channel) session(ctx context.Context) (*chanSession, error) {
	if s := ch.sess.Load(); s != nil && !s.isBroken() {
		return s, nil
	}
	if err := ch.c.waitReady(ctx); err != nil {
		return nil, err
	}
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ch.closed {
		return nil, fmt.Errorf("local router %s: %w", ch.c.target, errChannelClosed)
	}
	if s := ch.sess.Load(); s != nil && !s.isBroken() {
		return s, nil
	}
	sctx, cancel := context.WithCancel(context.Background())
	if len(ch.opts.Metadata) > 0 {
		sctx = metadata.NewOutgoingContext(sctx, ch.opts.Metadata)
	}
	stream, err := ch.c.rpc.Channel(sctx)
	if err != nil {
		cancel()
		return nil, fromStatus(err)
	}
	s := &chanSession{
		stream: stream, cancel: cancel, packed: ch.opts.PackedHashes,
		sem:    make(chan struct{}, ch.opts.MaxInFlight),
		calls:  make(map[uint64]*chanCall),
		broken: make(chan struct{}), done: make(chan struct{}),
	}
	go s.receive()
	ch.sess.Store(s)
	return s, nil
}

// chanSession is one Channel stream: a receiver goroutine routes answers
// to the calls waiting for them by id.
type chanSession struct {
	stream localrouterv1.LocalRouter_ChannelClient
	cancel context.CancelFunc
	packed bool

	sendMu sync.Mutex // gRPC streams allow one sender at a time
	next   atomic.Uint64
	sem    chan struct{} // a slot per unanswered probe or commit

	mu    sync.Mutex
	calls map[uint64]*chanCall // nil once broken
	err   error                // why it broke, set before broken closes

	broken chan struct{}
	done   chan struct{} // closed when the receiver returned
	// serverMax is the router's in-flight bound from its hello.
	serverMax atomic.Uint32
	// confirms: the router's hello says it takes answerless
	// confirmations (ChannelRequest.confirm).
	confirms atomic.Bool
}

// chanCall is a message awaiting its answer. Whoever removes it from
// chanSession.calls delivers it and frees its slot.
type chanCall struct {
	done chan chanResult // probes and events: the answer, once
	// committed, for a commit, is told the answer instead.
	committed func(routing.Selection, error)
	isl       int
	slot      bool

	// A pooled call's probe message, reused: Send marshals before it
	// returns. Only the caller touches it; it is reset once sent, so the
	// pool holds no prompt.
	req    localrouterv1.ChannelRequest
	wrap   localrouterv1.ChannelRequest_Probe
	probe  localrouterv1.ChannelProbe
	prompt localrouterv1.Prompt
}

type chanResult struct {
	sel *localrouterv1.Selection
	err error
}

var callPool = sync.Pool{New: func() any { return &chanCall{done: make(chan chanResult, 1)} }}

func (s *chanSession) isBroken() bool {
	select {
	case <-s.broken:
		return true
	default:
		return false
	}
}

func (s *chanSession) brokenErr() error {
	return fmt.Errorf("%w: %w", errStreamEnded, s.err)
}

// register records c under a new id; it fails once the stream broke.
func (s *chanSession) register(c *chanCall) (uint64, error) {
	id := s.next.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.calls == nil {
		return 0, s.brokenErr()
	}
	s.calls[id] = c
	return id, nil
}

// take removes call id, reporting whether it was still there.
func (s *chanSession) take(id uint64) (*chanCall, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.calls[id]
	if ok {
		delete(s.calls, id)
	}
	return c, ok
}

func (s *chanSession) acquire(ctx context.Context) error {
	select {
	case s.sem <- struct{}{}:
		return nil
	case <-s.broken:
		return s.brokenErr()
	case <-ctx.Done():
		return ctxError(ctx)
	}
}

func (s *chanSession) release(c *chanCall) {
	if c.slot {
		c.slot = false
		<-s.sem
	}
}

func (s *chanSession) send(m *localrouterv1.ChannelRequest) error {
	s.sendMu.Lock()
	err := s.stream.Send(m)
	s.sendMu.Unlock()
	if err != nil {
		// Send reports io.EOF when the stream broke; the receiver learns
		// the cause.
		<-s.broken
		return s.brokenErr()
	}
	return nil
}

// tryCancel tells the router to drop probe id, unless another message is
// being sent (the probe's caller is gone: it does not wait).
func (s *chanSession) tryCancel(id uint64) {
	if !s.sendMu.TryLock() {
		return
	}
	_ = s.stream.Send(&localrouterv1.ChannelRequest{Msg: &localrouterv1.ChannelRequest_Cancel{Cancel: &localrouterv1.ChannelCancel{Id: id}}})
	s.sendMu.Unlock()
}

// deliver hands a call its answer.
func (s *chanSession) deliver(c *chanCall, r chanResult) {
	s.release(c)
	if c.committed != nil {
		if r.err != nil {
			c.committed(routing.Selection{}, r.err)
		} else {
			c.committed(selection(r.sel, c.isl), nil)
		}
		return
	}
	c.done <- r
}

// receive routes the router's answers until the stream breaks. It reuses
// one response message: what a call is handed (the selection) is not part
// of it but pointed to by it, and a receive resets it first.
func (s *chanSession) receive() {
	defer close(s.done)
	m := new(localrouterv1.ChannelResponse)
	for {
		err := s.stream.RecvMsg(m)
		if err != nil {
			s.mu.Lock()
			s.err = fromStatus(err)
			calls := s.calls
			s.calls = nil
			s.mu.Unlock()
			close(s.broken)
			s.cancel()
			for _, c := range calls {
				s.deliver(c, chanResult{err: s.brokenErr()})
			}
			return
		}
		if h := m.GetHello(); h != nil {
			s.serverMax.Store(h.GetMaxInFlight())
			s.confirms.Store(h.GetConfirms())
			continue
		}
		c, ok := s.take(m.GetId())
		if !ok {
			continue // abandoned by its caller
		}
		var r chanResult
		switch msg := m.GetMsg().(type) {
		case *localrouterv1.ChannelResponse_Selection:
			r.sel = msg.Selection
		case *localrouterv1.ChannelResponse_Error:
			r.err = channelError(msg.Error)
		case *localrouterv1.ChannelResponse_Acked:
		default:
			r.err = fmt.Errorf("local router channel: unexpected answer %T", m.GetMsg())
		}
		s.deliver(c, r)
	}
}

// channelError converts an error answer to *Error, as fromStatus does a
// status.
func channelError(ce *localrouterv1.ChannelError) error {
	code := codes.Code(ce.GetCode())
	e := &Error{Code: code, Reason: ce.GetReason(), Message: ce.GetMessage(), st: status.New(code, ce.GetMessage())}
	switch code {
	case codes.Canceled:
		e.err = contextCanceled
	case codes.DeadlineExceeded:
		e.err = contextDeadline
	}
	if s := reasons[e.Reason]; s != nil {
		e.err = s
	}
	return e
}

// ctxError is ctx's end as a unary call reports it.
func ctxError(ctx context.Context) error {
	return fromStatus(status.FromContextError(ctx.Err()).Err())
}

// probeRequest is c's message for probe id: p as a channel probe carries
// it (Prompt.proto's fields, or packed hashes), with ctx's deadline.
func (s *chanSession) probeRequest(ctx context.Context, c *chanCall, id uint64, p Prompt, o BestWorkerOptions) *localrouterv1.ChannelRequest {
	pr := &c.prompt
	pr.BlockSize, pr.IslTokens, pr.LoraName, pr.SessionKey = uint32(p.BlockSize), uint32(p.ISL), p.LoRAName, p.SessionKey
	out := &c.probe
	out.ConfigOverride, out.AllowedAddresses, out.Prompt = overrideProto(o.Override), o.AllowedAddresses, pr
	if o.RequestID != "" {
		out.ReserveRequestId, out.ReserveTtlUs = o.RequestID, ttlMicros(o.ReserveTTL)
	}
	switch {
	case s.packed && len(p.BlockHashes) > 0:
		out.PackedHashes = packHashes(p.BlockHashes)
	case len(p.BlockHashes) > 0:
		pr.BlockHashes = p.BlockHashes
	default:
		pr.TokenIds = p.Tokens
	}
	if dl, ok := ctx.Deadline(); ok {
		us := time.Until(dl).Microseconds()
		out.TimeoutUs = uint32(min(max(us, 1), math.MaxUint32))
	}
	c.wrap.Probe = out
	c.req.Id, c.req.Msg = id, &c.wrap
	return &c.req
}

// resetProbe drops c's probe message's references to the caller's prompt.
func (c *chanCall) resetProbe() {
	c.req.Reset()
	c.wrap.Probe = nil
	c.probe.Reset()
	c.prompt.Reset()
}

// littleEndian: the host's u64s are laid out as packed_hashes is.
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// packHashes is hashes as packed_hashes. On a little-endian host it is a
// view of hashes, without copying: the send only reads it, within the
// call, and the caller's prompt does not change during it.
func packHashes(hashes []uint64) []byte {
	if littleEndian {
		return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(hashes))), 8*len(hashes))
	}
	buf := make([]byte, 8*len(hashes))
	for i, h := range hashes {
		binary.LittleEndian.PutUint64(buf[8*i:], h)
	}
	return buf
}

// BestWorker is a state-free probe over the channel: Client.BestWorker
// without a request id (o.UpdateIndexer must be unset, and o.RequestID
// unless o.ReserveTTL is set: recording a request is the channel's
// commits' business). With o.RequestID and o.ReserveTTL it is a reserving
// probe: the chosen worker is held for the request (see
// BestWorkerOptions.ReserveTTL) until a commit on any stream confirms it
// (CommitOptions.Reserved), Release releases it, its TTL passes or this
// stream breaks.
func (ch *Channel) BestWorker(ctx context.Context, p Prompt, o BestWorkerOptions) (routing.Selection, error) {
	if (o.RequestID != "" && o.ReserveTTL <= 0) || o.UpdateIndexer {
		return routing.Selection{}, errors.New("channel BestWorker is a pure query or a reservation: use Client.BestWorker to record a request")
	}
	s, err := ch.session(ctx)
	if err != nil {
		return routing.Selection{}, err
	}
	if err := s.acquire(ctx); err != nil {
		return routing.Selection{}, err
	}
	c := callPool.Get().(*chanCall)
	c.slot = true
	id, err := s.register(c)
	if err != nil {
		s.release(c)
		callPool.Put(c)
		return routing.Selection{}, err
	}
	err = s.send(s.probeRequest(ctx, c, id, p, o))
	c.resetProbe()
	if err != nil {
		if _, ok := s.take(id); ok {
			s.release(c)
			callPool.Put(c)
		} // else the receiver delivered the break into c.done: leave c
		return routing.Selection{}, err
	}
	var r chanResult
	select {
	case r = <-c.done:
	case <-ctx.Done():
		if _, ok := s.take(id); ok {
			s.release(c)
			callPool.Put(c)
			// Best effort, never waiting: the router drops the probe if
			// it has not started.
			s.tryCancel(id)
			return routing.Selection{}, ctxError(ctx)
		}
		r = <-c.done // being delivered
	}
	callPool.Put(c)
	if r.err != nil {
		return routing.Selection{}, r.err
	}
	if o.Signals != nil {
		*o.Signals = signalsReport(r.sel)
	}
	return selection(r.sel, p.isl()), nil
}

// CommitAsync is Client.CommitAsync over the channel: it commits request
// id on worker and returns once the commit is sent; committed (nil:
// nobody listens) is called once, from the channel's receiver, with the
// answer, and must not block. ctx bounds opening the stream, a slot and
// the send. The request is freed by the ChannelTracker's Free or when the
// stream breaks. An error means nothing was committed and committed is
// not called.
func (ch *Channel) CommitAsync(ctx context.Context, id string, worker routing.WorkerKey, p Prompt, committed func(routing.Selection, error)) (*ChannelTracker, error) {
	return ch.CommitAsyncWith(ctx, id, worker, p, CommitOptions{}, committed)
}

// CommitAsyncWith is CommitAsync with options, which bound a commit
// without a worker (decide-and-commit).
func (ch *Channel) CommitAsyncWith(ctx context.Context, id string, worker routing.WorkerKey, p Prompt, o CommitOptions, committed func(routing.Selection, error)) (*ChannelTracker, error) {
	if committed == nil {
		committed = func(routing.Selection, error) {}
	}
	s, err := ch.session(ctx)
	if err != nil {
		return nil, err
	}
	if o.Reserved && o.Unanswered && worker.ID != "" && s.confirms.Load() {
		// No slot: nothing is awaited. The hello came before any answer
		// on the stream, so before the reserving probe's: a router that
		// takes confirmations has said so.
		mid := s.next.Add(1)
		if err := s.send(&localrouterv1.ChannelRequest{Id: mid, Msg: &localrouterv1.ChannelRequest_Confirm{Confirm: &localrouterv1.ChannelConfirm{
			RequestId: id, WorkerId: worker.ID, DpRank: worker.DPRank}}}); err != nil {
			return nil, err
		}
		return &ChannelTracker{s: s, commitID: mid}, nil
	}
	if err := s.acquire(ctx); err != nil {
		return nil, err
	}
	c := &chanCall{committed: committed, isl: p.isl(), slot: true}
	mid, err := s.register(c)
	if err != nil {
		s.release(c)
		return nil, err
	}
	if err := s.send(&localrouterv1.ChannelRequest{Id: mid, Msg: &localrouterv1.ChannelRequest_Commit{Commit: commitProto(id, worker, p, o)}}); err != nil {
		if _, ok := s.take(mid); ok {
			s.release(c)
			return nil, err
		}
		// The receiver told committed of the break: a tracker of a
		// broken stream, which frees nothing more.
	}
	return &ChannelTracker{s: s, commitID: mid}, nil
}

// Release releases the reservation a reserving probe of this channel made
// for request id; the router does not answer it: it returns once the
// release is sent. When the probe's stream has broken since, the
// break released the reservation, and nothing is sent. ctx is unused: a
// send only waits for the stream's other senders.
func (ch *Channel) Release(_ context.Context, id string) error {
	s := ch.sess.Load()
	if s == nil || s.isBroken() {
		return nil
	}
	// An id no call is registered under: the server does not answer a
	// release (ChannelRequest.release).
	return s.send(&localrouterv1.ChannelRequest{Id: s.next.Add(1), Msg: &localrouterv1.ChannelRequest_Release{Release: &localrouterv1.ChannelRelease{RequestId: id}}})
}

// event sends a lifecycle event and waits, within ctx, for its ack.
func (s *chanSession) event(ctx context.Context, commitID uint64, ev localrouterv1.TrackEvent) error {
	c := callPool.Get().(*chanCall)
	id, err := s.register(c)
	if err != nil {
		callPool.Put(c)
		return err
	}
	if err := s.send(&localrouterv1.ChannelRequest{Id: id, Msg: &localrouterv1.ChannelRequest_Event{Event: &localrouterv1.ChannelEvent{CommitId: commitID, Event: ev}}}); err != nil {
		if _, ok := s.take(id); ok {
			callPool.Put(c)
		}
		return err
	}
	select {
	case r := <-c.done:
		callPool.Put(c)
		return r.err
	case <-ctx.Done():
		if _, ok := s.take(id); ok {
			callPool.Put(c)
			return ctxError(ctx)
		}
		r := <-c.done
		callPool.Put(c)
		return r.err
	}
}

// ChannelTracker is the lifecycle of a request committed with
// Channel.CommitAsync, with AsyncTracker's contract: its methods are safe
// for concurrent use and idempotent and may be called before the router
// answered the commit (events follow the commit on the stream, in order);
// PrefillComplete after Free does nothing; Free after any error, a
// refused commit included, returns nil (the request is not on the router,
// or the stream's end freed it). ctx bounds the wait for the router's
// acknowledgement.
type ChannelTracker struct {
	s        *chanSession
	commitID uint64 // the commit's message id, which events name

	mu          sync.Mutex
	prefillSent bool
	freeSent    bool

	freeOnce sync.Once
	freeErr  error
}

// PrefillComplete marks the request's first token and waits, within ctx,
// for the router's acknowledgement.
func (t *ChannelTracker) PrefillComplete(ctx context.Context) error {
	t.mu.Lock()
	if t.prefillSent || t.freeSent {
		t.mu.Unlock()
		return nil
	}
	t.prefillSent = true
	t.mu.Unlock()
	if err := t.s.event(ctx, t.commitID, localrouterv1.TrackEvent_TRACK_EVENT_PREFILL_COMPLETE); err != nil {
		return fmt.Errorf("prefill complete: %w", err)
	}
	return nil
}

// Free frees the request and waits, within ctx, for the acknowledgement.
func (t *ChannelTracker) Free(ctx context.Context) error {
	t.freeOnce.Do(func() {
		t.mu.Lock()
		t.freeSent = true
		t.mu.Unlock()
		err := t.s.event(ctx, t.commitID, localrouterv1.TrackEvent_TRACK_EVENT_FREE)
		switch {
		case err == nil, errors.Is(err, errStreamEnded), errors.Is(err, routing.ErrUnknownRequest):
			// Freed; or by the stream's end; or never committed.
		default:
			t.freeErr = err
		}
	})
	return t.freeErr
}
