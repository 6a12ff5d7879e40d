package pool

import (
	"context"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/localrouter"
	"github.com/kvgate/kvgate/localrouter/client"
)

// ChannelDialer returns a Dialer like GRPCDialer whose clients multiplex
// probes, commits and lifecycle events over one Channel stream per local
// router (localrouter/client.Channel) instead of a call per probe and a
// Track stream per request. Break-means-free holds per stream: when the
// stream breaks, the router frees every request committed on it. Close
// ends the stream.
//
// A local router without the Channel RPC (an older version) answers
// UNIMPLEMENTED: the client then falls back to the unary probe and the
// per-request Track stream for good (the probe that found out is retried
// unary; a commit that found out is refused, as a commit to a router that
// failed is).
func ChannelDialer(opts ...grpc.DialOption) Dialer {
	dial := GRPCDialer(opts...)
	return func(addr string) (Client, error) {
		c, err := dial(addr)
		if err != nil {
			return nil, err
		}
		g, ok := c.(*grpcClient)
		if !ok {
			return c, nil // not a client the channel can share: unary
		}
		return &channelClient{grpcClient: g, ch: g.c.Channel(client.ChannelOptions{})}, nil
	}
}

// channelClient is a Client over a localrouter/client.Channel.
type channelClient struct {
	*grpcClient
	ch    *client.Channel
	unary atomic.Bool // the router has no Channel RPC
}

// unimplemented reports err as the router's UNIMPLEMENTED (and remembers).
func (c *channelClient) unimplemented(err error) bool {
	if status.Code(err) == codes.Unimplemented {
		c.unary.Store(true)
		return true
	}
	return false
}

// perCall reports whether a call must go unary: the router has no Channel
// RPC, or the call carries a hop count (HopsMetadata), which rides on each
// call's metadata and the channel's messages have no room for (a subtree
// router's calls made for its parent; docs/hierarchy.md).
func (c *channelClient) perCall(ctx context.Context) bool {
	return c.unary.Load() || Hops(ctx) > 0
}

func (c *channelClient) Probe(ctx context.Context, p Prompt) (routing.Selection, error) {
	if c.perCall(ctx) {
		return c.grpcClient.Probe(ctx, p)
	}
	sel, err := c.ch.BestWorker(ctx, p.client(), client.BestWorkerOptions{Override: p.Override, AllowedAddresses: p.Allowed})
	if err != nil && c.unimplemented(err) {
		return c.grpcClient.Probe(ctx, p)
	}
	sel.Router = c.addr
	return sel, err
}

func (c *channelClient) CommitAsync(ctx context.Context, cm Commit, committed func(routing.Selection, error)) (Tracker, error) {
	if c.perCall(ctx) {
		return c.grpcClient.CommitAsync(ctx, cm, committed)
	}
	listen := func(sel routing.Selection, err error) {
		if err != nil {
			c.unimplemented(err)
		}
		if committed != nil {
			committed(sel, err)
		}
	}
	t, err := c.ch.CommitAsync(ctx, cm.RequestID, localrouter.WorkerKey{ID: cm.WorkerID, DPRank: cm.DPRank}, cm.Prompt.client(), listen)
	if err != nil {
		if c.unimplemented(err) {
			return c.grpcClient.CommitAsync(ctx, cm, committed)
		}
		return nil, err
	}
	return t, nil
}

func (c *channelClient) Close() error {
	_ = c.ch.Close()
	return c.grpcClient.Close()
}
