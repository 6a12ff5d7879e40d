package subtree

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	localrouterv1 "github.com/kvgate/kvgate/api/localrouter/v1"
	"github.com/kvgate/kvgate/pool"
)

// chanEntry is a request committed on a Channel stream. mu is held while
// its commit runs, so its events wait for it (and follow it).
type chanEntry struct {
	mu sync.Mutex
	t  pool.Tracker // nil: the commit failed
}

// chanStream is one Channel stream.
type chanStream struct {
	s      *Server
	stream localrouterv1.LocalRouter_ChannelServer
	ctx    context.Context
	sem    chan struct{} // messages awaiting answers
	wg     sync.WaitGroup

	sendMu sync.Mutex

	mu        sync.Mutex
	committed map[uint64]*chanEntry
	probes    map[uint64]context.CancelFunc
}

// Channel implements localrouterv1.LocalRouterServer: probes, commits and
// events of many requests on one stream, each message answered once by
// id. Probes and commits run concurrently (a request's events wait for
// its commit); when the stream ends, however it ends, every request
// committed on it and not freed is freed below.
func (s *Server) Channel(stream localrouterv1.LocalRouter_ChannelServer) error {
	cs := &chanStream{s: s, stream: stream, ctx: stream.Context(), sem: make(chan struct{}, ChannelMaxInFlight),
		committed: map[uint64]*chanEntry{}, probes: map[uint64]context.CancelFunc{}}
	defer cs.freeAll()
	if err := cs.send(&localrouterv1.ChannelResponse{Msg: &localrouterv1.ChannelResponse_Hello{Hello: &localrouterv1.ChannelHello{MaxInFlight: ChannelMaxInFlight}}}); err != nil {
		return err
	}
	err := cs.read()
	cs.wg.Wait()
	return err
}

