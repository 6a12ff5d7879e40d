package client_test

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"

	"google.golang.org/grpc"

	"github.com/kvgate/kvgate/kvevents"
	"github.com/kvgate/kvgate/localrouter"
	"github.com/kvgate/kvgate/localrouter/server"
	"github.com/kvgate/kvgate/membership"
)

// fakeWorker is a small OpenAI-compatible engine for tests and examples: it
// streams its reply to /v1/completions as SSE chunks and records the
// requests it got. It is the one seam faked here (no inference engine).
type fakeWorker struct {
	id    string
	srv   *httptest.Server
	words []string

	mu       sync.Mutex
	requests []completionRequest
	// hold, when set, is waited on after the first chunk (the request's
	// context ending also releases it).
	hold chan struct{}
	// fail answers every request with this HTTP status.
	fail int
}

type completionRequest struct {
	Model     string   `json:"model"`
	Prompt    []uint32 `json:"prompt"`
	Stream    bool     `json:"stream"`
	MaxTokens int      `json:"max_tokens"`
}

func newFakeWorker(id string) *fakeWorker {
	w := &fakeWorker{id: id, words: []string{"Hello", " from", " " + id}}
	w.srv = httptest.NewServer(http.HandlerFunc(w.serve))
	return w
}

func (w *fakeWorker) addr() string { return w.srv.Listener.Addr().String() }

func (w *fakeWorker) got() []completionRequest {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.requests)
}

func (w *fakeWorker) serve(rw http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/completions" {
		http.NotFound(rw, r)
		return
	}
	var req completionRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(rw, err.Error(), http.StatusBadRequest)
		return
	}
	w.mu.Lock()
	w.requests = append(w.requests, req)
	hold, fail := w.hold, w.fail
	w.mu.Unlock()
	if fail != 0 {
		http.Error(rw, `{"error":{"message":"engine overloaded"}}`, fail)
		return
	}
	rw.Header().Set("Content-Type", "text/event-stream")
	fl := rw.(http.Flusher)
	// A role-only first chunk, as OpenAI servers send, carries no text.
	fmt.Fprint(rw, "data: {\"choices\":[{\"index\":0,\"text\":\"\"}]}\n\n")
	for i, word := range w.words {
		b, _ := json.Marshal(map[string]any{"choices": []map[string]any{{"index": 0, "text": word, "finish_reason": nil}}})
		// Split one event across writes, as proxies do.
		fmt.Fprintf(rw, "data: %s", b[:len(b)/2])
		fl.Flush()
		fmt.Fprintf(rw, "%s\r\n\r\n", b[len(b)/2:])
		fl.Flush()
		if i == 0 && hold != nil {
			select {
			case <-hold:
			case <-r.Context().Done():
				return
			}
		}
	}
	fmt.Fprint(rw, ": keep-alive comment\n\ndata: {\"choices\":[{\"index\":0,\"text\":\"\",\"finish_reason\":\"length\"}]}\n\ndata: [DONE]\n\n")
}

// directory is a static server.Directory.
type directory map[string]membership.WorkerInfo

func (d directory) Worker(id string) (membership.WorkerInfo, bool) { w, ok := d[id]; return w, ok }
func (d directory) Workers() []membership.WorkerInfo {
	var out []membership.WorkerInfo
	for _, id := range slices.Sorted(maps.Keys(d)) {
		out = append(out, d[id])
	}
	return out
}

// pool is one local router (no etcd, no NATS: its members are set
// directly) serving gRPC on loopback, with its fake workers.
type pool struct {
	addr    string
	router  *localrouter.Router
	workers map[string]*fakeWorker
	stop    func()
}

// startPool starts a router with block size 16 and one fake worker per
// id. Call stop when done.
func startPool(ids ...string) *pool { return startPoolWith(localrouter.DefaultConfig(), ids...) }

// startPoolWith is startPool with the router configuration cfg.
func startPoolWith(cfg localrouter.Config, ids ...string) *pool {
	r, err := localrouter.New(cfg, localrouter.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		panic(err)
	}
	p := &pool{router: r, workers: map[string]*fakeWorker{}}
	dir := directory{}
	for _, id := range ids {
		w := newFakeWorker(id)
		p.workers[id] = w
		dir[id] = membership.WorkerInfo{ID: id, Address: w.addr(), DPSize: 1, BlockSize: 16, Model: "demo"}
		r.AddWorker(id, 1)
	}
	srv, err := server.New(server.Options{Router: r, Directory: dir, Pool: "demo"})
	if err != nil {
		panic(err)
	}
	g := grpc.NewServer()
	srv.Register(g)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	go g.Serve(lis)
	p.addr = lis.Addr().String()
	p.stop = func() {
		g.Stop()
		r.Close()
		for _, w := range p.workers {
			w.srv.Close()
		}
	}
	return p
}

// cache stores the first n blocks of tokens on worker id, as the engine's
// KV events would.
func (p *pool) cache(id string, tokens []uint32, n int) {
	st := &kvevents.Stored{}
	for i := range n {
		st.Blocks = append(st.Blocks, kvevents.Block{EngineHash: uint64(1000 + i), TokenIDs: tokens[i*16 : (i+1)*16]})
	}
	if err := p.router.ApplyEvent(kvevents.RouterEvent{WorkerID: id, EventID: 1, Event: kvevents.Event{Stored: st}}); err != nil {
		panic(err)
	}
}

// prompt returns n tokens starting at start.
func prompt(start, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(start + i)
	}
	return out
}
