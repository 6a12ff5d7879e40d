package localrouterd

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/kvevents"
	"github.com/kvgate/kvgate/localrouter/client"
	"github.com/kvgate/kvgate/membership"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testenv.IgnoreLeaks()...)
}

const testTimeout = 30 * time.Second

// env is one embedded etcd and NATS shared by the services of a test.
type env struct {
	t         *testing.T
	endpoints []string
	etcd      *clientv3.Client
	natsURL   string
	nc        *nats.Conn
}

func newEnv(t *testing.T) *env {
	t.Helper()
	endpoints, cli := testenv.StartEtcd(t)
	url := testenv.StartNATS(t)
	return &env{t: t, endpoints: endpoints, etcd: cli, natsURL: url, nc: testenv.ConnectNATS(t, url)}
}

var poolSeq atomic.Int64

// testConfig is a service config on loopback with free ports.
func (e *env) config(pool string) Config {
	c := DefaultConfig()
	c.Pool = pool
	c.RouterID = fmt.Sprintf("r%d", poolSeq.Add(1))
	c.GRPCAddr = "127.0.0.1:0"
	c.MetricsAddr = "127.0.0.1:0"
	c.Etcd = e.endpoints
	c.NATS = e.natsURL
	c.RegisterTTL = 5 * time.Second
	return c
}

func testLogger(t *testing.T) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(b []byte) (int, error) { w.t.Log(string(b)); return len(b), nil }

// start starts a service and a client of it; both stop with the test.
func (e *env) start(cfg Config) (*Service, *client.Client, *prometheus.Registry) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	reg := prometheus.NewRegistry()
	svc, err := Start(ctx, cfg, Deps{Logger: testLogger(e.t), Registry: reg})
	if err != nil {
		e.t.Fatalf("start service: %v", err)
	}
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		defer cancel()
		if err := svc.Close(ctx); err != nil {
			e.t.Errorf("close service: %v", err)
		}
	})
	c, err := client.Dial(svc.GRPCAddr(), nil)
	if err != nil {
		e.t.Fatalf("dial: %v", err)
	}
	e.t.Cleanup(func() { c.Close() })
	return svc, c, reg
}

// putWorker registers a worker in etcd, under a lease of ttl when positive.
func (e *env) putWorker(pool string, w membership.WorkerInfo, ttl int64) clientv3.LeaseID {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	b, _ := json.Marshal(w)
	var opts []clientv3.OpOption
	var lease clientv3.LeaseID
	if ttl > 0 {
		g, err := e.etcd.Grant(ctx, ttl)
		if err != nil {
			e.t.Fatalf("grant: %v", err)
		}
		lease = g.ID
		opts = append(opts, clientv3.WithLease(g.ID))
	}
	if _, err := e.etcd.Put(ctx, membership.WorkersPrefix(pool)+w.ID, string(b), opts...); err != nil {
		e.t.Fatalf("put worker: %v", err)
	}
	return lease
}

func (e *env) deleteWorker(pool, id string) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if _, err := e.etcd.Delete(ctx, membership.WorkersPrefix(pool)+id); err != nil {
		e.t.Fatalf("delete worker: %v", err)
	}
}

func worker(id string) membership.WorkerInfo {
	return membership.WorkerInfo{ID: id, Address: "127.0.0.1:1" + id[len(id)-1:] + "000", DPSize: 1, BlockSize: 16, Model: "m"}
}

// waitWorkers polls until the service's router has exactly ids.
func waitWorkers(t *testing.T, svc *Service, ids ...string) {
	t.Helper()
	testenv.Eventually(t, testTimeout, func() (string, bool) {
		got := map[string]bool{}
		for _, k := range svc.Router().Workers() {
			got[k.ID] = true
		}
		if len(got) != len(ids) {
			return testenv.Errorf("workers %v, want %v", got, ids)
		}
		for _, id := range ids {
			if !got[id] {
				return testenv.Errorf("workers %v, want %v", got, ids)
			}
		}
		return "", true
	})
}

// seqTokens returns n tokens starting at start.
func seqTokens(start, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(start + i)
	}
	return out
}

// testPublisher is a worker's KV event publisher under the test's
// control: it publishes events with the ids it is told (so tests make
// gaps), keeps the blocks it published, and answers dump requests with
// them (kvevents.DumpReply).
type testPublisher struct {
	t      *testing.T
	nc     *nats.Conn
	pool   string
	worker string
	sub    *nats.Subscription

	mu     sync.Mutex
	lastID uint64
	stored []kvevents.RouterEvent // what a dump returns
	dumps  int
}

func newTestPublisher(t *testing.T, nc *nats.Conn, pool, worker string) *testPublisher {
	p := &testPublisher{t: t, nc: nc, pool: pool, worker: worker}
	sub, err := nc.Subscribe(kvevents.DumpSubject(pool, worker), func(m *nats.Msg) {
		p.mu.Lock()
		reply := kvevents.DumpReply{WorkerID: worker, Ranks: []kvevents.DumpRank{{DPRank: 0, LastEventID: p.lastID}}}
		for _, ev := range p.stored {
			ev.EventID = p.lastID
			reply.Events = append(reply.Events, ev)
		}
		p.dumps++
		p.mu.Unlock()
		b, err := kvevents.EncodeDumpReply(reply)
		if err != nil {
			t.Errorf("encode dump: %v", err)
			return
		}
		_ = m.Respond(b)
	})
	if err != nil {
		t.Fatalf("subscribe dump: %v", err)
	}
	p.sub = sub
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return p
}

// store records a stored chain of tokens (whole blocks of 16) under parent
// (engine hashes are base+i) and, unless skip, publishes it with id.
func (p *testPublisher) store(id uint64, tokens []uint32, base uint64, parent *uint64, skip bool) {
	p.t.Helper()
	st := &kvevents.Stored{ParentHash: parent}
	for i := 0; i*16 < len(tokens); i++ {
		st.Blocks = append(st.Blocks, kvevents.Block{EngineHash: base + uint64(i), TokenIDs: tokens[i*16 : (i+1)*16]})
	}
	ev := kvevents.RouterEvent{WorkerID: p.worker, EventID: id, Event: kvevents.Event{Stored: st}}
	p.mu.Lock()
	p.stored = append(p.stored, ev)
	p.lastID = id
	p.mu.Unlock()
	if skip {
		return
	}
	b, err := kvevents.EncodeMsgpack(ev)
	if err != nil {
		p.t.Fatal(err)
	}
	if err := p.nc.Publish(kvevents.EventsSubject(p.pool), b); err != nil {
		p.t.Fatal(err)
	}
}

func (p *testPublisher) dumpCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.dumps
}
