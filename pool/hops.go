package pool

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"google.golang.org/grpc/metadata"

	"github.com/kvgate/kvgate/api/routing"
)

// HopsMetadata is the gRPC metadata key that carries a call's hop count in
// a tree of global routers (docs/hierarchy.md): how many global routers
// answering for their subtree the call has already passed through. A
// router that answers for its subtree refuses a call whose count reached
// its maximum depth, and forwards the calls it makes for it with the count
// plus one. Local routers ignore it.
const HopsMetadata = "x-kvgate-hops"

// WithHops returns ctx whose outgoing calls carry hop count n (gRPC
// metadata HopsMetadata; the in-process subtree client reads it too). n 0
// removes nothing and adds nothing: the count of a call without it is 0.
func WithHops(ctx context.Context, n int) context.Context {
	if n <= 0 {
		return ctx
	}
	md, _ := metadata.FromOutgoingContext(ctx)
	md = md.Copy()
	md.Set(HopsMetadata, strconv.Itoa(n))
	return metadata.NewOutgoingContext(ctx, md)
}

// Hops is the hop count ctx's outgoing calls carry (WithHops), 0 when none.
func Hops(ctx context.Context) int {
	n, _ := parseHops(metadata.ValueFromOutgoingContext(ctx, HopsMetadata))
	return n
}

// IncomingHops is the hop count of the call ctx serves (a gRPC server's
// incoming metadata), 0 when none; a malformed value is an error naming it.
func IncomingHops(ctx context.Context) (int, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	return parseHops(md.Get(HopsMetadata))
}

func parseHops(vs []string) (int, error) {
	if len(vs) == 0 {
		return 0, nil
	}
	v := vs[len(vs)-1]
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || n > 1<<16 {
		return 0, fmt.Errorf("metadata %s: %q is not a hop count (an integer 0..65536)", HopsMetadata, v)
	}
	return n, nil
}

// Loads asks one of the pool's local routers for every worker rank's
// potential load for a prompt (PotentialLoads, under the probe deadline),
// without changing any state. The circuits are consulted but, unlike
// Probe's, not charged: Loads is an operator's or a parent router's
// question, not the request path.
func (p *Pool) Loads(ctx context.Context, pr Prompt) ([]routing.Selection, error) {
	c, err := p.pick("")
	if err != nil {
		return nil, fmt.Errorf("pool %q: %w", p.cfg.Name, err)
	}
	timeout := p.timeout
	if timeout <= 0 {
		timeout = 250 * time.Millisecond
	}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	loads, err := c.r.Loads(pctx, pr)
	cancel()
	c.circuit.release()
	if err != nil {
		return nil, &ProbeError{Pool: p.cfg.Name, Router: c.addr, Request: requestFault(err), Timeout: timedOut(err), Err: err}
	}
	for i := range loads {
		loads[i].Router = c.addr
	}
	return loads, nil
}
