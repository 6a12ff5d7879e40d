// Package inproc is the local router in process: a pool.Client over a
// *localrouter.Router, without gRPC. The replay (sim) and tests run the
// global router against local routers through it (with pool.LocalDialer).
// It is the one place that joins the client side (pool) to the local
// router's core; neither pool nor globalrouter imports it.
package inproc

import (
	"context"
	"errors"
	"sync"

	"google.golang.org/grpc/status"

	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/localrouter"
	"github.com/kvgate/kvgate/localrouter/server"
	"github.com/kvgate/kvgate/pool"
)

// Client is a pool.Client over an in-process *localrouter.Router: the replay's
// (sim) and tests' way to run the global router against local routers
// without gRPC. Probe is BestWorker without a request id (Override and
// Allowed honoured; a reserving BestWorker when the prompt carries
// ReserveID), Loads is PotentialLoads, CommitAsync is pool.Commit on the
// named worker (Confirm when pool.Commit.Reserved), or BestWorker with the
// request id (decide and commit in one call) when pool.Commit.WorkerID is
// "", Release is the router's Release, and a pool.Tracker's calls are
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
// open and releases the reservations its probes made and nobody confirmed
// (as a broken stream does), and refuses later calls with pool.ErrClosed;
// it does not close the router, which its owner closes.
type Client struct {
	r       *localrouter.Router
	address func(localrouter.WorkerKey) string

	mu     sync.Mutex
	closed bool
	open   map[*localTracker]struct{}
	// reserved are the request ids this client's probes reserved for and
	// that were not confirmed or released through it.
	reserved map[string]struct{}
}

var (
	_ pool.Client   = (*Client)(nil)
	_ pool.Releaser = (*Client)(nil)
)

// New returns a Client over r; address maps a worker rank to the
// address a selection names (the worker's host:port; nil: none).
func New(r *localrouter.Router, address func(localrouter.WorkerKey) string) *Client {
	if address == nil {
		address = func(localrouter.WorkerKey) string { return "" }
	}
	return &Client{r: r, address: address, open: make(map[*localTracker]struct{}), reserved: make(map[string]struct{})}
}

func request(p pool.Prompt) localrouter.Request {
	return localrouter.Request{Tokens: p.Tokens, LocalHashes: p.Hashes, BlockSize: p.BlockSize, ISL: p.ISL, LoRAName: p.LoRA}
}

func (l *Client) check(ctx context.Context) error {
	l.mu.Lock()
	closed := l.closed
	l.mu.Unlock()
	if closed {
		return pool.ErrClosed
	}
	return ctx.Err()
}

// allow is the worker filter of an address subset (as the local router's
// service builds it from allowed_addresses).
func (l *Client) allow(allowed []string) func(localrouter.WorkerKey) bool {
	if len(allowed) == 0 {
		return nil
	}
	return func(k localrouter.WorkerKey) bool { return routing.AddressAllowed(allowed, l.address(k)) }
}

// Probe implements Client.
func (l *Client) Probe(ctx context.Context, p pool.Prompt) (routing.Selection, error) {
	if err := l.check(ctx); err != nil {
		return routing.Selection{}, err
	}
	opts := localrouter.BestWorkerOptions{Override: p.Override, Allow: l.allow(p.Allowed)}
	if p.ReserveID != "" && p.ReserveTTL > 0 {
		opts.RequestID, opts.ReserveTTL = p.ReserveID, p.ReserveTTL
	}
	sel, err := l.r.BestWorker(ctx, request(p), opts)
	if err != nil {
		return routing.Selection{}, localError(err)
	}
	if opts.ReserveTTL > 0 {
		l.note(p.ReserveID, true)
	}
	sel.Address = l.address(localrouter.Selected(sel))
	return sel, nil
}

// Loads implements Client.
func (l *Client) Loads(ctx context.Context, p pool.Prompt) ([]routing.Selection, error) {
	if err := l.check(ctx); err != nil {
		return nil, err
	}
	ls, err := l.r.PotentialLoads(ctx, request(p))
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
// its own. A refused commit still returns its pool.Tracker (whose
// PrefillComplete returns the refusal; Free does nothing).
func (l *Client) CommitAsync(ctx context.Context, c pool.Commit, committed func(routing.Selection, error)) (pool.Tracker, error) {
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
	switch {
	case c.WorkerID == "":
		sel, err = l.r.BestWorker(ctx, request(c.Prompt), localrouter.BestWorkerOptions{
			RequestID: c.RequestID, Override: c.Prompt.Override, Allow: l.allow(c.Prompt.Allowed)})
	case c.Reserved:
		l.note(c.RequestID, false)
		sel, err = l.r.Confirm(ctx, c.RequestID, localrouter.WorkerKey{ID: c.WorkerID, DPRank: c.DPRank}, request(c.Prompt))
	default:
		sel, err = l.r.Commit(ctx, c.RequestID, localrouter.WorkerKey{ID: c.WorkerID, DPRank: c.DPRank}, request(c.Prompt))
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
			return nil, pool.ErrClosed
		}
		l.open[t] = struct{}{}
		l.mu.Unlock()
	}
	if committed != nil {
		go committed(sel, err)
	}
	return t, nil
}

// note records (held) or forgets request id's reservation made through l.
func (l *Client) note(id string, held bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.reserved == nil {
		return
	}
	if held {
		l.reserved[id] = struct{}{}
	} else {
		delete(l.reserved, id)
	}
}

// Release implements pool.Releaser: the router's Release, done when it
// returns (a reservation already gone is no error).
func (l *Client) Release(ctx context.Context, id string) error {
	if err := l.check(ctx); err != nil {
		return err
	}
	l.note(id, false)
	if err := l.r.Release(ctx, id); err != nil && !errors.Is(err, localrouter.ErrUnknownRequest) {
		return localError(err)
	}
	return nil
}

// Close implements Client: the open Trackers' requests are freed and the
// reservations released.
func (l *Client) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	open, reserved := l.open, l.reserved
	l.open, l.reserved = nil, nil
	l.mu.Unlock()
	for t := range open {
		t.free()
	}
	for id := range reserved {
		_ = l.r.Release(context.Background(), id)
	}
	return nil
}

// localTracker is a request committed through a Client.
type localTracker struct {
	l  *Client
	id string

	mu      sync.Mutex
	freed   bool
	refused error // the commit's refusal
}

// PrefillComplete implements pool.Tracker: MarkPrefillComplete, once; nothing
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

// Free implements pool.Tracker: Free on the router, once.
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
