package mocker

// The P/D (prefill/decode) protocol as vLLM's NixlConnector and llm-d's
// routing sidecar speak it, played by the mocker's two roles:
//
//   - prefill role: a request whose kv_transfer_params has
//     do_remote_decode true is prefilled (max_tokens is 1 on this role),
//     its blocks stay pinned (Request.HoldBlocks), and the answer carries
//     kv_transfer_params naming this engine, the pinned block ids, and the
//     host and port to read them from, field for field as
//     NixlConnectorScheduler.request_finished returns them
//     (vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py,
//     vllm-project/vllm@002a1057e9ae674d7bdc9c4be95bc29d65d2e808).
//   - decode role, x-prefiller-host-port set: the sidecar's hop first
//     (llm-d/llm-d-inference-scheduler pkg/sidecar/proxy/runners/runner_vllm.go
//     and request_builders.go, nixlV2RequestBuilder, at
//     0b8944aec1e61d32f2e0ddaef14063e105b9bc06): the body goes to the
//     prefiller on the same path with stream false, stream_options
//     dropped, max_tokens and max_completion_tokens 1 and
//     kv_transfer_params {do_remote_decode: true, do_remote_prefill:
//     false, remote_*: null}; the prefiller's kv_transfer_params replace
//     them in the body the engine then serves.
//   - decode role, kv_transfer_params with do_remote_prefill true (from
//     the hop above, or from vLLM's toy proxy): the engine "pulls" the
//     blocks: it asks the prefiller's side channel (remote_host,
//     remote_port: in the mocker, its HTTP listener, PathKVRead) to hand
//     over remote_block_ids of remote_request_id, which unpins them there;
//     the request then waits the transfer time (ISL × KVBytesPerToken /
//     KVTransferBandwidth) and its blocks land in this cache as if
//     computed, published as BlockStored like any stored block.
//
// Failures are answered, not papered over: a prefiller that refuses the
// connection or answers garbage is a 502, one slower than
// ServerConfig.PrefillTimeout a 504, a prefiller's own error status is
// passed through (as the sidecar does), and a pull that fails (blocks
// expired, prefiller gone) is a 502, as vLLM's default
// kv_load_failure_policy "fail" ends the request. The mocker does not fall
// back to a local prefill: llm-d's sidecar does not either (runner_vllm.go
// answers the prefiller's status, and its reverse proxy a 502 for an
// unreachable one), and a silent fallback would hide a broken prefill
// pool behind slower answers while the routers charged the prefill worker.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/membership"
)

// HeaderPrefiller names the prefill worker of a disaggregated request
// (llm-d's x-prefiller-host-port, set by kvgate's ext_proc server).
const HeaderPrefiller = "x-prefiller-host-port"

// PathKVRead is the prefill-role mocker's stand-in for the NIXL side
// channel: a decode-role mocker posts {remote_engine_id,
// remote_request_id, remote_block_ids} there to pull pinned blocks.
const PathKVRead = "/mocker/nixl/read"

// DefaultPrefillTimeout bounds the prefill hop and the pull of a
// decode-role mocker that sets none.
const DefaultPrefillTimeout = 60 * time.Second

// kvTransferParams is vLLM's kv_transfer_params object, both directions.
type kvTransferParams struct {
	DoRemoteDecode  bool    `json:"do_remote_decode"`
	DoRemotePrefill bool    `json:"do_remote_prefill"`
	RemoteEngineID  *string `json:"remote_engine_id"`
	RemoteRequestID *string `json:"remote_request_id"`
	RemoteBlockIDs  []int   `json:"remote_block_ids"`
	RemoteHost      *string `json:"remote_host"`
	RemotePort      *int    `json:"remote_port"`
	TPSize          *int    `json:"tp_size"`
}

