package server

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"google.golang.org/grpc/status"

	localrouterv1 "github.com/kvgate/kvgate/api/localrouter/v1"
	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/localrouter"
)

// Channel streams: how many probes a stream queues, and how many of them run
// at once. The reader stops reading when the queue is full, which pushes
// back on the client through HTTP/2 flow control.
const (
	// ChannelMaxInFlight is the probes a Channel stream queues before it
	// stops reading (told to the client in the hello).
	ChannelMaxInFlight = 1024
	// channelWorkers run a stream's probes: a fixed number of goroutines
	// per stream, none per message.
	channelWorkers = 4
	// channelPruneMin is the least growth of a stream's committed set
	// between two prunes.
	channelPruneMin = 1024
)

// chanProbe is a probe read from a Channel stream, waiting for a worker.
// It is reused (probePool) once its worker took it from the queue.
type chanProbe struct {
	id       uint64
	in       *localrouterv1.ChannelProbe
	deadline time.Time // zero: none
	canceled atomic.Bool
}

var probePool = sync.Pool{New: func() any { return new(chanProbe) }}

// prober is one worker's state, reused from probe to probe: the signals
// report BestWorker fills and the answer's wrapping (gRPC's Send marshals
// before it returns, so the message is free again once sent).
type prober struct {
	rep  localrouter.SignalsReport
	sel  localrouterv1.ChannelResponse_Selection
	resp localrouterv1.ChannelResponse
}

// chanStream is one Channel stream's state on the server.
type chanStream struct {
	s      *Server
	stream localrouterv1.LocalRouter_ChannelServer
	ctx    context.Context

	sendMu sync.Mutex // gRPC streams allow one sender at a time

	mu     sync.Mutex
	queued map[uint64]*chanProbe // probes read and not yet started

	// committed are the requests committed on this stream and not yet
	// freed, by the id of the message that committed them: the reader's
	// own (commits and events run on it, in order).
	committed map[uint64]string
	// pruneAt is the size of committed at which the requests the router
	// expired (or freed by a call outside the stream) are dropped from it.
	pruneAt int

	// reserved are the request ids this stream's probes reserved a worker
	// for and not yet confirmed or released (guarded by mu: probes run on
	// the stream's workers); the stream's end releases them.
	// reservedPruneAt is reserved's size at which the reservations gone
	// by other ways (expired, confirmed on another stream) are dropped.
	reserved        map[string]struct{}
	reservedPruneAt int
	// reserving counts, by request id, the stream's reserving probes
	// queued or running (guarded by mu); early are the request ids whose
	// release came while one was (the client gave up waiting for its
	// answer): the probe's reservation is released as soon as it is made.
	reserving map[string]int
	early     map[string]struct{}
}

// Channel implements localrouterv1.LocalRouterServer: probes, commits and
// lifecycle events of many requests multiplexed on one stream. Probes run on
// a fixed set of the stream's goroutines; commits and events run on the
// reader, in arrival order, so a request's events follow its commit. When
// the stream ends, however it ends, every request committed on it and not
// freed is freed.
func (s *Server) Channel(stream localrouterv1.LocalRouter_ChannelServer) error {
	s.channelStreams.Add(1)
	defer s.channelStreams.Add(-1)
	cs := &chanStream{
		s: s, stream: stream, ctx: stream.Context(),
		queued: make(map[uint64]*chanProbe), committed: make(map[uint64]string), pruneAt: channelPruneMin,
		reserved: make(map[string]struct{}), reservedPruneAt: channelPruneMin,
		reserving: make(map[string]int), early: make(map[string]struct{}),
	}
	// Freed however the stream ends; its context may be gone already.
	defer cs.freeAll()
	if err := cs.send(&localrouterv1.ChannelResponse{Msg: &localrouterv1.ChannelResponse_Hello{
		Hello: &localrouterv1.ChannelHello{MaxInFlight: ChannelMaxInFlight, Confirms: true}}}); err != nil {
		return err
	}
	probes := make(chan *chanProbe, ChannelMaxInFlight)
	var wg sync.WaitGroup
	for range channelWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var pr prober
			for p := range probes {
				cs.runProbe(p, &pr)
			}
		}()
	}
	err := cs.read(probes)
	close(probes)
	wg.Wait()
	return err
}

