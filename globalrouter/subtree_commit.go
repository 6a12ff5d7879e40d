package globalrouter

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"

	localrouterv1 "github.com/kvgate/kvgate/api/localrouter/v1"
	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/pool"
)

// Commit records a request below this router and waits for the owning
// local router's answer: on the worker c names (qualified, "pool/worker"),
// or, with no worker, on the worker Probe would choose (decide and commit;
// the next-ranked pools are tried when a commit is refused). The Tracker
// is the owning pool's: it must be freed.
func (s *Subtree) Commit(ctx context.Context, c pool.Commit) (pool.Tracker, routing.Selection, error) {
	if c.RequestID == "" {
		return nil, routing.Selection{}, treeErr(codes.InvalidArgument, localrouterv1.ReasonEmptyRequestID, routing.ErrEmptyRequestID, "subtree commit: no request id")
	}
	ctx, st, err := s.enter(ctx)
	if err != nil {
		return nil, routing.Selection{}, err
	}
	defer st.release()
	if c.WorkerID != "" {
		pe, worker, err := s.owner(st, c)
		if err != nil {
			return nil, routing.Selection{}, err
		}
		t, sel, err := pe.p.Commit(ctx, "", pool.Commit{RequestID: c.RequestID, WorkerID: worker, DPRank: c.DPRank, Prompt: forPool(c.Prompt, pe)})
		if err != nil {
			return nil, routing.Selection{}, err
		}
		return t, qualify(pe.cfg.Name, withBlockSize(sel, pe)), nil
	}
	if c.DPRank != 0 {
		return nil, routing.Selection{}, treeErr(codes.InvalidArgument, localrouterv1.ReasonInvalidArgument, nil, "subtree commit names dp_rank %d but no worker_id", c.DPRank)
	}
	eligible, err := s.eligible(st, c.Prompt)
	if err != nil {
		return nil, routing.Selection{}, err
	}
	ranked, results, err := s.ranked(ctx, st, eligible, c.Prompt, c.RequestID)
	if err != nil {
		return nil, routing.Selection{}, err
	}
	var refused []error
	for _, cand := range ranked {
		pe := st.byName[cand.Pool]
		if pe == nil {
			continue
		}
		t, sel, err := pe.p.Commit(ctx, cand.Probe.Router, pool.Commit{RequestID: c.RequestID, WorkerID: cand.Probe.WorkerID, DPRank: cand.Probe.DPRank, Prompt: forPool(c.Prompt, pe)})
		if err != nil {
			if ctx.Err() != nil {
				return nil, routing.Selection{}, ctx.Err()
			}
			refused = append(refused, err)
			continue
		}
		cand.Probe = withBlockSize(sel, pe)
		cand.Probe.ISL = c.Prompt.ISL
		return t, s.answer(st, cand, results), nil
	}
	return nil, routing.Selection{}, treeErr(codes.Unavailable, "", errors.Join(refused...), "subtree: every ranked pool refused the commit: %v", errors.Join(refused...))
}

func withBlockSize(sel routing.Selection, pe *poolEntry) routing.Selection {
	if sel.BlockSize == 0 {
		sel.BlockSize = pe.cfg.BlockSize
	}
	return sel
}

// owner is the pool of c's qualified worker id and the worker's own id.
func (s *Subtree) owner(st *state, c pool.Commit) (*poolEntry, string, error) {
	name, worker, ok := SplitWorker(c.WorkerID)
	if !ok {
		return nil, "", treeErr(codes.NotFound, localrouterv1.ReasonUnknownWorker, routing.ErrUnknownWorker,
			"worker %q: a subtree's worker ids are pool/worker", c.WorkerID)
	}
	pe := st.byName[name]
	if pe == nil {
		return nil, "", treeErr(codes.NotFound, localrouterv1.ReasonUnknownWorker, routing.ErrUnknownWorker,
			"worker %q: the subtree has no pool %q", c.WorkerID, name)
	}
	return pe, worker, nil
}

// CommitAsync implements pool.Client: a commit on a named worker is
// forwarded to its pool, pipelined as that pool's commits are; one without
// a worker decides and commits (Commit) before committed is told.
func (s *Subtree) CommitAsync(ctx context.Context, c pool.Commit, committed func(routing.Selection, error)) (pool.Tracker, error) {
	tell := func(sel routing.Selection, err error) {
		if committed != nil {
			committed(sel, err)
		}
	}
	if c.WorkerID == "" {
		t, sel, err := s.Commit(ctx, c)
		if err != nil {
			return nil, err
		}
		go tell(sel, nil)
		return t, nil
	}
	ctx, st, err := s.enter(ctx)
	if err != nil {
		return nil, err
	}
	defer st.release()
	pe, worker, err := s.owner(st, c)
	if err != nil {
		return nil, err
	}
	return pe.p.CommitAsync(ctx, "", pool.Commit{RequestID: c.RequestID, WorkerID: worker, DPRank: c.DPRank, Prompt: forPool(c.Prompt, pe)},
		func(sel routing.Selection, err error) {
			if err == nil {
				sel = qualify(pe.cfg.Name, withBlockSize(sel, pe))
			}
			tell(sel, err)
		})
}