// parseKVTransfer reads a request body's kv_transfer_params (nil when
// absent or null).
func parseKVTransfer(body []byte) (*kvTransferParams, *httpError) {
	var outer struct {
		KV json.RawMessage `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal(body, &outer); err != nil {
		return nil, badRequest("invalid_json", "invalid JSON body: %v", err)
	}
	raw := bytes.TrimSpace(outer.KV)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, nil
	}
	var p kvTransferParams
	if err := json.Unmarshal(raw, &p); err != nil {
		return nil, badRequest("invalid_kv_transfer_params", "kv_transfer_params: %v", err)
	}
	return &p, nil
}

// pullable reports whether p names blocks to pull: what vLLM's
// update_state_after_alloc checks before it reads (remote_block_ids and
// every remote_* field present).
func (p *kvTransferParams) pullable() bool {
	return p.DoRemotePrefill && len(p.RemoteBlockIDs) > 0 && p.RemoteEngineID != nil && p.RemoteRequestID != nil &&
		p.RemoteHost != nil && p.RemotePort != nil && *p.RemotePort > 0 && *p.RemotePort <= 65535
}

// pd is a server's P/D state: the client of its hops and their metrics.
type pd struct {
	client  *http.Client
	timeout time.Duration
	hops    *prometheus.CounterVec
	pulls   *prometheus.CounterVec
	pulled  prometheus.Counter
}

func newPD(reg prometheus.Registerer, timeout time.Duration) *pd {
	if timeout <= 0 {
		timeout = DefaultPrefillTimeout
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	p := &pd{
		client:  &http.Client{Transport: tr},
		timeout: timeout,
		hops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_mocker_pd_prefill_requests_total",
			Help: "Prefill hops a decode-role mocker sent (x-prefiller-host-port), by result: ok, error (502 or the prefiller's status), timeout (504).",
		}, []string{"result"}),
		pulls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvgate_mocker_pd_kv_pulls_total",
			Help: "KV pulls a decode-role mocker made from a prefiller (kv_transfer_params do_remote_prefill), by result: ok, error, timeout, skipped (params name no blocks: prefilled locally).",
		}, []string{"result"}),
		pulled: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvgate_mocker_pd_kv_pulled_blocks_total",
			Help: "KV blocks a decode-role mocker pulled from prefillers.",
		}),
	}
	reg.MustRegister(p.hops, p.pulls, p.pulled)
	for _, r := range []string{"ok", "error", "timeout"} {
		p.hops.WithLabelValues(r)
		p.pulls.WithLabelValues(r)
	}
	p.pulls.WithLabelValues("skipped")
	return p
}

// close drops the hops' idle connections.
func (p *pd) close() { p.client.CloseIdleConnections() }

// hopError is the answer to a failed hop: a 504 past the timeout, the
// client's own cancellation (nothing to answer), else a 502.
func (s *Server) hopError(ctx context.Context, what string, err error) *httpError {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return &httpError{status: http.StatusGatewayTimeout, code: "prefill_timeout",
			message: fmt.Sprintf("%s: no answer within %v", what, s.pd.timeout)}
	}
	return &httpError{status: http.StatusBadGateway, code: "prefill_failed", message: fmt.Sprintf("%s: %v", what, err)}
}

// result is a failed hop's metric label.
func (e *httpError) result() string {
	if e.status == http.StatusGatewayTimeout {
		return "timeout"
	}
	return "error"
}

// sidecar performs llm-d's prefill hop for a decode-role request naming
// its prefiller, and returns the body to decode (with the prefiller's
// kv_transfer_params). Other requests pass unchanged.
func (s *Server) sidecar(r *http.Request, body []byte) ([]byte, *httpError) {
	target := r.Header.Get(HeaderPrefiller)
	if target == "" || s.cfg.Engine.Role != membership.RoleDecode {
		return body, nil
	}
	var req map[string]any
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, badRequest("invalid_json", "invalid JSON body: %v", err)
	}
	prefill := make(map[string]any, len(req)+3)
	for k, v := range req {
		prefill[k] = v
	}
	prefill["stream"] = false
	delete(prefill, "stream_options")
	prefill["max_tokens"], prefill["max_completion_tokens"] = 1, 1
	prefill["kv_transfer_params"] = map[string]any{"do_remote_decode": true, "do_remote_prefill": false,
		"remote_engine_id": nil, "remote_block_ids": nil, "remote_host": nil, "remote_port": nil}
	pbody, _ := json.Marshal(prefill)

	ctx, cancel := context.WithTimeout(r.Context(), s.pd.timeout)
	defer cancel()
	// The sidecar accepts an http:// prefix.
	host := strings.TrimPrefix(target, "http://")
	preq, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+host+r.URL.Path, bytes.NewReader(pbody))
	if err != nil {
		s.pd.hops.WithLabelValues("error").Inc()
		return nil, &httpError{status: http.StatusBadGateway, code: "prefill_failed", message: fmt.Sprintf("prefiller %q: %v", target, err)}
	}
	preq.Header = r.Header.Clone()
	// The prefiller is told nothing of a prefiller (no loop) nor of the
	// decode worker's data-parallel rank (its own ranks are its own).
	for _, h := range []string{HeaderPrefiller, HeaderDPRank, "Content-Length", "Connection", "Accept-Encoding"} {
		preq.Header.Del(h)
	}
	preq.Header.Set("Content-Type", "application/json")
	preq.Header.Set("X-Request-Id", "pd-"+strconv.FormatUint(s.seq.Add(1), 36))
	what := fmt.Sprintf("prefiller %s", host)
	resp, err := s.pd.client.Do(preq)
	if err != nil {
		e := s.hopError(ctx, what, err)
		s.pd.hops.WithLabelValues(e.result()).Inc()
		return nil, e
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		e := s.hopError(ctx, what, err)
		s.pd.hops.WithLabelValues(e.result()).Inc()
		return nil, e
	}
	if resp.StatusCode < 200 || resp.StatusCode >= 300 {
		// The sidecar answers the prefiller's status and body.
		s.pd.hops.WithLabelValues("error").Inc()
		return nil, &httpError{status: resp.StatusCode, raw: answer, rawType: resp.Header.Get("Content-Type")}
	}
	var out struct {
		KV json.RawMessage `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal(answer, &out); err != nil {
		s.pd.hops.WithLabelValues("error").Inc()
		return nil, &httpError{status: http.StatusBadGateway, code: "prefill_failed", message: fmt.Sprintf("%s answered no JSON: %v", what, err)}
	}
	s.pd.hops.WithLabelValues("ok").Inc()
	if len(out.KV) == 0 {
		// As the sidecar: a warning, and the decode request goes on
		// without them (it prefills locally).
		s.log.Warn("prefiller answered no kv_transfer_params; prefilling locally", "prefiller", host)
		out.KV = []byte("null")
	}
	req["kv_transfer_params"] = out.KV
	dbody, _ := json.Marshal(req)
	return dbody, nil
}

// kvTransfer applies a request's kv_transfer_params to g: a prefill-role
// engine holds the blocks of a do_remote_decode request; a decode-role
// engine pulls those named by do_remote_prefill (g.remote).
func (s *Server) kvTransfer(ctx context.Context, body []byte, g *genRequest) *httpError {
	p, e := parseKVTransfer(body)
	if e != nil || p == nil {
		return e
	}
	switch s.cfg.Engine.Role {
	case membership.RolePrefill:
		g.hold = p.DoRemoteDecode
	case membership.RoleDecode:
		if !p.DoRemotePrefill {
			return nil
		}
		if !p.pullable() {
			s.pd.pulls.WithLabelValues("skipped").Inc()
			s.log.Warn("kv_transfer_params name no blocks to pull; prefilling locally")
			return nil
		}
		if e := s.pull(ctx, p); e != nil {
			return e
		}
		g.remote = true
	}
	return nil
}

// kvRead is the body of a pull (PathKVRead).
type kvRead struct {
	EngineID  string `json:"remote_engine_id"`
	RequestID string `json:"remote_request_id"`
	BlockIDs  []int  `json:"remote_block_ids"`
}

// pull reads p's blocks from the prefiller's side channel.
func (s *Server) pull(ctx context.Context, p *kvTransferParams) *httpError {
	ctx, cancel := context.WithTimeout(ctx, s.pd.timeout)
	defer cancel()
	addr := net.JoinHostPort(*p.RemoteHost, strconv.Itoa(*p.RemotePort))
	what := fmt.Sprintf("kv pull from %s (engine %s, request %s)", addr, *p.RemoteEngineID, *p.RemoteRequestID)
	b, _ := json.Marshal(kvRead{EngineID: *p.RemoteEngineID, RequestID: *p.RemoteRequestID, BlockIDs: p.RemoteBlockIDs})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+PathKVRead, bytes.NewReader(b))
	if err != nil {
		s.pd.pulls.WithLabelValues("error").Inc()
		return &httpError{status: http.StatusBadGateway, code: "kv_pull_failed", message: fmt.Sprintf("%s: %v", what, err)}
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.pd.client.Do(req)
	if err != nil {
		e := s.hopError(ctx, what, err)
		if e.status != http.StatusGatewayTimeout {
			e.code = "kv_pull_failed"
		}
		s.pd.pulls.WithLabelValues(e.result()).Inc()
		return e
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	if resp.StatusCode != http.StatusOK {
		s.pd.pulls.WithLabelValues("error").Inc()
		return &httpError{status: http.StatusBadGateway, code: "kv_pull_failed", message: fmt.Sprintf("%s: %s: %s", what, resp.Status, bytes.TrimSpace(msg))}
	}
	s.pd.pulls.WithLabelValues("ok").Inc()
	s.pd.pulled.Add(float64(len(p.RemoteBlockIDs)))
	return nil
}

// engineID is rank r's NIXL engine id: the worker id, suffixed _dp<r>
// when the worker has several ranks.
func (s *Server) engineID(r int) string {
	id := s.cfg.WorkerID
	if id == "" {
		id = "mocker"
	}
	if len(s.ranks) > 1 {
		id += "_dp" + strconv.Itoa(r)
	}
	return id
}

// prefillParams is a prefill-role answer's kv_transfer_params: where the
// KV of request id is, on rank. Without a hold (no do_remote_decode) it
// names no blocks, and a decode worker prefills locally.
func (s *Server) prefillParams(r *http.Request, rank int, id string, c Completion) map[string]any {
	host, port := s.sideChannel(r)
	blocks := c.HeldBlocks
	if blocks == nil {
		blocks = []int{}
	}
	return map[string]any{"do_remote_prefill": true, "do_remote_decode": false, "remote_block_ids": blocks,
		"remote_engine_id": s.engineID(rank), "remote_request_id": id, "remote_host": host, "remote_port": port, "tp_size": 1}
}

// sideChannel is the host and port a decode worker pulls from: the
// advertised address, else the listener the request came in on.
func (s *Server) sideChannel(r *http.Request) (string, int) {
	addr := s.cfg.Address
	if addr == "" {
		if a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
			addr = a.String()
		}
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr, 0
	}
	n, _ := strconv.Atoi(port)
	return host, n
}

// kvRead serves PathKVRead on a prefill-role mocker: it checks the blocks
// are held for the request and unpins them (the decode worker has read
// them). 404: none held (never, already pulled, or expired); 409: other
// block ids than those held.
func (s *Server) kvReadHandler(w http.ResponseWriter, r *http.Request) {
	body, e := s.readBody(w, r)
	if e != nil {
		e.write(w)
		return
	}
	var in kvRead
	if err := json.Unmarshal(body, &in); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_json", "invalid JSON body: "+err.Error())
		return
	}
	rank := -1
	for i := range s.ranks {
		if s.engineID(i) == in.EngineID {
			rank = i
		}
	}
	if rank < 0 {
		writeError(w, http.StatusNotFound, "unknown_engine", fmt.Sprintf("engine %q is not served here", in.EngineID))
		return
	}
	l := s.ranks[rank]
	l.mu.Lock()
	held, ok := l.eng.Held(in.RequestID)
	match := ok && slices.Equal(held, in.BlockIDs)
	if match {
		l.eng.ReleaseHeld(in.RequestID)
	}
	l.mu.Unlock()
	switch {
	case !ok:
		writeError(w, http.StatusNotFound, "not_held", fmt.Sprintf("no blocks are held for request %q (never prefilled here, already pulled, or expired)", in.RequestID))
	case !match:
		writeError(w, http.StatusConflict, "block_mismatch", fmt.Sprintf("request %q holds blocks %v, not %v", in.RequestID, held, in.BlockIDs))
	default:
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"blocks": len(held)})
	}
}

// writeRaw answers body as is with status.
func writeRaw(w http.ResponseWriter, status int, contentType string, body []byte) {
	if contentType != "" {
		w.Header().Set("Content-Type", contentType)
	}
	w.WriteHeader(status)
	w.Write(body)
}
