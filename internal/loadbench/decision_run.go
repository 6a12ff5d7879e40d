package loadbench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvgate/kvgate/envoy/extprocclient"
	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/benchfig"
	"github.com/kvgate/kvgate/lib/config"
)

// DecisionReport is `kvgate bench -decision -json`: one object whose
// top-level figures are the first run's, and every run (a commit mode ×
// a number of pools) in Runs.
type DecisionReport struct {
	DecisionResult
	Runs []DecisionResult `json:"runs"`
}

// DecisionModes runs the decision benchmark once per commit mode and
// number of pools (each on a fresh kvgate side), in that order, modes
// inside pools; each run's kvgate CPU per request is compared with the
// decide run's of the same pools. A mode the global router's configuration
// refuses fails the whole before anything runs.
func DecisionModes(ctx context.Context, cfg DecisionConfig, modes []globalrouter.CommitMode, pools []int) (DecisionReport, error) {
	var rep DecisionReport
	if len(modes) == 0 {
		modes = []globalrouter.CommitMode{cfg.Commit}
	}
	if len(pools) == 0 {
		pools = []int{cfg.Pools}
	}
	for _, m := range modes {
		if m == "" {
			continue
		}
		if err := CheckCommitMode(m); err != nil {
			return rep, fmt.Errorf("decision bench: -commit %s: %w", m, err)
		}
	}
	for _, np := range pools {
		decideCPU := 0.0
		for _, m := range modes {
			c := cfg
			c.Commit, c.Pools = m, np
			res, err := Decision(ctx, c)
			if err != nil {
				return rep, fmt.Errorf("decision bench (commit %s, %d pools): %w", res.Commit, np, err)
			}
			if res.Commit == string(globalrouter.CommitDecide) {
				decideCPU = res.ServerCPUusPerReq
				if !res.ServerProcess {
					decideCPU = res.ClientCPUusPerReq
				}
			}
			rep.Runs = append(rep.Runs, res)
		}
		for i := range rep.Runs {
			r := &rep.Runs[i]
			cpu := r.ServerCPUusPerReq
			if !r.ServerProcess {
				cpu = r.ClientCPUusPerReq
			}
			if r.Pools == np && decideCPU > 0 {
				r.CPUvsDecide = cpu / decideCPU
			}
		}
	}
	rep.DecisionResult = rep.Runs[0]
	return rep, nil
}

// decisionDriver is how the benchmark commands kvgate's side
// (decisionSide.command), in this process or in the child.
type decisionDriver func(cmd string) (serverSnapshot, error)

// Decision runs the decision benchmark once: warm-up, the sequential
// phase, the gRPC floor, the paced window.
func Decision(ctx context.Context, cfg DecisionConfig) (DecisionResult, error) {
	cfg.defaults()
	res := DecisionResult{Pools: cfg.Pools, Workers: cfg.Workers, ServerProcess: cfg.ServerProcess, LoadAverage: LoadAverage(), Sequential: cfg.Sequential}
	sc := sideConfig{pools: cfg.Pools, workers: cfg.Workers, commit: cfg.Commit, probeFile: cfg.ProbeFile}
	probe, err := sc.probeConfig()
	if err != nil {
		return res, err
	}
	res.Commit = string(probe.Commit)
	if res.Commit == "" {
		res.Commit = string(globalrouter.CommitDecide)
	}
	var (
		addr   string
		driver decisionDriver
	)
	if cfg.ServerProcess {
		ps, err := startChild(ctx, "decision bench", decisionServerEnv+"=1", decisionServerProfileEnv+"="+cfg.ServerProfile,
			fmt.Sprintf("%s=%d", config.EnvDecisionPools, cfg.Pools), fmt.Sprintf("%s=%d", config.EnvDecisionWorkers, cfg.Workers),
			decisionCommitEnv+"="+string(cfg.Commit), decisionProbeFileEnv+"="+cfg.ProbeFile)
		if err != nil {
			return res, err
		}
		defer ps.stop()
		addr = ps.addr
		driver = func(cmd string) (serverSnapshot, error) {
			var s serverSnapshot
			if _, err := io.WriteString(ps.in, cmd+"\n"); err != nil {
				return s, fmt.Errorf("decision bench: server process: %w", err)
			}
			line, err := ps.line()
			if err != nil {
				return s, fmt.Errorf("decision bench: server process: %w", err)
			}
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "snap ")), &s); err != nil {
				return s, fmt.Errorf("decision bench: server process: %.80q: %w", line, err)
			}
			return s, nil
		}
	} else {
		ds, err := startDecisionSide(sc)
		if err != nil {
			return res, err
		}
		defer ds.stop()
		addr = ds.addr
		driver = ds.command
	}
	cfg.Logger.Info("decision bench: kvgate's side is up", "ext_proc", addr, "server_process", cfg.ServerProcess, "commit", res.Commit)

	conn, err := grpc.NewClient(addr, append(extprocclient.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		return res, fmt.Errorf("decision bench: %w", err)
	}
	defer conn.Close()
	client, err := extprocclient.New(conn, extprocclient.Config{
		ProcessingMode: &extprocfilterv3.ProcessingMode{
			RequestBodyMode: extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED, RequestTrailerMode: extprocfilterv3.ProcessingMode_SEND,
			ResponseBodyMode: extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseTrailerMode: extprocfilterv3.ProcessingMode_SEND,
		},
		ReceivingNamespaces: []string{"envoy.lb"},
		MessageTimeout:      10 * time.Second,
		BufferLimit:         32 << 20,
	}, slog.New(slog.DiscardHandler))
	if err != nil {
		return res, fmt.Errorf("decision bench: %w", err)
	}
	for i := range 32 { // warm the connections, the tokenizer, the caches
		if _, err := decisionExchange(ctx, client, decisionBody("warm", i)); err != nil {
			return res, fmt.Errorf("decision bench: warm-up: %w", err)
		}
	}
	if err := decisionSequential(ctx, cfg, client, driver, &res); err != nil {
		return res, err
	}
	err = decisionPaced(ctx, cfg, client, driver, &res)
	return res, err
}