// read handles the client's messages until the stream ends. It reuses one
// request message: what outlives a message (a probe, strings) is not
// part of it but pointed to by it, and a receive resets it first.
func (cs *chanStream) read(probes chan<- *chanProbe) error {
	in := new(localrouterv1.ChannelRequest)
	for {
		err := cs.stream.RecvMsg(in)
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		id := in.GetId()
		switch m := in.GetMsg().(type) {
		case *localrouterv1.ChannelRequest_Probe:
			p := probePool.Get().(*chanProbe)
			p.id, p.in = id, m.Probe
			if t := m.Probe.GetTimeoutUs(); t > 0 {
				p.deadline = time.Now().Add(time.Duration(t) * time.Microsecond)
			}
			cs.mu.Lock()
			cs.queued[id] = p
			if rid := m.Probe.GetReserveRequestId(); rid != "" {
				cs.reserving[rid]++
			}
			cs.mu.Unlock()
			select {
			case probes <- p:
			case <-cs.ctx.Done():
				return cs.ctx.Err()
			}
		case *localrouterv1.ChannelRequest_Commit:
			err = cs.commit(id, m.Commit)
		case *localrouterv1.ChannelRequest_Event:
			err = cs.event(id, m.Event)
		case *localrouterv1.ChannelRequest_Release:
			cs.release(m.Release.GetRequestId())
		case *localrouterv1.ChannelRequest_Confirm:
			cs.confirm(id, m.Confirm)
		case *localrouterv1.ChannelRequest_Cancel:
			cs.mu.Lock()
			if p := cs.queued[m.Cancel.GetId()]; p != nil {
				p.canceled.Store(true)
			}
			cs.mu.Unlock()
		default:
			err = cs.fail(id, fmt.Errorf("%w: empty channel message %d", errInvalidArgument, id))
		}
		if err != nil {
			return err
		}
	}
}

// runProbe answers one probe, unless it was canceled or its deadline passed
// while it was queued. Once out of the queue, p is the worker's alone: it
// goes back to probePool here.
func (cs *chanStream) runProbe(p *chanProbe, pr *prober) {
	cs.mu.Lock()
	delete(cs.queued, p.id)
	cs.mu.Unlock()
	id, in, deadline, canceled := p.id, p.in, p.deadline, p.canceled.Load()
	p.in, p.deadline = nil, time.Time{}
	p.canceled.Store(false)
	probePool.Put(p)
	if rid := in.GetReserveRequestId(); rid != "" {
		defer cs.reserveDone(rid)
	}
	switch {
	case canceled:
		_ = cs.fail(id, context.Canceled)
		return
	case !deadline.IsZero() && time.Now().After(deadline):
		_ = cs.fail(id, context.DeadlineExceeded)
		return
	}
	pr.rep = localrouter.SignalsReport{}
	sel, err := cs.s.probe(cs.ctx, in, &pr.rep)
	if err != nil {
		_ = cs.fail(id, err)
		return
	}
	if rid := in.GetReserveRequestId(); rid != "" {
		cs.noteReserved(rid)
	}
	pr.sel.Selection = sel
	pr.resp.Id, pr.resp.Msg = id, &pr.sel
	_ = cs.send(&pr.resp)
	pr.sel.Selection = nil // not kept alive by the worker
}