func (cs *chanStream) read() error {
	for {
		in, err := cs.stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		id := in.GetId()
		switch m := in.GetMsg().(type) {
		case *localrouterv1.ChannelRequest_Probe:
			ctx, cancel := context.WithCancel(cs.ctx)
			if us := m.Probe.GetTimeoutUs(); us > 0 {
				ctx, cancel = context.WithTimeout(cs.ctx, time.Duration(us)*time.Microsecond)
			}
			cs.mu.Lock()
			cs.probes[id] = cancel
			cs.mu.Unlock()
			cs.run(func() {
				sel, err := cs.s.probe(ctx, m.Probe.GetPrompt(), m.Probe.GetPackedHashes(), m.Probe.GetConfigOverride(), m.Probe.GetAllowedAddresses())
				cs.mu.Lock()
				delete(cs.probes, id)
				cs.mu.Unlock()
				cancel()
				if err != nil {
					_ = cs.fail(id, err)
					return
				}
				_ = cs.send(&localrouterv1.ChannelResponse{Id: id, Msg: &localrouterv1.ChannelResponse_Selection{Selection: sel}})
			})
		case *localrouterv1.ChannelRequest_Commit:
			cs.mu.Lock()
			_, dup := cs.committed[id]
			e := &chanEntry{}
			if !dup {
				e.mu.Lock()
				cs.committed[id] = e
			}
			cs.mu.Unlock()
			if dup {
				_ = cs.fail(id, statusOf(codes.InvalidArgument, localrouterv1.ReasonInvalidArgument, fmt.Sprintf("message id %d already names a request committed on this stream", id)))
				continue
			}
			cs.run(func() {
				t, sel, err := cs.s.commit(cs.ctx, m.Commit)
				e.t = t
				e.mu.Unlock()
				if err != nil {
					cs.mu.Lock()
					delete(cs.committed, id)
					cs.mu.Unlock()
					_ = cs.fail(id, err)
					return
				}
				_ = cs.send(&localrouterv1.ChannelResponse{Id: id, Msg: &localrouterv1.ChannelResponse_Selection{Selection: selection(sel)}})
			})
		case *localrouterv1.ChannelRequest_Event:
			cs.mu.Lock()
			e := cs.committed[m.Event.GetCommitId()]
			if e != nil && m.Event.GetEvent() == localrouterv1.TrackEvent_TRACK_EVENT_FREE {
				delete(cs.committed, m.Event.GetCommitId())
			}
			cs.mu.Unlock()
			if e == nil {
				_ = cs.fail(id, statusOf(codes.NotFound, localrouterv1.ReasonUnknownRequest, fmt.Sprintf("no request committed by message %d on this stream", m.Event.GetCommitId())))
				continue
			}
			ev := m.Event.GetEvent()
			cs.run(func() {
				e.mu.Lock()
				defer e.mu.Unlock()
				var err error
				switch {
				case e.t == nil:
					err = statusOf(codes.NotFound, localrouterv1.ReasonUnknownRequest, fmt.Sprintf("the commit of message %d was refused", m.Event.GetCommitId()))
				case ev == localrouterv1.TrackEvent_TRACK_EVENT_PREFILL_COMPLETE:
					err = e.t.PrefillComplete(cs.ctx)
				case ev == localrouterv1.TrackEvent_TRACK_EVENT_FREE:
					err = e.t.Free(context.WithoutCancel(cs.ctx))
				default:
					err = statusOf(codes.InvalidArgument, localrouterv1.ReasonInvalidArgument, fmt.Sprintf("unknown channel event %v", ev))
				}
				if err != nil {
					_ = cs.fail(id, toStatus(err))
					return
				}
				_ = cs.send(&localrouterv1.ChannelResponse{Id: id, Msg: &localrouterv1.ChannelResponse_Acked{Acked: ev}})
			})
		case *localrouterv1.ChannelRequest_Release:
			// Probes through a subtree reserve nothing (they are
			// state-free): the parent's confirming commit is an ordinary
			// commit naming its worker.
			_ = cs.fail(id, statusOf(codes.NotFound, localrouterv1.ReasonUnknownRequest, "a subtree holds no reservations"))
		case *localrouterv1.ChannelRequest_Cancel:
			cs.mu.Lock()
			if cancel := cs.probes[m.Cancel.GetId()]; cancel != nil {
				cancel()
			}
			cs.mu.Unlock()
		default:
			_ = cs.fail(id, statusOf(codes.InvalidArgument, localrouterv1.ReasonInvalidArgument, fmt.Sprintf("empty channel message %d", id)))
		}
	}
}

// run runs fn on its own goroutine once fewer than ChannelMaxInFlight
// messages await answers (the reader waits: HTTP/2 flow control pushes
// back on the client). Once the stream is gone fn still runs (its calls
// fail at once), so that a commit's entry is always settled.
func (cs *chanStream) run(fn func()) {
	token := true
	select {
	case cs.sem <- struct{}{}:
	case <-cs.ctx.Done():
		token = false
	}
	cs.wg.Add(1)
	go func() {
		defer func() {
			if token {
				<-cs.sem
			}
			cs.wg.Done()
		}()
		fn()
	}()
}

// freeAll frees the requests the stream committed and did not free.
func (cs *chanStream) freeAll() {
	ctx := context.WithoutCancel(cs.ctx)
	cs.mu.Lock()
	left := cs.committed
	cs.committed = map[uint64]*chanEntry{}
	cs.mu.Unlock()
	n := 0
	for _, e := range left {
		e.mu.Lock()
		if e.t != nil {
			_ = e.t.Free(ctx)
			n++
		}
		e.mu.Unlock()
	}
	if n > 0 {
		cs.s.log.Debug("requests freed at the end of their channel stream", "freed", n)
	}
}

func (cs *chanStream) fail(id uint64, err error) error {
	st, _ := status.FromError(toStatus(err))
	return cs.send(&localrouterv1.ChannelResponse{Id: id, Msg: &localrouterv1.ChannelResponse_Error{Error: localrouterv1.ChannelErrorOf(st)}})
}

func (cs *chanStream) send(m *localrouterv1.ChannelResponse) error {
	cs.sendMu.Lock()
	defer cs.sendMu.Unlock()
	return cs.stream.Send(m)
}
