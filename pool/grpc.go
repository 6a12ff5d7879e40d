package pool

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	localrouterv1 "github.com/kvgate/kvgate/api/localrouter/v1"
)

// Dialer makes a Router client for a local router's gRPC address.
type Dialer func(addr string) (Router, error)

// GRPCDialer returns a Dialer of gRPC clients (insecure transport unless
// opts say otherwise). Connections are made lazily, on the first call.
// gRPC's reconnection backoff is capped at 5 s (its default, 120 s, would
// keep a router that came back unreachable long after its circuit let a
// trial probe through).
func GRPCDialer(opts ...grpc.DialOption) Dialer {
	return func(addr string) (Router, error) {
		all := append([]grpc.DialOption{
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithConnectParams(grpc.ConnectParams{
				Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 5 * time.Second},
				MinConnectTimeout: 5 * time.Second,
			}),
			// Static flow-control windows turn off gRPC's bandwidth-delay
			// estimator, whose pings rode along every probe: a frame each
			// way to write, read and answer. Probes and commits are small;
			// 1 MiB covers any prompt's hashes many times.
			grpc.WithInitialWindowSize(1 << 20),
			grpc.WithInitialConnWindowSize(1 << 20),
		}, opts...)
		cc, err := grpc.NewClient(addr, all...)
		if err != nil {
			return nil, fmt.Errorf("local router %s: %w", addr, err)
		}
		return NewGRPC(cc, addr), nil
	}
}

// GRPC is a Router over a gRPC connection to the local-router service.
type GRPC struct {
	addr string
	cc   *grpc.ClientConn
	c    localrouterv1.LocalRouterClient
}

var _ Router = (*GRPC)(nil)

// NewGRPC returns a Router over cc; Close closes cc.
func NewGRPC(cc *grpc.ClientConn, addr string) *GRPC {
	return &GRPC{addr: addr, cc: cc, c: localrouterv1.NewLocalRouterClient(cc)}
}

func toProto(p Prompt) *localrouterv1.Prompt {
	out := &localrouterv1.Prompt{BlockHashes: p.Hashes, BlockSize: uint32(p.BlockSize), IslTokens: uint32(p.ISL), LoraName: p.LoRA}
	if len(p.Hashes) == 0 {
		out.TokenIds = p.Tokens
	}
	return out
}

func overrideProto(o *Override) *localrouterv1.ConfigOverride {
	if o == nil {
		return nil
	}
	return &localrouterv1.ConfigOverride{OverlapScoreCredit: o.OverlapScoreCredit, PrefillLoadScale: o.PrefillLoadScale, RouterTemperature: o.RouterTemperature}
}

func (g *GRPC) selection(s *localrouterv1.Selection) Selection {
	return Selection{
		WorkerID: s.GetWorkerId(), DPRank: s.GetDpRank(), Address: s.GetAddress(),
		OverlapBlocks: int(s.GetOverlapBlocks()), RequestBlocks: int(s.GetRequestBlocks()),
		PrefillTokens: int(s.GetPotentialPrefillTokens()), DecodeBlocks: int(s.GetPotentialDecodeBlocks()),
		Cost: s.GetCost(), Workers: int(s.GetCandidates()), BlockSize: int(s.GetBlockSize()), Router: g.addr,
	}
}

// Probe implements Router.
func (g *GRPC) Probe(ctx context.Context, p Prompt) (Selection, error) {
	resp, err := g.c.BestWorker(ctx, &localrouterv1.BestWorkerRequest{Prompt: toProto(p), ConfigOverride: overrideProto(p.Override)})
	if err != nil {
		return Selection{}, err
	}
	return g.selection(resp.GetSelection()), nil
}

// Track implements Router.
func (g *GRPC) Track(ctx context.Context, c Commit, committed func(Selection, error)) (Tracker, error) {
	// The stream outlives ctx (it ends with Free); ctx bounds the commit,
	// connecting included.
	if err := g.waitReady(ctx); err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stream, err := g.c.Track(sctx)
	if err != nil {
		cancel()
		return nil, err
	}
	err = stream.Send(&localrouterv1.TrackRequest{Msg: &localrouterv1.TrackRequest_Commit{Commit: &localrouterv1.CommitRequest{
		RequestId: c.RequestID, WorkerId: c.WorkerID, DpRank: c.DPRank, Prompt: toProto(c.Prompt),
	}}})
	if err != nil {
		// Send reports io.EOF when the stream broke; the cause comes from
		// Recv. No receiver runs yet: ask here.
		if _, rerr := stream.Recv(); rerr != nil {
			err = rerr
		}
		cancel()
		return nil, err
	}
	if ctx.Err() != nil {
		cancel()
		return nil, ctx.Err()
	}
	t := &grpcTracker{
		stream: stream, cancel: cancel,
		committed:  committed,
		selection:  g.selection,
		prefillAck: make(chan struct{}, 1),
		freeAck:    make(chan struct{}, 1),
		broken:     make(chan struct{}),
		done:       make(chan struct{}),
	}
	go t.receive()
	return t, nil
}

