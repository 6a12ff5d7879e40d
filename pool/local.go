package pool

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"google.golang.org/grpc/status"

	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/localrouter"
	"github.com/kvgate/kvgate/localrouter/server"
)

// LocalScheme prefixes the addresses LocalDialer dials: "local:NAME".
const LocalScheme = "local:"

// LocalAddress is the address of the in-process client named name.
func LocalAddress(name string) string { return LocalScheme + name }

// Local is a Client over an in-process *localrouter.Router: the replay's
// (sim) and tests' way to run the global router against local routers
// without gRPC. Probe is BestWorker without a request id (Override and
// Allowed honoured), Loads is PotentialLoads, CommitAsync is Commit on the
// named worker, or BestWorker with the request id (decide and commit in one
// call) when Commit.WorkerID is "", and a Tracker's calls are
// MarkPrefillComplete and Free.
//
// Every call runs on the caller's goroutine and is done when it returns:
// CommitAsync has recorded the request (or been refused) before it
// returns, and only the committed listener runs on another goroutine, as
// Client's contract says. State changes thus happen in the caller's order,
// which a deterministic replay relies on. The router's errors carry the
// gRPC codes the local router's service would answer with (status.Code
// reads them; errors.Is still matches the router's sentinels), so a Pool's
// circuits judge them as they judge the gRPC client's.
//
// Safe for concurrent use. Close frees the requests of the Trackers still
// open (as a broken stream does) and refuses later calls with ErrClosed;
// it does not close the router, which its owner closes.
type Local struct {
	r       *localrouter.Router
	address func(localrouter.WorkerKey) string

	mu     sync.Mutex
	closed bool
	open   map[*localTracker]struct{}
}

var _ Client = (*Local)(nil)

// NewLocal returns a Client over r; address maps a worker rank to the
// address a selection names (the worker's host:port; nil: none).
func NewLocal(r *localrouter.Router, address func(localrouter.WorkerKey) string) *Local {
	if address == nil {
		address = func(localrouter.WorkerKey) string { return "" }
	}
	return &Local{r: r, address: address, open: make(map[*localTracker]struct{})}
}

// LocalDialer returns a Dialer of the clients of clients by name: address
// "local:NAME" dials clients[NAME]. Any Client works (a Local, or another
// in-process client). The dialed Client's Close does nothing: the clients
// are shared (a Conns closes a connection when its last user leaves and
// dials again on a reload), and whoever made them closes them.
func LocalDialer(clients map[string]Client) Dialer {
	return func(addr string) (Client, error) {
		name, ok := strings.CutPrefix(addr, LocalScheme)
		if !ok {
			return nil, fmt.Errorf("local dialer: address %q does not start with %q", addr, LocalScheme)
		}
		c, ok := clients[name]
		if !ok {
			return nil, fmt.Errorf("local dialer: no in-process client named %q (address %q)", name, addr)
		}
		return sharedClient{c}, nil
	}
}

// sharedClient is a dialed client whose Close leaves the client open.
type sharedClient struct{ Client }

func (sharedClient) Close() error { return nil }

func (p Prompt) local() localrouter.Request {
	return localrouter.Request{Tokens: p.Tokens, LocalHashes: p.Hashes, BlockSize: p.BlockSize, ISL: p.ISL, LoRAName: p.LoRA}
}

func (l *Local) check(ctx context.Context) error {
	l.mu.Lock()
	closed := l.closed
	l.mu.Unlock()
	if closed {
		return ErrClosed
	}
	return ctx.Err()
}

// allow is the worker filter of an address subset (as the local router's
// service builds it from allowed_addresses).
func (l *Local) allow(allowed []string) func(localrouter.WorkerKey) bool {
	if len(allowed) == 0 {
		return nil
	}
	return func(k localrouter.WorkerKey) bool { return routing.AddressAllowed(allowed, l.address(k)) }
}

// Probe implements Client.
func (l *Local) Probe(ctx context.Context, p Prompt) (routing.Selection, error) {
	if err := l.check(ctx); err != nil {
		return routing.Selection{}, err
	}
	sel, err := l.r.BestWorker(ctx, p.local(), localrouter.BestWorkerOptions{Override: p.Override, Allow: l.allow(p.Allowed)})
	if err != nil {
		return routing.Selection{}, localError(err)
	}
	sel.Address = l.address(localrouter.Selected(sel))
	return sel, nil
}

