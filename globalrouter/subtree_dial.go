package globalrouter

import (
	"context"

	"google.golang.org/grpc/codes"

	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/pool"
)

// SubtreeDialer is a pool.Dialer of in-process subtree clients: a pool
// whose static router address (host:port, e.g. "region-a:0") lookup knows
// gets that Router's Subtree, looked up at each call; other addresses go
// to fallback. With a nil fallback every address is a subtree router,
// looked up at each call (so routers may name each other before all are
// built; an address nobody answers is UNAVAILABLE).
func SubtreeDialer(lookup func(addr string) *Router, fallback pool.Dialer) pool.Dialer {
	return func(addr string) (pool.Client, error) {
		if lookup(addr) == nil && fallback != nil {
			return fallback(addr)
		}
		return &lazySubtree{addr: addr, lookup: lookup}, nil
	}
}

// lazySubtree is the Subtree of the Router at addr, found at each call.
type lazySubtree struct {
	addr   string
	lookup func(string) *Router
}

func (l *lazySubtree) get() (*Subtree, error) {
	r := l.lookup(l.addr)
	if r == nil {
		return nil, treeErr(codes.Unavailable, "", nil, "no subtree router at %q", l.addr)
	}
	return r.Subtree(), nil
}

func (l *lazySubtree) Probe(ctx context.Context, p pool.Prompt) (routing.Selection, error) {
	s, err := l.get()
	if err != nil {
		return routing.Selection{}, err
	}
	return s.Probe(ctx, p)
}

func (l *lazySubtree) Loads(ctx context.Context, p pool.Prompt) ([]routing.Selection, error) {
	s, err := l.get()
	if err != nil {
		return nil, err
	}
	return s.Loads(ctx, p)
}

func (l *lazySubtree) CommitAsync(ctx context.Context, c pool.Commit, committed func(routing.Selection, error)) (pool.Tracker, error) {
	s, err := l.get()
	if err != nil {
		return nil, err
	}
	return s.CommitAsync(ctx, c, committed)
}

func (l *lazySubtree) Close() error { return nil }
