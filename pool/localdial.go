package pool

import (
	"context"
	"fmt"
	"strings"
)

// LocalScheme prefixes the addresses LocalDialer dials: "local:NAME".
const LocalScheme = "local:"

// LocalAddress is the address of the in-process client named name.
func LocalAddress(name string) string { return LocalScheme + name }

// LocalDialer returns a Dialer of the clients of clients by name: address
// "local:NAME" dials clients[NAME]. Any Client works (localrouter/inproc's, or
// another in-process client). The dialed Client's Close does nothing: the clients
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

// Release implements Releaser when the shared client does (the replay's
// in-process client): a wrapper must not hide it, or reservations would
// wait for their TTL.
func (s sharedClient) Release(ctx context.Context, id string) error {
	if r, ok := s.Client.(Releaser); ok {
		return r.Release(ctx, id)
	}
	return nil
}

// ReleaseOrdered implements OrderedReleaser as the shared client does,
// else as Release.
func (s sharedClient) ReleaseOrdered(ctx context.Context, id string) error {
	if r, ok := s.Client.(OrderedReleaser); ok {
		return r.ReleaseOrdered(ctx, id)
	}
	return s.Release(ctx, id)
}
