package mocker

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/kvevents"
)

// longPrompt is a completion prompt of well over 10 blocks of the word
// tokenizer.
var longPrompt = strings.Repeat("the prefill worker computes this prompt once and the decode worker pulls it ", 20)

// recorder serves h and keeps the bodies it was sent.
type recorder struct {
	mu     sync.Mutex
	bodies []map[string]any
}

func (rec *recorder) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var m map[string]any
		json.Unmarshal(b, &m)
		rec.mu.Lock()
		if r.URL.Path != PathKVRead {
			rec.bodies = append(rec.bodies, m)
		}
		rec.mu.Unlock()
		r.Body = io.NopCloser(strings.NewReader(string(b)))
		h.ServeHTTP(w, r)
	})
}

func hostPort(u string) string { return strings.TrimPrefix(u, "http://") }

// startPD starts a prefill-role and a decode-role mocker; the decode
// one's KV events go to stored.
func startPD(t *testing.T) (p, d *Server, pURL, dURL string, rec *recorder, stored func() map[uint64]struct{}) {
	t.Helper()
	rec = &recorder{}
	p, pURL = serve(t, ServerConfig{Model: "m", WorkerID: "p1", Engine: Config{Role: "prefill", Speedup: 1000}}, ServerOptions{}, rec.wrap)
	var mu sync.Mutex
	blocks := map[uint64]struct{}{}
	sink := FuncSink(func(_ context.Context, _ time.Time, evs []kvevents.Event) error {
		mu.Lock()
		defer mu.Unlock()
		for _, ev := range evs {
			if ev.Stored != nil {
				for _, b := range ev.Stored.Blocks {
					blocks[b.EngineHash] = struct{}{}
				}
			}
		}
		return nil
	})
	d, dURL = serve(t, ServerConfig{Model: "m", WorkerID: "d1", Engine: Config{Role: "decode", Speedup: 1000}}, ServerOptions{Sink: sink}, nil)
	return p, d, pURL, dURL, rec, func() map[uint64]struct{} {
		mu.Lock()
		defer mu.Unlock()
		out := map[uint64]struct{}{}
		for h := range blocks {
			out[h] = struct{}{}
		}
		return out
	}
}

// serve runs a mocker on a loopback listener, its handler wrapped.
func serve(t *testing.T, cfg ServerConfig, opts ServerOptions, wrap func(http.Handler) http.Handler) (*Server, string) {
	t.Helper()
	opts.Logger = testenv.Logger(t)
	srv, err := NewServer(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); srv.Run(ctx) }()
	h := srv.Handler()
	if wrap != nil {
		h = wrap(h)
	}
	hs := httptest.NewServer(h)
	t.Cleanup(func() { hs.Close(); cancel(); <-done })
	return srv, hs.URL
}

func TestPDTwoHops(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(map[bool]string{false: "whole", true: "stream"}[stream], func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			p, d, pURL, dURL, rec, stored := startPD(t)
			body := `{"model":"m","prompt":` + jsonString(longPrompt) + `,"max_tokens":5,"stream":` + map[bool]string{false: "false", true: "true"}[stream] + `}`
			resp := post(ctx, t, dURL+"/v1/completions", body, map[string]string{HeaderPrefiller: hostPort(pURL)})
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("status %d %s, want 200", resp.StatusCode, b)
			}
			if !stream {
				var out struct {
					Usage            usage          `json:"usage"`
					KVTransferParams map[string]any `json:"kv_transfer_params"`
				}
				json.Unmarshal(b, &out)
				if out.Usage.CompletionTokens != 5 || out.KVTransferParams != nil {
					t.Errorf("decode answer %s: want 5 tokens and no kv_transfer_params", b)
				}
			} else if !strings.Contains(string(b), "data: [DONE]") {
				t.Errorf("stream %s has no [DONE]", b)
			}

			// The prefiller got llm-d's prefill request (request_builders.go).
			rec.mu.Lock()
			if len(rec.bodies) != 1 {
				t.Fatalf("prefiller got %d requests, want 1", len(rec.bodies))
			}
			pb := rec.bodies[0]
			rec.mu.Unlock()
			want := map[string]any{"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": nil,
				"remote_block_ids": nil, "remote_host": nil, "remote_port": nil}
			if got := pb["kv_transfer_params"]; !equalJSON(got, want) || pb["stream"] != false || pb["max_tokens"] != 1.0 || pb["stream_options"] != nil {
				t.Errorf("prefill request %v: want stream false, max_tokens 1, kv_transfer_params %v", pb, want)
			}

			// The prefiller computed the prompt; its pinned blocks were pulled.
			ps := p.Stats()
			if ps.PrefixQueryTokens == 0 || ps.HeldBlocks != 0 || ps.UsedBlocks != 0 {
				t.Errorf("prefiller stats %+v: want a prefill and no block held or used after the pull", ps)
			}
			if got := testutil.ToFloat64(d.pd.pulls.WithLabelValues("ok")); got != 1 {
				t.Errorf("decode pulls ok = %v, want 1", got)
			}
			// The decode worker stored the prompt's blocks and published
			// them: every full prompt block the prefiller cached.
			got := stored()
			for h := range p.CachedBlocks() {
				if _, ok := d.CachedBlocks()[h]; !ok {
					continue // the prefiller's output-token block
				}
				if _, ok := got[h]; !ok {
					t.Errorf("decode cache holds %x but published no BlockStored for it", h)
				}
			}
			if n := len(got); n < 10 {
				t.Errorf("decode worker published %d stored blocks, want the prompt's (≥ 10)", n)
			}
			if ds := d.Stats(); ds.PrefixHitTokens != 0 {
				t.Errorf("decode stats %+v: the pulled KV is not a prefix hit", ds)
			}
		})
	}
}

