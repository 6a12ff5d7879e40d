package server

import (
	"fmt"

	localrouterv1 "github.com/kvgate/kvgate/api/localrouter/v1"
)

// Commits off a Channel stream's reader. A commit without a worker
// (decide-and-commit) runs the router's placement, and a confirmation or a
// commit naming its worker takes the router's locks; on the reader, every
// message read after one waited for it, frees among them (BENCHMARKS.md,
// "Per request: the accounting window under two CPU hogs": lease freed →
// router free p99 0.4–0.8 s). The stream's committer applies its commits in
// arrival order; the reader applies an event at once unless its request's
// commit is still queued or running, in which case the event waits on that
// commit and the committer applies it right after, in arrival order: a
// request's events still follow its commit, and no event waits for another
// request's commit.

// chanCommitQueue is the commits a Channel stream queues for its committer
// before its reader stops reading.
const chanCommitQueue = ChannelMaxInFlight

// chanCommit is a commit read from a Channel stream and not yet applied,
// with the events for its request read meanwhile.
type chanCommit struct {
	id     uint64
	in     *localrouterv1.CommitRequest
	events []chanEvent // guarded by chanStream.mu
}

// chanEvent is an event waiting on its request's commit.
type chanEvent struct {
	id uint64
	in *localrouterv1.ChannelEvent
}

// commitHook, when set (tests only, before any stream), runs before each
// commit of a Channel stream is applied, with the commit's request id.
var commitHook func(requestID string)

// queueCommit hands commit id to the committer (the reader's part). A
// message id naming a request committed or queued on the stream is
// refused: events name commits by id.
func (cs *chanStream) queueCommit(id uint64, in *localrouterv1.CommitRequest, commits chan<- *chanCommit) error {
	cs.mu.Lock()
	_, done := cs.committed[id]
	_, queued := cs.pending[id]
	var c *chanCommit
	if !done && !queued {
		c = &chanCommit{id: id, in: in}
		cs.pending[id] = c
	}
	cs.mu.Unlock()
	if c == nil {
		return cs.fail(id, fmt.Errorf("%w: message id %d already names a request committed on this stream", errInvalidArgument, id))
	}
	select {
	case commits <- c:
		return nil
	case <-cs.ctx.Done():
		return cs.ctx.Err()
	}
}

// queueEvent applies event id at once, or, when its request's commit is
// not yet applied, queues it on that commit (the reader's part).
func (cs *chanStream) queueEvent(id uint64, in *localrouterv1.ChannelEvent) error {
	cs.mu.Lock()
	if c := cs.pending[in.GetCommitId()]; c != nil {
		c.events = append(c.events, chanEvent{id: id, in: in})
		cs.mu.Unlock()
		return nil
	}
	cs.mu.Unlock()
	return cs.event(id, in)
}

// runCommits is the stream's committer: it applies the queued commits in
// order, each followed by the events queued on it. A commit leaves pending
// only once no event waits on it, so the reader applies a request's later
// events only after the earlier ones. Once the stream's context is done
// nothing is applied (the answers could not be sent; freeAll frees what
// was committed).
func (cs *chanStream) runCommits(commits <-chan *chanCommit) {
	for c := range commits {
		if cs.ctx.Err() == nil {
			if commitHook != nil {
				commitHook(c.in.GetRequestId())
			}
			_ = cs.commit(c.id, c.in) // fails only when the stream is gone
		}
		for {
			cs.mu.Lock()
			evs := c.events
			c.events = nil
			if len(evs) == 0 || cs.ctx.Err() != nil {
				delete(cs.pending, c.id)
				cs.mu.Unlock()
				break
			}
			cs.mu.Unlock()
			for _, e := range evs {
				_ = cs.event(e.id, e.in)
			}
		}
	}
}
