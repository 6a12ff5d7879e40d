package up

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvgate/kvgate/internal/mockerd"
	"github.com/kvgate/kvgate/mocker"
)

// Worker is one running mock engine (mockerd.Start): its OpenAI API on a
// loopback port, its KV events published to NATS, registered in etcd under
// its pool.
type Worker struct {
	ID   string
	Pool string
	Addr string // host:port of its HTTP API
	// DPSize is its number of data-parallel ranks.
	DPSize int

	inst   *mockerd.Instance
	cancel context.CancelFunc
	// what Restart needs to start it again
	spec workerSpec
	nc   *nats.Conn
	cli  *clientv3.Client
	log  *slog.Logger
}

type workerSpec struct {
	pool, id, host, model string
	dpSize                int
	engine                mocker.Config
	tok                   mocker.Tokenizer
	maxBody               int64
	listen                string // host:port; "" is host with a free port
	// obs gives the worker's observer (Observers.Engine; nil: none).
	obs func(pool, worker string) mocker.RequestObserver
}

func startWorker(ctx context.Context, spec workerSpec, nc *nats.Conn, cli *clientv3.Client, log *slog.Logger) (*Worker, error) {
	// The instance lives until close, not until the start's ctx ends.
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	listen := spec.listen
	if listen == "" {
		listen = net.JoinHostPort(spec.host, "0")
	}
	var obs mocker.RequestObserver
	if spec.obs != nil {
		obs = spec.obs(spec.pool, spec.id)
	}
	inst, err := mockerd.Start(runCtx, mockerd.RunConfig{
		Server:   mocker.ServerConfig{Engine: spec.engine, Model: spec.model, Tokenizer: spec.tok, DPSize: spec.dpSize, MaxBodyBytes: spec.maxBody},
		Listen:   listen,
		Pool:     spec.pool,
		WorkerID: spec.id,
		Events:   mockerd.EventsNATS,
	}, mockerd.RunDeps{Logger: log.With("worker", spec.id), Registry: prometheus.NewRegistry(), NATS: nc, Etcd: cli, Observer: obs})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("worker %s: %w", spec.id, err)
	}
	return &Worker{ID: inst.WorkerID, Pool: spec.pool, Addr: inst.Addr, DPSize: inst.Server.DPSize(), inst: inst, cancel: cancel, spec: spec, nc: nc, cli: cli, log: log}, nil
}

// Stats snapshots the worker's engine, summed over its ranks.
func (w *Worker) Stats() mocker.Stats { return w.inst.Server.Stats() }

// RankStats snapshots rank r's engine.
func (w *Worker) RankStats(r int) mocker.Stats { return w.inst.Server.RankStats(r) }

// close stops the worker (deregistering it) and waits for it.
func (w *Worker) close(ctx context.Context) error {
	w.cancel()
	done := make(chan error, 1)
	go func() { done <- w.inst.Wait() }()
	select {
	case err := <-done:
		if errors.Is(err, context.Canceled) {
			err = nil
		}
		return err
	case <-ctx.Done():
		return fmt.Errorf("worker %s: %w", w.ID, ctx.Err())
	}
}

// Kill makes the worker fail as a crashed process does (mockerd.Instance.Kill):
// its listener and connections close at once, streams in flight break;
// it stays registered until Restart or Close.
func (w *Worker) Kill() { w.inst.Kill() }

// Restart stops the worker (deregistering it) and starts a fresh engine
// with the same id on the same address; the cache starts empty.
func (w *Worker) Restart(ctx context.Context) error {
	if err := w.close(ctx); err != nil {
		return err
	}
	spec := w.spec
	spec.listen = w.Addr
	for {
		nw, err := startWorker(ctx, spec, w.nc, w.cli, w.log)
		if err == nil {
			w.inst, w.cancel = nw.inst, nw.cancel
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(50 * time.Millisecond): // the port may still be busy
		}
	}
}