// probe is BestWorker without a request id over a channel probe, or a
// reserving BestWorker when the probe names a request to reserve for; rep
// is filled with the choice's signals.
func (s *Server) probe(ctx context.Context, in *localrouterv1.ChannelProbe, rep *localrouter.SignalsReport) (*localrouterv1.Selection, error) {
	prompt := in.GetPrompt()
	if packed := in.GetPackedHashes(); len(packed) > 0 {
		hashes, err := unpackHashes(packed)
		if err != nil {
			return nil, err
		}
		cp := &localrouterv1.Prompt{
			BlockHashes: hashes, BlockSize: prompt.GetBlockSize(),
			IslTokens: prompt.GetIslTokens(), LoraName: prompt.GetLoraName(), SessionKey: prompt.GetSessionKey(),
		}
		prompt = cp
	}
	req, err := s.request(prompt)
	if err != nil {
		return nil, err
	}
	opts := localrouter.BestWorkerOptions{
		Override: override(in.GetConfigOverride()), Signals: rep, Allow: s.allow(in.GetAllowedAddresses()),
	}
	if rid := in.GetReserveRequestId(); rid != "" {
		ttl, err := reserveTTL(in.GetReserveTtlUs(), rid)
		if err != nil || ttl == 0 { // over the bound: BestWorker refuses it (routing.MaxReserveTTL)
			return nil, fmt.Errorf("%w: probe reserves for request %q with reserve_ttl_us %d: want 1 to %d", errInvalidArgument, rid, in.GetReserveTtlUs(), routing.MaxReserveTTL.Microseconds())
		}
		opts.RequestID, opts.ReserveTTL = rid, ttl
	}
	sel, err := s.r.BestWorker(ctx, req, opts)
	if err != nil {
		return nil, err
	}
	return s.withSignals(s.selection(sel), rep), nil
}

// littleEndian: the host's u64s are laid out as packed_hashes is.
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// unpackHashes decodes packed_hashes: little-endian u64s, 8 bytes each. On
// a little-endian host it returns a view of packed, without copying
// (packed is the unmarshalled message's own copy; nothing else writes it).
func unpackHashes(packed []byte) ([]uint64, error) {
	if len(packed)%8 != 0 {
		return nil, fmt.Errorf("%w: packed_hashes is %d bytes, not a multiple of 8", errInvalidArgument, len(packed))
	}
	if len(packed) == 0 {
		return nil, nil
	}
	if p := unsafe.SliceData(packed); littleEndian && uintptr(unsafe.Pointer(p))%8 == 0 {
		return unsafe.Slice((*uint64)(unsafe.Pointer(p)), len(packed)/8), nil
	}
	hashes := make([]uint64, len(packed)/8)
	for i := range hashes {
		hashes[i] = binary.LittleEndian.Uint64(packed[i*8:])
	}
	return hashes, nil
}

// commit records a request on the stream's behalf.
func (cs *chanStream) commit(id uint64, in *localrouterv1.CommitRequest) error {
	if _, dup := cs.committed[id]; dup {
		// Events name commits by id: a reused id would orphan a request.
		return cs.fail(id, fmt.Errorf("%w: message id %d already names a request committed on this stream", errInvalidArgument, id))
	}
	sel, err := cs.s.commit(cs.ctx, in)
	if in.GetReserved() {
		cs.mu.Lock()
		delete(cs.reserved, in.GetRequestId())
		cs.mu.Unlock()
	}
	if err != nil {
		return cs.fail(id, err)
	}
	cs.committed[id] = in.GetRequestId()
	if len(cs.committed) >= cs.pruneAt {
		for cid, rid := range cs.committed {
			if _, ok := cs.s.r.Active().Has(rid); !ok {
				delete(cs.committed, cid)
			}
		}
		cs.pruneAt = 2*len(cs.committed) + channelPruneMin
	}
	return cs.send(&localrouterv1.ChannelResponse{Id: id, Msg: &localrouterv1.ChannelResponse_Selection{Selection: cs.s.selection(sel)}})
}

// confirm turns the reservation a probe made into the request, without
// an answer (ChannelRequest.confirm): the request is then the stream's,
// under the confirm's message id, as a commit's. A confirm whose
// reservation is gone records nothing (the router counts it as missed);
// its events answer NOT_FOUND.
func (cs *chanStream) confirm(id uint64, in *localrouterv1.ChannelConfirm) {
	rid := in.GetRequestId()
	cs.mu.Lock()
	delete(cs.reserved, rid)
	cs.mu.Unlock()
	if _, dup := cs.committed[id]; dup {
		return // a reused id: the earlier request keeps it
	}
	if err := cs.s.r.ConfirmHeld(cs.ctx, rid, localrouter.WorkerKey{ID: in.GetWorkerId(), DPRank: in.GetDpRank()}); err != nil {
		cs.s.log.Debug("answerless confirmation dropped", "request_id", rid, "err", err)
		return
	}
	cs.committed[id] = rid
}

