package pool

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/kvgate/kvgate/api/routing"
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
	// hops are the channels of calls carrying a hop count (HopsMetadata),
	// one per count, opened on first use: the count rides on the stream's
	// metadata, so every message of a stream has the same (a subtree
	// router's calls made for its parent; docs/hierarchy.md).
	hopsMu sync.Mutex
	hops   map[int]*client.Channel
}

// channel is the Channel of ctx's hop count.
func (c *channelClient) channel(ctx context.Context) *client.Channel {
	n := Hops(ctx)
	if n == 0 {
		return c.ch
	}
	c.hopsMu.Lock()
	defer c.hopsMu.Unlock()
	ch := c.hops[n]
	if ch == nil {
		if c.hops == nil {
			c.hops = map[int]*client.Channel{}
		}
		ch = c.grpcClient.c.Channel(client.ChannelOptions{Metadata: metadata.Pairs(HopsMetadata, strconv.Itoa(n))})
		c.hops[n] = ch
	}
	return ch
}

// unimplemented reports err as the router's UNIMPLEMENTED (and remembers).
func (c *channelClient) unimplemented(err error) bool {
	if status.Code(err) == codes.Unimplemented {
		c.unary.Store(true)
		return true
	}
	return false
}

func (c *channelClient) Probe(ctx context.Context, p Prompt) (routing.Selection, error) {
	if c.unary.Load() {
		return c.grpcClient.Probe(ctx, p)
	}
	sel, err := c.channel(ctx).BestWorker(ctx, p.client(), p.probeOptions())
	if err != nil && c.unimplemented(err) {
		return c.grpcClient.Probe(ctx, p)
	}
	sel.Router = c.addr
	return sel, err
}

func (c *channelClient) CommitAsync(ctx context.Context, cm Commit, committed func(routing.Selection, error)) (Tracker, error) {
	if c.unary.Load() {
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
	t, err := c.channel(ctx).CommitAsyncWith(ctx, cm.RequestID, routing.WorkerKey{ID: cm.WorkerID, DPRank: cm.DPRank}, cm.Prompt.client(), cm.options(), listen)
	if err != nil {
		if c.unimplemented(err) {
			return c.grpcClient.CommitAsync(ctx, cm, committed)
		}
		return nil, err
	}
	return t, nil
}

// Release implements Releaser: a release message on the channel of ctx's
// hop count (the one the probe rode), not waited for.
func (c *channelClient) Release(ctx context.Context, id string) error {
	if c.unary.Load() {
		return c.grpcClient.Release(ctx, id)
	}
	return c.channel(ctx).Release(ctx, id)
}

// ReleaseOrdered implements OrderedReleaser: the channel handles its
// messages in order, so the release message is enough; unary calls wait.
func (c *channelClient) ReleaseOrdered(ctx context.Context, id string) error {
	if c.unary.Load() {
		return c.grpcClient.ReleaseOrdered(ctx, id)
	}
	return c.channel(ctx).Release(ctx, id)
}

func (c *channelClient) Close() error {
	_ = c.ch.Close()
	c.hopsMu.Lock()
	for _, ch := range c.hops {
		_ = ch.Close()
	}
	c.hopsMu.Unlock()
	return c.grpcClient.Close()
}
