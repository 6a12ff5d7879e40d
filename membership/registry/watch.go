package registry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Sink receives the state of an etcd prefix from WatchPrefix.
//
// Calls are made from one goroutine, in revision order, and must not block
// for long. Keys are full etcd keys.
type Sink interface {
	// Reset replaces the whole state: called after the first listing and
	// after every re-listing (a watch that was compacted or broke).
	Reset(kvs map[string][]byte)
	// Put reports a key created or changed.
	Put(key string, value []byte)
	// Delete reports a key deleted, or expired with its lease.
	Delete(key string)
}

// retryDelay is the pause before re-listing after an etcd error.
const retryDelay = 500 * time.Millisecond

// WatchPrefix follows every key under prefix until ctx ends, then returns
// nil. It lists the prefix, hands the listing to s.Reset, and watches from
// the listing's revision + 1, so no change between the two is lost or seen
// twice. When the watch fails (compaction, lost leader, closed client) it
// lists again. It returns an error only for a client that is closed.
func WatchPrefix(ctx context.Context, cli *clientv3.Client, prefix string, s Sink, log *slog.Logger) error {
	for {
		err := watchOnce(ctx, cli, prefix, s)
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, context.Canceled) && cli.Ctx().Err() != nil {
			return fmt.Errorf("watch %s: etcd client closed", prefix)
		}
		log.Warn("etcd watch interrupted; listing again", "prefix", prefix, "err", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(retryDelay):
		}
	}
}

func watchOnce(ctx context.Context, cli *clientv3.Client, prefix string, s Sink) error {
	getCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	resp, err := cli.Get(getCtx, prefix, clientv3.WithPrefix())
	cancel()
	if err != nil {
		return fmt.Errorf("list %s: %w", prefix, err)
	}
	kvs := make(map[string][]byte, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		kvs[string(kv.Key)] = kv.Value
	}
	s.Reset(kvs)

	wctx, wcancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer wcancel()
	wch := cli.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
	for wr := range wch {
		if err := wr.Err(); err != nil {
			return fmt.Errorf("watch %s: %w", prefix, err)
		}
		for _, ev := range wr.Events {
			switch ev.Type {
			case mvccpb.PUT:
				s.Put(string(ev.Kv.Key), ev.Kv.Value)
			case mvccpb.DELETE:
				s.Delete(string(ev.Kv.Key))
			}
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return errors.New("watch channel closed")
}

// keyID returns the last path element of key under prefix.
func keyID(prefix, key string) (string, bool) {
	id, ok := strings.CutPrefix(key, prefix)
	return id, ok && id != "" && !strings.Contains(id, "/")
}