// event applies a lifecycle event to a request committed on the stream.
func (cs *chanStream) event(id uint64, in *localrouterv1.ChannelEvent) error {
	rid, ok := cs.committed[in.GetCommitId()]
	if !ok {
		return cs.fail(id, fmt.Errorf("%w: no request committed by message %d on this stream", localrouter.ErrUnknownRequest, in.GetCommitId()))
	}
	var err error
	switch in.GetEvent() {
	case localrouterv1.TrackEvent_TRACK_EVENT_PREFILL_COMPLETE:
		err = cs.s.markPrefillComplete(cs.ctx, rid)
	case localrouterv1.TrackEvent_TRACK_EVENT_FREE:
		delete(cs.committed, in.GetCommitId())
		err = cs.s.free(cs.ctx, rid)
	default:
		err = fmt.Errorf("%w: unknown channel event %v", errInvalidArgument, in.GetEvent())
	}
	if err != nil {
		return cs.fail(id, err)
	}
	return cs.send(&localrouterv1.ChannelResponse{Id: id, Msg: &localrouterv1.ChannelResponse_Acked{Acked: in.GetEvent()}})
}

// noteReserved records that a probe of the stream reserved for request
// rid, dropping the reservations gone otherwise when the set has grown.
func (cs *chanStream) noteReserved(rid string) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.reserved[rid] = struct{}{}
	if len(cs.reserved) < cs.reservedPruneAt {
		return
	}
	for r := range cs.reserved {
		if _, ok := cs.s.r.Reserved(r); !ok {
			delete(cs.reserved, r)
		}
	}
	cs.reservedPruneAt = 2*len(cs.reserved) + channelPruneMin
}

// release releases the reservation a probe made for request rid. It is
// not answered (ChannelRequest.release): the client sends it without
// waiting and registers no call for it (client.Channel.Release), so an
// answer was a write, a wake-up and a decode per losing pool of every
// decision, all dropped on arrival. A release of nothing (expired,
// confirmed or released already) changes nothing.
func (cs *chanStream) release(rid string) {
	cs.mu.Lock()
	delete(cs.reserved, rid)
	if cs.reserving[rid] > 0 {
		// Its probe is still queued or running (the client stopped
		// waiting for it): released once it has reserved (reserveDone),
		// not left to its TTL.
		cs.early[rid] = struct{}{}
	}
	cs.mu.Unlock()
	_ = cs.s.r.Release(cs.ctx, rid)
}

// reserveDone ends a reserving probe of request rid (answered, failed or
// dropped): a release that came while it ran releases what it reserved.
func (cs *chanStream) reserveDone(rid string) {
	cs.mu.Lock()
	if cs.reserving[rid]--; cs.reserving[rid] <= 0 {
		delete(cs.reserving, rid)
	}
	_, early := cs.early[rid]
	if early && cs.reserving[rid] == 0 {
		delete(cs.early, rid)
		delete(cs.reserved, rid)
	}
	cs.mu.Unlock()
	if early {
		_ = cs.s.r.Release(cs.ctx, rid)
	}
}

// freeAll frees the requests the stream committed and did not free, and
// releases the reservations its probes made and nobody confirmed.
func (cs *chanStream) freeAll() {
	ctx := context.WithoutCancel(cs.ctx)
	cs.mu.Lock()
	reserved := cs.reserved
	cs.reserved = nil
	cs.mu.Unlock()
	for rid := range reserved {
		_ = cs.s.r.Release(ctx, rid)
	}
	n := 0
	for _, rid := range cs.committed {
		if err := cs.s.free(ctx, rid); err == nil {
			n++
		}
	}
	if n > 0 {
		cs.s.log.Debug("requests freed at the end of their channel stream", "freed", n)
	}
}

// fail answers message id with err's status. It reports only a failure to
// send (the stream is then gone).
func (cs *chanStream) fail(id uint64, err error) error {
	st, _ := status.FromError(toStatus(err))
	return cs.send(&localrouterv1.ChannelResponse{Id: id, Msg: &localrouterv1.ChannelResponse_Error{Error: localrouterv1.ChannelErrorOf(st)}})
}

func (cs *chanStream) send(m *localrouterv1.ChannelResponse) error {
	cs.sendMu.Lock()
	defer cs.sendMu.Unlock()
	return cs.stream.Send(m)
}