// decisionSequential is the sequential phase and the floor after it.
func decisionSequential(ctx context.Context, cfg DecisionConfig, client *extprocclient.Client, driver decisionDriver, res *DecisionResult) error {
	if _, err := driver("seq 1"); err != nil { // drops the warm-up's figures
		return err
	}
	// One floor round trip after each exchange, in the same conditions
	// (kvgate's process just woken by a request), the first once the
	// first probe told its size.
	var floor []int64
	for i := range cfg.Sequential {
		if _, err := decisionExchange(ctx, client, decisionBody("sequential", i)); err != nil {
			return fmt.Errorf("decision bench: sequential: %w", err)
		}
		f, err := driver("floor 1")
		if err != nil {
			return fmt.Errorf("decision bench: gRPC floor: %w", err)
		}
		floor = append(floor, f.Floor...)
	}
	s, err := driver("seq 0")
	if err != nil {
		return err
	}
	if len(s.Rounds) == 0 || len(s.Decisions) == 0 || len(s.Tokenize) == 0 {
		return fmt.Errorf("decision bench: sequential: kvgate's side recorded %d decisions, %d tokenizations, %d round-trip counts",
			len(s.Decisions), len(s.Tokenize), len(s.Rounds))
	}
	dp, tp := benchfig.Percentiles(durations(s.Decisions)), benchfig.Percentiles(durations(s.Tokenize))
	res.DecisionP50us, res.DecisionP99us = us(dp.P50), us(dp.P99)
	res.TokenizeP50us, res.TokenizeP99us = us(tp.P50), us(tp.P99)
	rounds, unwaited := 0, 0
	for i := range s.Rounds {
		rounds += s.Rounds[i]
		unwaited += s.Unwaited[i]
	}
	res.RoundTripsPerDecision = float64(rounds) / float64(len(s.Rounds))
	res.UnwaitedPerDecision = float64(unwaited) / float64(len(s.Rounds))
	res.ProbeBytes = s.ProbeBytes
	fp := benchfig.Percentiles(durations(floor))
	res.GRPCFloorP50us, res.GRPCFloorP99us = us(fp.P50), us(fp.P99)
	f, err := driver(fmt.Sprint("floor ", cfg.Sequential))
	if err != nil {
		return fmt.Errorf("decision bench: gRPC floor: %w", err)
	}
	res.GRPCFloorBackToBackP50us = us(benchfig.Percentiles(durations(f.Floor)).P50)
	res.TargetDecisionP50us = res.TokenizeP50us + 1.3*res.GRPCFloorP50us
	res.TargetMet = res.DecisionP50us <= res.TargetDecisionP50us
	return nil
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

// decisionPaced is the paced window.
func decisionPaced(ctx context.Context, cfg DecisionConfig, client *extprocclient.Client, driver decisionDriver, res *DecisionResult) error {
	bodies := make([][]byte, cfg.N)
	for i := range bodies {
		bodies[i] = decisionBody("paced", i)
	}
	s0, err := driver("snap")
	if err != nil {
		return err
	}
	cpu0 := CPUTime()
	lat := make([]time.Duration, cfg.N)
	errs := make([]error, cfg.N)
	var wg sync.WaitGroup
	gap := time.Second / time.Duration(cfg.Rate)
	t0 := time.Now()
	for i := range cfg.N {
		if d := time.Until(t0.Add(time.Duration(i) * gap)); d > 0 {
			time.Sleep(d) // pacing the offered load
		}
		wg.Go(func() { lat[i], errs[i] = decisionExchange(ctx, client, bodies[i]) })
	}
	wg.Wait()
	elapsed := time.Since(t0)
	cpu := CPUTime() - cpu0
	s1, err := driver("snap")
	if err != nil {
		return err
	}
	res.Requests, res.Rate = cfg.N, float64(cfg.N)/elapsed.Seconds()
	var ok []time.Duration
	var firstErr error
	for i, e := range errs {
		if e != nil {
			res.Errors++
			if firstErr == nil {
				firstErr = e
			}
			continue
		}
		ok = append(ok, lat[i])
	}
	p := benchfig.Percentiles(ok)
	res.ExchangeP50us, res.ExchangeP99us = us(p.P50), us(p.P99)
	dp := benchfig.Percentiles(durations(s1.Decisions))
	res.PacedDecisionP50us, res.PacedDecisionP99us = us(dp.P50), us(dp.P99)
	res.BestEffort = s1.BestEffort - s0.BestEffort
	res.MessagesPerRequest = map[string]float64{}
	for k, n := range s1.Sent {
		res.MessagesPerRequest[k] = float64(n) / float64(cfg.N)
	}
	res.ClientCPUusPerReq = float64(cpu.Nanoseconds()) / 1e3 / float64(cfg.N)
	if cfg.ServerProcess {
		res.ServerCPUusPerReq = float64(s1.CPUns-s0.CPUns) / 1e3 / float64(cfg.N)
	}
	if res.Errors > 0 {
		return fmt.Errorf("decision bench: %d of %d exchanges failed, the first: %w", res.Errors, cfg.N, firstErr)
	}
	return nil
}

// decisionBody is the benchmark's 8 KB chat body: a system line that makes
// each request distinct, then one long user message.
func decisionBody(series string, i int) []byte {
	b, _ := json.Marshal(map[string]any{"model": decisionModel, "stream": true, "messages": []map[string]string{
		{"role": "system", "content": fmt.Sprintf("%s %d: you are a helpful assistant.", series, i)},
		{"role": "user", "content": decisionParagraph},
	}})
	return b
}

var decisionParagraph = func() string {
	var para strings.Builder
	for i := 0; para.Len() < 7800; i++ {
		fmt.Fprintf(&para, "Paragraph %d: a router that knows which worker holds a prompt's prefix in its KV cache saves the prefill of that prefix. ", i)
	}
	return para.String()
}()

// decisionExchange runs one request through the ext_proc server up to its
// release towards the upstream (what Envoy waits for before connecting to
// the worker), then ends the stream, which frees the request.
func decisionExchange(ctx context.Context, c *extprocclient.Client, body []byte) (time.Duration, error) {
	start := time.Now()
	s := c.Open(ctx, nil)
	defer s.Close()
	hdr := extprocclient.Headers{
		{Key: ":method", Value: "POST"}, {Key: ":path", Value: "/v1/chat/completions"},
		{Key: ":authority", Value: "gateway.local"}, {Key: ":scheme", Value: "http"},
		{Key: "content-type", Value: "application/json"},
	}
	if err := s.SendRequestHeaders(ctx, hdr, false); err != nil {
		return 0, err
	}
	if err := s.SendRequestData(ctx, body, true); err != nil {
		return 0, err
	}
	routed := false
	for {
		f, err := s.ReadUpstream(ctx)
		switch {
		case errors.Is(err, io.EOF):
			if !routed {
				return 0, errors.New("request released without a destination")
			}
			return time.Since(start), nil
		case errors.Is(err, extprocclient.ErrLocalReply):
			lr := s.Info().LocalReply
			return 0, fmt.Errorf("local reply %d %s", lr.Status, lr.Body)
		case err != nil:
			return 0, err
		}
		if f.Kind == extprocclient.FrameHeaders {
			_, routed = f.Headers.Get("x-gateway-destination-endpoint")
		}
	}
}
