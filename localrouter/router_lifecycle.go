package localrouter

import (
	"context"
	"fmt"

	"github.com/kvgate/kvgate/api/routing"
)

// Commit records request id on a worker the caller chose.
func (r *Router) Commit(ctx context.Context, id string, worker WorkerKey, req Request) (routing.Selection, error) {
	if id == "" {
		return routing.Selection{}, ErrEmptyRequestID
	}
	return r.BestWorker(ctx, req, BestWorkerOptions{RequestID: id, Worker: &worker})
}

// MarkPrefillComplete marks request id's prefill done. Idempotent; an
// unknown id returns ErrUnknownRequest (and changes nothing).
func (r *Router) MarkPrefillComplete(ctx context.Context, id string) error {
	if err := r.check(); err != nil {
		return err
	}
	if !r.active.MarkPrefillComplete(id) {
		return fmt.Errorf("%w: %q", ErrUnknownRequest, id)
	}
	r.chain.timing.cal.firstToken(id, r.clock())
	return nil
}

// Free forgets request id. Idempotent; an unknown id returns
// ErrUnknownRequest (and changes nothing).
func (r *Router) Free(ctx context.Context, id string) error {
	if err := r.check(); err != nil {
		return err
	}
	if !r.active.Free(id) {
		return fmt.Errorf("%w: %q", ErrUnknownRequest, id)
	}
	r.chain.timing.cal.forget(id)
	return nil
}
