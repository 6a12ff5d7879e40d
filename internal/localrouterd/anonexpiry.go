package localrouterd

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	localrouterv1 "github.com/kvgate/kvgate/api/localrouter/v1"
	"github.com/kvgate/kvgate/localrouter"
	"github.com/kvgate/kvgate/localrouter/server"
)

// DefaultAnonymousCommitExpiry is -anonymous-commit-expiry's default.
const DefaultAnonymousCommitExpiry = 30 * time.Second

// anonExpiry bounds the load an unauthenticated caller can hold (issue 27
// item 3). On a router without mutual TLS (no caller is identified: anyone
// who reaches the port may Commit), a request recorded by a unary call — Commit, or a
// BestWorker with request_id — is freed after -anonymous-commit-expiry
// unless freed before, instead of the router's request_expiry (5 minutes).
// Requests recorded on a stream (Channel, Track: what kvgate's global
// router uses) are not touched: they end with their stream, whose
// keepalive ends it when the caller vanishes. Under mutual TLS (callers
// identified by certificate, -authorized-clients or not), unary commits
// keep request_expiry.
type anonExpiry struct {
	after  time.Duration
	router *localrouter.Router
	srv    *server.Server
	freed  prometheus.Counter

	mu     sync.Mutex
	timers map[string]*time.Timer
	closed bool
}

func newAnonExpiry(after time.Duration, router *localrouter.Router, srv *server.Server, reg prometheus.Registerer) (*anonExpiry, error) {
	a := &anonExpiry{after: after, router: router, srv: srv, timers: map[string]*time.Timer{},
		freed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvgate_localrouter_anonymous_expired_total",
			Help: "Requests committed by an unauthenticated unary call (Commit, BestWorker with request_id) and freed by -anonymous-commit-expiry.",
		})}
	return a, reg.Register(a.freed)
}

// unary watches the calls that record a request by a unary call, and
// forgets one freed by Free.
func (a *anonExpiry) unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		resp, err := h(ctx, req)
		if err != nil {
			return resp, err
		}
		switch info.FullMethod {
		case localrouterv1.LocalRouter_Commit_FullMethodName:
			a.watch(req.(*localrouterv1.CommitRequest).GetRequestId())
		case localrouterv1.LocalRouter_BestWorker_FullMethodName:
			if id := req.(*localrouterv1.BestWorkerRequest).GetRequestId(); id != "" {
				a.watch(id)
			}
		case localrouterv1.LocalRouter_Free_FullMethodName:
			a.forget(req.(*localrouterv1.FreeRequest).GetRequestId())
		}
		return resp, err
	}
}

func (a *anonExpiry) watch(id string) {
	key, ok := a.router.Active().Has(id)
	if !ok {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return
	}
	if old := a.timers[id]; old != nil {
		old.Stop()
	}
	var t *time.Timer
	t = time.AfterFunc(a.after, func() {
		a.mu.Lock()
		if a.closed || a.timers[id] != t {
			a.mu.Unlock()
			return
		}
		delete(a.timers, id)
		a.mu.Unlock()
		// Still the request this call recorded: free it as Free does
		// (replica sync told too).
		if k, ok := a.router.Active().Has(id); ok && k == key {
			if _, err := a.srv.Free(context.Background(), &localrouterv1.FreeRequest{RequestId: id}); err == nil {
				a.freed.Inc()
			}
		}
	})
	a.timers[id] = t
}

func (a *anonExpiry) forget(id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if t := a.timers[id]; t != nil {
		t.Stop()
		delete(a.timers, id)
	}
}

// close stops every pending expiry (the router is stopping).
func (a *anonExpiry) close() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.closed = true
	for id, t := range a.timers {
		t.Stop()
		delete(a.timers, id)
	}
}