func TestPDPrefillHoldsUntilPulled(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, hs, _ := startServer(t, ServerConfig{Model: "m", WorkerID: "p1", Engine: Config{Role: "prefill"}})
	body := `{"prompt":` + jsonString(longPrompt) + `,"max_tokens":1,"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false}}`
	resp := post(ctx, t, hs.URL+"/v1/completions", body, nil)
	var out struct {
		KV kvTransferParams `json:"kv_transfer_params"`
	}
	json.NewDecoder(resp.Body).Decode(&out)
	resp.Body.Close()
	kv := out.KV
	host, port, _ := net.SplitHostPort(hostPort(hs.URL))
	if !kv.DoRemotePrefill || kv.DoRemoteDecode || *kv.RemoteEngineID != "p1" || *kv.RemoteHost != host || *kv.RemotePort != atoi(port) ||
		*kv.RemoteRequestID == "" || len(kv.RemoteBlockIDs) < 10 || *kv.TPSize != 1 {
		t.Fatalf("kv_transfer_params %+v: want NixlConnector's fields naming p1 at %s and the blocks", kv, hs.URL)
	}
	if st := p.Stats(); st.HeldBlocks != len(kv.RemoteBlockIDs) || st.UsedBlocks != st.HeldBlocks {
		t.Errorf("after the prefill: stats %+v, want %d blocks held (in use)", st, len(kv.RemoteBlockIDs))
	}
	read := func(ids []int) int {
		b, _ := json.Marshal(kvRead{EngineID: "p1", RequestID: *kv.RemoteRequestID, BlockIDs: ids})
		r := post(ctx, t, hs.URL+PathKVRead, string(b), nil)
		r.Body.Close()
		return r.StatusCode
	}
	if got := read(kv.RemoteBlockIDs[1:]); got != http.StatusConflict {
		t.Errorf("read of other blocks: %d, want 409", got)
	}
	if got := read(kv.RemoteBlockIDs); got != http.StatusOK {
		t.Errorf("read: %d, want 200", got)
	}
	if got := read(kv.RemoteBlockIDs); got != http.StatusNotFound {
		t.Errorf("second read: %d, want 404", got)
	}
	if st := p.Stats(); st.HeldBlocks != 0 || st.UsedBlocks != 0 || st.CachedBlocks == 0 {
		t.Errorf("after the pull: stats %+v, want nothing held or used, the blocks still cached", st)
	}
}

func TestHoldExpires(t *testing.T) {
	eng, _ := NewEngine(Config{Role: "prefill", KVHoldTimeout: 10 * time.Second})
	if err := eng.Submit(t0, Request{ID: "p", Tokens: prompt(1, 100), MaxTokens: 1, HoldBlocks: true}); err != nil {
		t.Fatal(err)
	}
	res := eng.Step(t0)
	var done Completion
	for len(res.Completed) == 0 {
		res = eng.Step(res.Next)
	}
	done = res.Completed[0]
	if len(done.HeldBlocks) != blocksFor(101, 16) || eng.Stats().UsedBlocks != len(done.HeldBlocks) {
		t.Fatalf("held %v, used %d: want the request's %d blocks held", done.HeldBlocks, eng.Stats().UsedBlocks, blocksFor(101, 16))
	}
	if want := done.Finished.Add(10 * time.Second); !res.Next.Equal(want) {
		t.Errorf("Next = %v, want the hold's expiry %v", res.Next, want)
	}
	eng.Step(res.Next)
	if st := eng.Stats(); st.UsedBlocks != 0 || st.HeldBlocks != 0 || st.ExpiredHolds != 1 {
		t.Errorf("after the timeout: %+v, want the hold released and counted", st)
	}
	if eng.ReleaseHeld("p") {
		t.Error("ReleaseHeld after expiry reported true")
	}
}

