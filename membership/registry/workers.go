package registry

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvgate/kvgate/membership"
)

// Handler is told about workers joining and leaving.
//
// Calls come from the Watcher's goroutine, one at a time, in etcd revision
// order; they must not block for long.
type Handler interface {
	// WorkerUp: the worker joined, or its registration changed.
	WorkerUp(info membership.WorkerInfo)
	// WorkerDown: the worker's key was deleted or its lease expired.
	WorkerDown(id string)
}

// WatcherOptions configure a Watcher.
type WatcherOptions struct {
	// BlockSize, when positive, refuses workers registered with another
	// block size: their events could not be indexed.
	BlockSize int
	// Logger (default slog.Default()).
	Logger *slog.Logger
}

// Watcher follows the workers of one pool in etcd and keeps the current set
// as an immutable snapshot that readers load without locking.
type Watcher struct {
	cli    *clientv3.Client
	prefix string
	opts   WatcherOptions
	h      Handler
	log    *slog.Logger

	snap     atomic.Pointer[map[string]membership.WorkerInfo]
	syncOnce sync.Once
	synced   chan struct{}
}

// NewWatcher returns a Watcher of pool's workers that tells h. Run starts it.
func NewWatcher(cli *clientv3.Client, pool string, h Handler, opts WatcherOptions) *Watcher {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	w := &Watcher{
		cli: cli, prefix: membership.WorkersPrefix(pool), opts: opts, h: h,
		log:    log.With("component", "membership", "pool", pool),
		synced: make(chan struct{}),
	}
	empty := map[string]membership.WorkerInfo{}
	w.snap.Store(&empty)
	return w
}

// Run follows the workers until ctx ends (see WatchPrefix).
func (w *Watcher) Run(ctx context.Context) error {
	return WatchPrefix(ctx, w.cli, w.prefix, (*workerSink)(w), w.log)
}

// Synced is closed once the first listing has been handed to the Handler.
func (w *Watcher) Synced() <-chan struct{} { return w.synced }

// Worker returns the registration of worker id.
func (w *Watcher) Worker(id string) (membership.WorkerInfo, bool) {
	info, ok := (*w.snap.Load())[id]
	return info, ok
}

// Workers returns the current registrations, sorted by id.
func (w *Watcher) Workers() []membership.WorkerInfo {
	m := *w.snap.Load()
	out := make([]membership.WorkerInfo, 0, len(m))
	for _, id := range slices.Sorted(maps.Keys(m)) {
		out = append(out, m[id])
	}
	return out
}

// workerSink turns key changes into Handler calls and snapshot updates.
type workerSink Watcher

func (s *workerSink) parse(key string, value []byte) (membership.WorkerInfo, bool) {
	id, ok := keyID(s.prefix, key)
	if !ok {
		s.log.Warn("ignoring key that is not a worker id", "key", key)
		return membership.WorkerInfo{}, false
	}
	info, err := membership.ParseWorkerInfo(value)
	switch {
	case err != nil:
		s.log.Warn("ignoring worker with an invalid registration", "key", key, "err", err)
	case info.ID != id:
		s.log.Warn("ignoring worker whose id differs from its key", "key", key, "id", info.ID)
	case s.opts.BlockSize > 0 && info.BlockSize != s.opts.BlockSize:
		s.log.Error("ignoring worker with another block size", "worker", id, "worker_block_size", info.BlockSize, "pool_block_size", s.opts.BlockSize)
	default:
		return info, true
	}
	return membership.WorkerInfo{}, false
}

func (s *workerSink) Reset(kvs map[string][]byte) {
	old := *s.snap.Load()
	next := make(map[string]membership.WorkerInfo, len(kvs))
	for k, v := range kvs {
		if info, ok := s.parse(k, v); ok {
			next[info.ID] = info
		}
	}
	s.snap.Store(&next)
	for _, id := range slices.Sorted(maps.Keys(old)) {
		if _, ok := next[id]; !ok {
			s.log.Info("worker left", "worker", id)
			s.h.WorkerDown(id)
		}
	}
	for _, id := range slices.Sorted(maps.Keys(next)) {
		if prev, ok := old[id]; !ok || prev != next[id] {
			s.log.Info("worker joined", "worker", id, "address", next[id].Address, "dp_size", next[id].DPSize)
			s.h.WorkerUp(next[id])
		}
	}
	s.syncOnce.Do(func() { close(s.synced) })
}

func (s *workerSink) Put(key string, value []byte) {
	info, ok := s.parse(key, value)
	if !ok {
		// A registration that became invalid is a worker that left.
		if id, isID := keyID(s.prefix, key); isID {
			s.Delete(s.prefix + id)
		}
		return
	}
	old := *s.snap.Load()
	if prev, had := old[info.ID]; had && prev == info {
		return
	}
	next := maps.Clone(old)
	next[info.ID] = info
	s.snap.Store(&next)
	s.log.Info("worker joined", "worker", info.ID, "address", info.Address, "dp_size", info.DPSize)
	s.h.WorkerUp(info)
}

func (s *workerSink) Delete(key string) {
	id, ok := keyID(s.prefix, key)
	if !ok {
		return
	}
	old := *s.snap.Load()
	if _, had := old[id]; !had {
		return
	}
	next := maps.Clone(old)
	delete(next, id)
	s.snap.Store(&next)
	s.log.Info("worker left", "worker", id)
	s.h.WorkerDown(id)
}
