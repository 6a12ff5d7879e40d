package extprocclient

import (
	"context"
	"sync"
)

// queue is an unbounded FIFO with a blocking, cancellable pop. The filter
// loop never blocks on its outputs, as Envoy's dispatcher never blocks on a
// codec; readers pace themselves.
type queue[T any] struct {
	mu     sync.Mutex
	items  []T
	err    error // set by close; returned once items are drained
	closed bool
	ready  chan struct{} // has a token while items or closed
}

func newQueue[T any]() *queue[T] {
	return &queue[T]{ready: make(chan struct{}, 1)}
}

func (q *queue[T]) signal() {
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// push appends v; it is dropped after close.
func (q *queue[T]) push(v T) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return
	}
	q.items = append(q.items, v)
	q.signal()
}

// close ends the queue: pop returns the queued items, then err. Only the
// first close counts.
func (q *queue[T]) close(err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return
	}
	q.closed, q.err = true, err
	q.signal()
}

// pop blocks until an item is available, the queue is closed (returning its
// error), or ctx ends.
func (q *queue[T]) pop(ctx context.Context) (T, error) {
	for {
		q.mu.Lock()
		if len(q.items) > 0 {
			v := q.items[0]
			var zero T
			q.items[0] = zero
			q.items = q.items[1:]
			if len(q.items) > 0 || q.closed {
				q.signal()
			}
			q.mu.Unlock()
			return v, nil
		}
		if q.closed {
			err := q.err
			q.signal()
			q.mu.Unlock()
			var zero T
			return zero, err
		}
		q.mu.Unlock()
		select {
		case <-q.ready:
		case <-ctx.Done():
			var zero T
			return zero, ctx.Err()
		}
	}
}

// tryPop returns the next item without blocking; ok is false when none is
// queued.
func (q *queue[T]) tryPop() (v T, ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.items) == 0 {
		return v, false
	}
	v = q.items[0]
	var zero T
	q.items[0] = zero
	q.items = q.items[1:]
	return v, true
}
