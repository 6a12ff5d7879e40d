package subtree

import (
	"context"
	"time"

	"github.com/kvgate/kvgate/pool"
)

// anonFreeTimeout bounds the free of an expired anonymous request below.
const anonFreeTimeout = 10 * time.Second

// ExpireAnonymous frees a request recorded by a unary call (Commit, or
// BestWorker with a request_id) after after unless it was freed (or a
// Track stream attached to it) before, and calls expired for each (nil:
// nobody counts). It is the local router's -anonymous-commit-expiry
// (internal/localrouterd/anonexpiry.go) on the subtree service: without
// mutual TLS anyone who reaches the port may Commit, and such a request
// would hold load below until Free. Requests on a Channel or Track stream
// are not touched: they end with their stream. Call it before serving;
// after <= 0 turns it off.
func (s *Server) ExpireAnonymous(after time.Duration, expired func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.anonAfter, s.anonExpired = after, expired
	if s.anonTimers == nil {
		s.anonTimers = map[string]*time.Timer{}
	}
}

// watchAnon arms id's expiry for tracker t; s.mu is held.
func (s *Server) watchAnon(id string, t pool.Tracker) {
	if s.anonAfter <= 0 || s.anonClosed {
		return
	}
	var timer *time.Timer
	timer = time.AfterFunc(s.anonAfter, func() {
		s.mu.Lock()
		if s.anonTimers[id] != timer || s.manual[id] != t {
			s.mu.Unlock()
			return
		}
		delete(s.anonTimers, id)
		delete(s.manual, id)
		expired := s.anonExpired
		s.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), anonFreeTimeout)
		defer cancel()
		if err := t.Free(ctx); err != nil {
			s.log.Warn("could not free an expired anonymous commit", "request_id", id, "err", err)
		}
		if expired != nil {
			expired()
		}
	})
	s.anonTimers[id] = timer
}

// forgetAnon stops id's expiry; s.mu is held.
func (s *Server) forgetAnon(id string) {
	if t := s.anonTimers[id]; t != nil {
		t.Stop()
		delete(s.anonTimers, id)
	}
}

// stopAnon stops every pending expiry (the service is stopping).
func (s *Server) stopAnon() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.anonClosed = true
	for id, t := range s.anonTimers {
		t.Stop()
		delete(s.anonTimers, id)
	}
}