// Loads implements Client.
func (l *Local) Loads(ctx context.Context, p Prompt) ([]routing.Selection, error) {
	if err := l.check(ctx); err != nil {
		return nil, err
	}
	ls, err := l.r.PotentialLoads(ctx, p.local())
	if err != nil {
		return nil, localError(err)
	}
	out := make([]routing.Selection, len(ls))
	for i, ld := range ls {
		out[i] = routing.Selection{WorkerID: ld.Worker.ID, DPRank: ld.Worker.DPRank, Address: l.address(ld.Worker),
			OverlapBlocks: ld.OverlapBlocks, PrefillTokens: ld.PotentialPrefillTokens, DecodeBlocks: ld.PotentialDecodeBlocks,
			BlockSize: p.BlockSize}
	}
	return out, nil
}

// CommitAsync implements Client. The commit is made before it returns;
// committed (nil: nobody listens) then gets the answer on a goroutine of
// its own. A refused commit still returns its Tracker (whose
// PrefillComplete returns the refusal; Free does nothing).
func (l *Local) CommitAsync(ctx context.Context, c Commit, committed func(routing.Selection, error)) (Tracker, error) {
	if err := l.check(ctx); err != nil {
		return nil, err
	}
	if c.RequestID == "" {
		return nil, localError(localrouter.ErrEmptyRequestID)
	}
	var (
		sel routing.Selection
		err error
	)
	if c.WorkerID == "" {
		sel, err = l.r.BestWorker(ctx, c.Prompt.local(), localrouter.BestWorkerOptions{
			RequestID: c.RequestID, Override: c.Prompt.Override, Allow: l.allow(c.Prompt.Allowed)})
	} else {
		sel, err = l.r.Commit(ctx, c.RequestID, localrouter.WorkerKey{ID: c.WorkerID, DPRank: c.DPRank}, c.Prompt.local())
	}
	t := &localTracker{l: l, id: c.RequestID}
	if err != nil {
		err = localError(err)
		t.refused = err
		t.freed = true
	} else {
		sel.Address = l.address(localrouter.Selected(sel))
		l.mu.Lock()
		if l.closed { // closed meanwhile: the request must not stay on the router
			l.mu.Unlock()
			_ = l.r.Free(ctx, c.RequestID)
			return nil, ErrClosed
		}
		l.open[t] = struct{}{}
		l.mu.Unlock()
	}
	if committed != nil {
		go committed(sel, err)
	}
	return t, nil
}

// Close implements Client: the open Trackers' requests are freed.
func (l *Local) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	open := l.open
	l.open = nil
	l.mu.Unlock()
	for t := range open {
		t.free()
	}
	return nil
}

// localTracker is a request committed through a Local.
type localTracker struct {
	l  *Local
	id string

	mu      sync.Mutex
	freed   bool
	refused error // the commit's refusal
}

// PrefillComplete implements Tracker: MarkPrefillComplete, once; nothing
// after Free; a refused commit's refusal.
func (t *localTracker) PrefillComplete(ctx context.Context) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.refused != nil {
		return t.refused
	}
	if t.freed {
		return nil
	}
	err := t.l.r.MarkPrefillComplete(ctx, t.id)
	if errors.Is(err, localrouter.ErrUnknownRequest) {
		// The router dropped it (its worker left, or it expired): what
		// a stream's router does too, and nothing the caller can fix.
		return nil
	}
	return localError(err)
}

// Free implements Tracker: Free on the router, once.
func (t *localTracker) Free(ctx context.Context) error {
	if !t.free() {
		return nil
	}
	t.l.mu.Lock()
	delete(t.l.open, t)
	t.l.mu.Unlock()
	return nil
}

// free frees the request on the router unless it was; it reports whether
// this call did.
func (t *localTracker) free() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.freed {
		return false
	}
	t.freed = true
	// An unknown id is already gone (its worker left): freed either way.
	_ = t.l.r.Free(context.Background(), t.id)
	return true
}

// codedError is a router error with the status its gRPC service would
// answer it with (localrouter/server.RouterStatus).
type codedError struct {
	st  *status.Status
	err error
}

func (e *codedError) Error() string              { return e.err.Error() }
func (e *codedError) Unwrap() error              { return e.err }
func (e *codedError) GRPCStatus() *status.Status { return e.st }

// localError gives a router error its gRPC status; context errors and
// unknown errors are returned as they are.
func localError(err error) error {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	if st, ok := server.RouterStatus(err); ok {
		return &codedError{st: st, err: err}
	}
	return err
}