// waitReady waits, within ctx, for the connection to be ready: a stream
// opened while it is still connecting would wait for gRPC's connect
// timeout, past the request's deadline, since the stream's own context
// must outlive the request. A connection in transient failure fails at
// once, as a fail-fast call would.
func (g *GRPC) waitReady(ctx context.Context) error {
	for {
		st := g.cc.GetState()
		switch st {
		case connectivity.Ready:
			return nil
		case connectivity.Idle:
			g.cc.Connect()
		case connectivity.TransientFailure:
			return status.Errorf(codes.Unavailable, "local router %s: connection failed", g.addr)
		case connectivity.Shutdown:
			return status.Errorf(codes.Canceled, "local router %s: connection closed", g.addr)
		}
		if !g.cc.WaitForStateChange(ctx, st) {
			return fmt.Errorf("local router %s: connecting: %w", g.addr, ctx.Err())
		}
	}
}

// Close implements Router.
func (g *GRPC) Close() error { return g.cc.Close() }

// grpcTracker is one Track stream. A receiver goroutine routes the
// router's answers; sends are serialised by sendMu (gRPC streams allow one
// sender at a time).
type grpcTracker struct {
	stream localrouterv1.LocalRouter_TrackClient
	cancel context.CancelFunc

	// committed is told the router's answer to the commit, once.
	committed  func(Selection, error)
	selection  func(*localrouterv1.Selection) Selection
	answered   bool // receiver's own
	prefillAck chan struct{}
	freeAck    chan struct{}
	broken     chan struct{} // closed when the stream ended; brokenErr says why
	brokenErr  error
	done       chan struct{} // closed when the receiver returned

	sendMu      sync.Mutex
	prefillSent bool
	freeSent    bool

	freeOnce sync.Once
	freeErr  error
}

var errStreamEnded = errors.New("track stream ended")

func (t *grpcTracker) receive() {
	defer close(t.done)
	for {
		m, err := t.stream.Recv()
		if err != nil {
			t.brokenErr = err
			// Told before broken closes: whoever sees the stream broken
			// already knows a refusal.
			if !t.answered {
				t.answered = true
				t.committed(Selection{}, err)
			}
			close(t.broken)
			return
		}
		switch {
		case m.GetCommitted() != nil:
			if !t.answered {
				t.answered = true
				t.committed(t.selection(m.GetCommitted()), nil)
			}
		case m.GetAcked() == localrouterv1.TrackEvent_TRACK_EVENT_PREFILL_COMPLETE:
			select {
			case t.prefillAck <- struct{}{}:
			default:
			}
		case m.GetAcked() == localrouterv1.TrackEvent_TRACK_EVENT_FREE:
			select {
			case t.freeAck <- struct{}{}:
			default:
			}
		}
	}
}

// stop ends the stream and waits for the receiver.
func (t *grpcTracker) stop() {
	t.cancel()
	<-t.done
}

func (t *grpcTracker) send(ev localrouterv1.TrackEvent) error {
	return t.stream.Send(&localrouterv1.TrackRequest{Msg: &localrouterv1.TrackRequest_Event{Event: ev}})
}

// PrefillComplete implements Tracker.
func (t *grpcTracker) PrefillComplete(ctx context.Context) error {
	t.sendMu.Lock()
	if t.prefillSent || t.freeSent {
		t.sendMu.Unlock()
		return nil
	}
	t.prefillSent = true
	err := t.send(localrouterv1.TrackEvent_TRACK_EVENT_PREFILL_COMPLETE)
	t.sendMu.Unlock()
	if err != nil {
		<-t.broken
		return fmt.Errorf("prefill complete: %w: %w", errStreamEnded, t.brokenErr)
	}
	select {
	case <-t.prefillAck:
		return nil
	case <-t.broken:
		return fmt.Errorf("prefill complete: %w: %w", errStreamEnded, t.brokenErr)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Free implements Tracker.
func (t *grpcTracker) Free(ctx context.Context) error {
	t.freeOnce.Do(func() {
		t.sendMu.Lock()
		t.freeSent = true
		err := t.send(localrouterv1.TrackEvent_TRACK_EVENT_FREE)
		t.sendMu.Unlock()
		if err == nil {
			select {
			case <-t.freeAck:
			case <-t.broken:
				// The router ends the stream after acknowledging; a
				// stream that ended before means the request was freed
				// by the stream's end.
			case <-ctx.Done():
				t.freeErr = ctx.Err()
			}
		}
		// Closing the stream frees the request on the router in any case.
		t.stop()
	})
	return t.freeErr
}