func TestPDFailures(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// A dead prefiller: a port nothing listens on.
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := ln.Addr().String()
	ln.Close()
	// A slow one: answers nothing until the request is cancelled.
	release := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer slow.Close()
	defer close(release)
	_, phs, _ := startServer(t, ServerConfig{Model: "m", WorkerID: "p1", Engine: Config{Role: "prefill"}})
	d, dhs, _ := startServer(t, ServerConfig{Model: "m", WorkerID: "d1", PrefillTimeout: 200 * time.Millisecond, Engine: Config{Role: "decode"}})
	body := `{"model":"m","prompt":"a b c d","max_tokens":3}`
	tests := []struct {
		name, prefiller, body string
		status                int
		code                  string
	}{
		{"dead prefiller", dead, body, 502, "prefill_failed"},
		{"slow prefiller", hostPort(slow.URL), body, 504, "prefill_timeout"},
		{"prefiller refuses", hostPort(phs.URL), `{"model":"other","prompt":"a b","max_tokens":3}`, 404, "model_not_found"},
		{"blocks not held", "", `{"model":"m","prompt":"a b c d","max_tokens":3,"kv_transfer_params":{"do_remote_prefill":true,"remote_engine_id":"p1","remote_request_id":"gone","remote_block_ids":[1,2],"remote_host":"127.0.0.1","remote_port":` + strings.Split(hostPort(phs.URL), ":")[1] + `}}`, 502, "kv_pull_failed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := map[string]string{}
			if tt.prefiller != "" {
				h[HeaderPrefiller] = tt.prefiller
			}
			resp := post(ctx, t, dhs.URL+"/v1/completions", tt.body, h)
			var e apiError
			json.NewDecoder(resp.Body).Decode(&e)
			resp.Body.Close()
			if resp.StatusCode != tt.status || e.Error.Code != tt.code {
				t.Errorf("got %d %+v, want %d %s", resp.StatusCode, e.Error, tt.status, tt.code)
			}
		})
	}
	if st := d.Stats(); st.Running+st.Waiting != 0 || st.Iterations != 0 {
		t.Errorf("decode engine %+v: a failed hop must not reach the engine", st)
	}
}

func FuzzParseKVTransfer(f *testing.F) {
	for _, s := range []string{
		`{"kv_transfer_params":{"do_remote_decode":true,"remote_engine_id":null}}`,
		`{"kv_transfer_params":{"do_remote_prefill":true,"remote_engine_id":"p","remote_request_id":"r","remote_block_ids":[1,2],"remote_host":"h","remote_port":5600,"tp_size":1}}`,
		`{"remote_engine_id":"p1","remote_request_id":"r","remote_block_ids":[1]}`, `{"kv_transfer_params":null}`, `{"kv_transfer_params":[1]}`, `{"kv_transfer_params":{"remote_block_ids":[[1]]}}`, `{`, `[]`,
	} {
		f.Add([]byte(s))
	}
	srv, err := NewServer(ServerConfig{Model: "m", WorkerID: "p1", Engine: Config{Role: "prefill", NumBlocks: 64}}, ServerOptions{})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		// The side channel's parser: any body is a 200, 400, 404 or 409.
		w := httptest.NewRecorder()
		srv.kvReadHandler(w, httptest.NewRequest(http.MethodPost, PathKVRead, strings.NewReader(string(b))))
		if c := w.Code; c != 200 && c != 400 && c != 404 && c != 409 {
			t.Fatalf("side channel answered %d to %q", c, b)
		}
		p, e := parseKVTransfer(b)
		if e != nil && (e.status != 400 || e.message == "") {
			t.Fatalf("error %+v: want a 400 that says why", e)
		}
		if p != nil {
			_ = p.pullable()
		}
	})
}

func jsonString(s string) string { b, _ := json.Marshal(s); return string(b) }

func equalJSON(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}

func atoi(s string) int {
	n := 0
	for _, c := range s {
		n = n*10 + int(c-'0')
	}
	return n
}

// TestPDDataParallelPrefiller: a prefiller of two ranks names each rank's
// engine apart (<worker>_dp<rank>) and the pull reaches the rank that
// holds the blocks; the decode worker's rank header is not forwarded.
func TestPDDataParallelPrefiller(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, pURL := serve(t, ServerConfig{Model: "m", WorkerID: "p1", DPSize: 2, Engine: Config{Role: "prefill", Speedup: 1000}}, ServerOptions{}, nil)
	d, dURL := serve(t, ServerConfig{Model: "m", WorkerID: "d1", Engine: Config{Role: "decode", Speedup: 1000}}, ServerOptions{}, nil)
	for i := range 3 {
		body := `{"model":"m","prompt":` + jsonString(longPrompt+strings.Repeat(" again", i)) + `,"max_tokens":2}`
		resp := post(ctx, t, dURL+"/v1/completions", body, map[string]string{HeaderPrefiller: hostPort(pURL), HeaderDPRank: "0"})
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, b)
		}
	}
	if got := testutil.ToFloat64(d.pd.pulls.WithLabelValues("ok")); got != 3 {
		t.Errorf("pulls ok = %v, want 3", got)
	}
	for r := range 2 {
		if st := p.RankStats(r); st.HeldBlocks != 0 {
			t.Errorf("prefiller rank %d still holds %d blocks", r, st.HeldBlocks)
		}
	}
	if got := p.engineID(1); got != "p1_dp1" {
		t.Errorf("rank 1's engine id = %q, want p1_dp1", got)
	}
}
