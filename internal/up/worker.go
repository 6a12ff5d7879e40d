package up

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kvgate/kvgate/kvevents"
	"github.com/kvgate/kvgate/localrouter/discovery"
	"github.com/kvgate/kvgate/mocker"
)

// Worker is one running mock engine: the mocker's OpenAI API on a loopback
// port, its KV events published to NATS, registered in etcd under its pool.
type Worker struct {
	ID   string
	Pool string
	Addr string // host:port of its HTTP API

	srv    *mocker.Server
	http   *http.Server
	pub    *kvevents.Publisher
	reg    *discovery.Registration
	cancel context.CancelFunc
	done   chan struct{} // engine loop and HTTP server ended
}

// natsSink publishes the engine's KV events for the pool's local routers.
type natsSink struct{ pub *kvevents.Publisher }

func (s natsSink) PublishKV(_ context.Context, _ time.Time, events []kvevents.Event) error {
	var errs []error
	for _, ev := range events {
		if _, err := s.pub.Publish(0, ev); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

type workerSpec struct {
	pool, id, host, model string
	engine                mocker.Config
	tok                   mocker.Tokenizer
}

func startWorker(ctx context.Context, spec workerSpec, nc *nats.Conn, cli *clientv3.Client, log *slog.Logger) (_ *Worker, err error) {
	lis, err := net.Listen("tcp", net.JoinHostPort(spec.host, "0"))
	if err != nil {
		return nil, fmt.Errorf("worker %s: %w", spec.id, err)
	}
	defer func() {
		if err != nil {
			lis.Close()
		}
	}()
	w := &Worker{ID: spec.id, Pool: spec.pool, Addr: lis.Addr().String(), done: make(chan struct{})}
	w.pub, err = kvevents.NewPublisher(nc, kvevents.PublisherConfig{Pool: spec.pool, WorkerID: spec.id, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("worker %s: %w", spec.id, err)
	}
	w.srv, err = mocker.NewServer(mocker.ServerConfig{
		Engine:    spec.engine,
		Model:     spec.model,
		Tokenizer: spec.tok,
		WorkerID:  spec.id,
		Address:   w.Addr,
	}, mocker.ServerOptions{Logger: log.With("worker", spec.id), Sink: natsSink{w.pub}})
	if err != nil {
		w.pub.Close()
		return nil, fmt.Errorf("worker %s: %w", spec.id, err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	w.http = &http.Server{Handler: w.srv.Handler(), ReadHeaderTimeout: 10 * time.Second}
	engineDone := make(chan struct{})
	go func() { defer close(engineDone); w.srv.Run(runCtx) }()
	go func() {
		_ = w.http.Serve(lis)
		<-engineDone
		close(w.done)
	}()

	info, _ := json.Marshal(kvevents.WorkerInfo{
		ID: spec.id, Address: w.Addr, DPSize: 1, BlockSize: blockSizeOf(spec.engine),
		Model: spec.model, KVCapacityBlocks: spec.engine.NumBlocks,
	})
	w.reg, err = discovery.Register(ctx, cli, kvevents.WorkersPrefix(spec.pool)+spec.id, info, 5*time.Second, log)
	if err != nil {
		cctx, c := context.WithTimeout(context.Background(), time.Second)
		defer c()
		w.stop(cctx)
		return nil, fmt.Errorf("worker %s: register: %w", spec.id, err)
	}
	return w, nil
}

func blockSizeOf(c mocker.Config) int {
	if c.BlockSize == 0 {
		return 16
	}
	return c.BlockSize
}

// Stats snapshots the worker's engine.
func (w *Worker) Stats() mocker.Stats { return w.srv.Stats() }

// close deregisters the worker, then stops serving and the engine.
func (w *Worker) close(ctx context.Context) error {
	var err error
	if w.reg != nil {
		err = w.reg.Close(ctx)
	}
	return errors.Join(err, w.stop(ctx))
}

func (w *Worker) stop(ctx context.Context) error {
	err := w.http.Shutdown(ctx)
	if err != nil {
		w.http.Close()
	}
	w.cancel()
	<-w.done
	return errors.Join(err, w.pub.Close())
}
