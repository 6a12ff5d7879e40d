package app

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/benchfig"
	"github.com/kvgate/kvgate/internal/chaos"
	"github.com/kvgate/kvgate/internal/loadbench"
	"github.com/kvgate/kvgate/internal/overload"
	"github.com/kvgate/kvgate/lib/config"
	"github.com/kvgate/kvgate/localrouter"
	"github.com/kvgate/kvgate/sim"
)

// runBench measures the local router's four headline figures without the
// Go toolchain (the same workload as `make bench`; see BENCHMARKS.md), or,
// with -chaos, runs the load-and-chaos bench (internal/chaos).
func runBench(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	n := fs.Int("n", 20000, "calls per latency figure")
	applyFor := fs.Duration("apply-for", 2*time.Second, "how long to measure event apply throughput")
	cc := chaos.DefaultConfig()
	withChaos := fs.Bool("chaos", false, "run the load-and-chaos bench: `kvgate up` in process, -streams concurrent streams for -duration, the -kill faults in turn")
	fs.IntVar(&cc.Streams, "streams", cc.Streams, "chaos: concurrent streaming clients")
	fs.DurationVar(&cc.Duration, "duration", cc.Duration, "chaos: how long the clients send")
	kill := fs.String("kill", "router,worker,nats,etcd", "chaos: faults injected in turn (router, worker, nats, etcd; empty for none)")
	fs.DurationVar(&cc.Hold, "hold", cc.Hold, "chaos: how long each killed part stays down")
	fs.IntVar(&cc.MaxTokens, "max-tokens", cc.MaxTokens, "chaos: max_tokens of each request")
	fs.Float64Var(&cc.Up.Speedup, "speedup", cc.Up.Speedup, "chaos: speed-up factor of the mock workers")
	fs.DurationVar(&cc.ErrorPause, "error-pause", cc.ErrorPause, "chaos: a client's pause after a failed request before its next (0: retry at once)")
	fs.DurationVar(&cc.Up.ProbeTimeout, "probe-timeout", 0, "chaos: the global router's probe deadline (0: its default)")
	fs.BoolVar(&cc.Accounting, "accounting", false, "chaos: sample the local routers' in-flight count and the engines' running+waiting every 100 ms, record every request's router commit and free and engine admission and departure (joined by x-request-id), and report how they compare, per sample and per request (issue 27 item 4); without -kill it runs no fault")
	probe := fs.Bool("probe", false, "side-by-side probe benchmark: the local-router channel against unary BestWorker on the same index")
	rate := fs.Int("rate", 5000, "probe: probes per second offered; decision: requests per second (default 1000 there)")
	probes := fs.Int("probes", 20000, "probe: probes per mode")
	packed := fs.Bool("packed-hashes", false, "probe: send the channel's hashes as packed bytes, not the repeated field")
	serverProc := fs.Bool("probe-server-process", false, "probe: serve the local router from a child process, and print each end's CPU apart")
	decision := fs.Bool("decision", false, "decision benchmark: the Envoy-faithful client sends 8 KB chat requests to kvgate's ext_proc server, global router and local routers (-decision-pools × -decision-workers): -decision-sequential one at a time (the decision's parts: tokenize, round trips, gRPC floor), then -decision-n at -rate per second")
	decisionN := fs.Int("decision-n", 3000, "decision: requests")
	decisionProfile := fs.String("decision-server-profile", "", "decision: a file for a CPU profile of kvgate's process over the paced window")
	decisionProc := fs.Bool("decision-server-process", true, "decision: run kvgate's side in a child process, as a real Envoy is a process of its own (false: one process, one heap)")
	soak := fs.Int("soak", 0, "soak benchmark: this many concurrent streaming requests through ext_proc to mock workers")
	soakHold := fs.Duration("soak-hold", 30*time.Second, "soak: how long the streams are held")
	soakSpeedup := fs.Float64("soak-speedup", 0.002, "soak: the mock workers' timing speedup (below 1: slower than a GPU, so thousands of held streams decode a token every few seconds)")
	soakOpening := fs.Int("soak-opening", 1024, "soak: streams opening at once during the ramp")
	soakSteady := fs.Duration("soak-steady-every", 50*time.Millisecond, "soak: one short request this often while the streams are held, for the steady-state decision figures (negative: none)")
	soakProfile := fs.String("soak-profile", "", "soak: a directory for a CPU profile of the ramp and goroutine dumps (what the ramp waits on)")
	soakChannel := fs.Bool("soak-channel", true, "soak: the global router uses the local-router channel (false: unary probes and Track streams)")
	soakHTTP2 := fs.Bool("soak-http2", true, "soak: the load client and the gateway's upstream speak h2c (HTTP/2 multiplexed over a few connections; false: HTTP/1.1, ~4 fds per stream)")
	commit := fs.String("commit", "", "decision, active-active (read by those only): the global routers' probe.commit, one mode or several run in turn (decide,pipelined; reserve once the global router accepts it); default: -probe-config's, else decide")
	probeConfig := fs.String("probe-config", "", "decision, active-active (read by those only): a YAML file with the global routers' probe section (probe: {commit: ..., timeout: ...}); -commit overrides its commit")
	decisionPools := fs.String("decision-pools", "2", "decision: pools, one count or several run in turn (1,2)")
	decisionWorkers := fs.Int("decision-workers", 8, "decision: workers per pool")
	decisionSeq := fs.Int("decision-sequential", 300, "decision: exchanges run one at a time before the paced window, on which the decision's parts are measured (tokenize, round trips, gRPC floor)")
	activeActive := fs.Int("active-active", 0, "active-active burst: this many global routers, each behind its own ext_proc server, on the same local routers, a burst of -aa-burst identical long prompts split among them (0: off)")
	aaRuns := fs.Int("aa-runs", 30, "active-active: bursts per commit mode, each on fresh global routers")
	aaBurst := fs.Int("aa-burst", 64, "active-active: requests per burst")
	aaPools := fs.String("aa-pools", "4", "active-active: workers per pool, one count per pool (2,2: two pools of 2)")
	aaKill := fs.Bool("aa-kill", false, "active-active: kill global router 0 once it routed half its share, each burst (its channels and streams cut)")
	aaProcess := fs.Bool("aa-process", false, "active-active: run each global router and its ext_proc server in a child process (killed with SIGKILL); false: in this process")
	oc := overload.DefaultConfig()
	withOverload := fs.Bool("overload", false, "overload bench (issue 24): measure the capacity of `kvgate up` (in the process, or -overload-addr), then offer -load × it with the -priority-mix and -tenant-mix headers, and report TTFT, refusals, SLO, goodput and fairness per priority and tenant, and every router's in-flight count after (docs/replay-results.md)")
	fs.StringVar(&oc.Addr, "overload-addr", "", "overload: a running gateway's base URL, e.g. http://127.0.0.1:8080 (default: start `kvgate up` in the process: 2 pools of 1 mock worker, 4 sequences each, a chain that sheds)")
	fs.StringVar(&oc.Admin, "overload-admin", "", "overload: with -overload-addr, the admin base URL whose /kvgate/status.json gives each pool's in-flight count, e.g. http://127.0.0.1:8081 (empty: not checked)")
	fs.StringVar(&oc.TrustToken, "trust-token", os.Getenv("KVGATE_TRUST_TOKEN"), "overload: the x-kvgate-trust token the requests carry, so their tenant and priority headers are believed (env KVGATE_TRUST_TOKEN; in the process a random one is made)")
	fs.StringVar(&oc.TenantHeader, "tenant-header", oc.TenantHeader, "overload: the tenancy header the tenant goes in (the gateway's tenancy.header)")
	fs.StringVar(&oc.Model, "model", "", "overload: the model requested (default: the system's)")
	prioMix := fs.String("priority-mix", "1=0.3,0=0.7", "overload: x-kvgate-priority values by weight (empty: no header)")
	tenantMix := fs.String("tenant-mix", "a=4,b=1,c=1,d=1", "overload: tenants by offered load (empty: no header)")
	sloMS := fs.String("slo-ms", "", "overload: TTFT target in ms per priority, e.g. 1=500,0=5000 (default: the highest priority 2×, the others 10× the slowest of 8 unloaded requests)")
	loadX := fs.String("load", "2", "overload: the offered rate as a multiple of the measured capacity")
	fs.DurationVar(&oc.Duration, "overload-duration", oc.Duration, "overload: how long the load is offered")
	fs.DurationVar(&oc.Calibration, "overload-calibration", oc.Calibration, "overload: how long the closed-loop calibration runs (the capacity is its second half's completion rate)")
	fs.IntVar(&oc.CalibrationStreams, "overload-streams", oc.CalibrationStreams, "overload: the calibration's closed-loop clients")
	fs.IntVar(&oc.MaxTokens, "overload-max-tokens", oc.MaxTokens, "overload: max_tokens of each request")
	fs.BoolVar(&oc.Up.FlowControl.Enabled, "overload-flow-control", false, "overload: turn the in-process `kvgate up`'s flow control on (its global router's flow_control section, defaults: requests to saturated pools wait instead of being shed; docs/flow-control.md); read by the in-process system only, refused with -overload-addr")
	idle := fs.Int("idle", 0, "idle-streams benchmark: open this many silent ext_proc streams against an ext_proc server bounded by -idle-max-streams and -idle-request-timeout; heap and goroutines before, held and after")
	var ic loadbench.IdleConfig
	fs.IntVar(&ic.MaxStreams, "idle-max-streams", 2000, "idle: the server's -max-streams (below -idle)")
	fs.DurationVar(&ic.RequestTimeout, "idle-request-timeout", 5*time.Second, "idle: the server's -stream-request-timeout")
	fs.IntVar(&ic.Conns, "idle-conns", 100, "idle: gRPC connections the streams are spread over")
	fs.IntVar(&ic.Rounds, "idle-rounds", 2, "idle: rounds of -idle streams in turn (the heap after each later round is compared with the first's)")
	asJSON := fs.Bool("json", false, "active-active, chaos, decision, idle, probe, soak, overload: print the report as JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if chosen := countTrue(*probe, *soak > 0, *decision, *idle > 0, *withOverload, *withChaos, *activeActive > 0); chosen > 1 {
		return fmt.Errorf("-probe, -soak, -decision, -idle, -overload, -chaos and -active-active: choose one")
	}
	headline := countTrue(*probe, *soak > 0, *decision, *idle > 0, *withOverload, *withChaos, *activeActive > 0) == 0
	for _, only := range []struct {
		on    bool
		mode  string
		flags []string
	}{
		{*decision || *activeActive > 0, "-decision or -active-active", []string{"commit", "probe-config"}},
		{*decision, "-decision", []string{"decision-pools", "decision-workers", "decision-sequential", "decision-n", "decision-server-profile", "decision-server-process"}},
		{*activeActive > 0, "-active-active", []string{"aa-runs", "aa-burst", "aa-pools", "aa-kill", "aa-process"}},
		{*probe || *decision, "-probe or -decision", []string{"rate"}},
		{*probe, "-probe", []string{"probes", "packed-hashes", "probe-server-process"}},
		{*soak > 0, "-soak", []string{"soak-hold", "soak-speedup", "soak-opening", "soak-steady-every", "soak-profile", "soak-channel", "soak-http2"}},
		{*withChaos, "-chaos", []string{"streams", "duration", "kill", "hold", "max-tokens", "speedup", "error-pause", "probe-timeout"}},
		{headline, "the headline figures (no mode flag)", []string{"n", "apply-for"}},
		{!headline, "the modes (-probe, -decision, -soak, -idle, -overload, -chaos, -active-active)", []string{"json"}},
	} {
		for _, name := range only.flags {
			if !only.on && flagSet(fs, name) {
				return fmt.Errorf("-%s is read by %s only", name, only.mode)
			}
		}
	}
	if !(*idle > 0) && (flagSet(fs, "idle-max-streams") || flagSet(fs, "idle-request-timeout") || flagSet(fs, "idle-conns") || flagSet(fs, "idle-rounds")) {
		return fmt.Errorf("-idle-max-streams, -idle-request-timeout, -idle-conns and -idle-rounds are read by -idle only")
	}
	if *idle > 0 {
		ic.Streams = *idle
		return benchIdle(ctx, ic, *asJSON)
	}
	if *withOverload {
		return benchOverload(ctx, oc, *prioMix, *tenantMix, *sloMS, *loadX, *asJSON)
	}
	for _, name := range []string{"overload-addr", "overload-admin", "trust-token", "tenant-header", "model", "priority-mix", "tenant-mix", "slo-ms", "load",
		"overload-duration", "overload-calibration", "overload-streams", "overload-max-tokens", "overload-flow-control"} {
		if flagSet(fs, name) {
			return fmt.Errorf("-%s is read by -overload only", name)
		}
	}
	modes, err := commitModes(*commit)
	if err != nil {
		return err
	}
	if *decision {
		r := *rate
		if !flagSet(fs, "rate") {
			r = 1000
		}
		pools, err := counts("-decision-pools", *decisionPools)
		if err != nil {
			return err
		}
		return benchDecision(ctx, loadbench.DecisionConfig{Rate: r, N: *decisionN, ServerProcess: *decisionProc, ServerProfile: *decisionProfile,
			Workers: *decisionWorkers, Sequential: *decisionSeq, ProbeFile: *probeConfig}, modes, pools, *asJSON)
	}
	if *activeActive > 0 {
		pools, err := counts("-aa-pools", *aaPools)
		if err != nil {
			return err
		}
		var pc globalrouter.ProbeConfig
		if *probeConfig != "" {
			if pc, err = loadbench.LoadProbeConfig(*probeConfig); err != nil {
				return err
			}
		}
		return benchActiveActive(ctx, loadbench.ActiveActiveConfig{Routers: *activeActive, Pools: pools, Burst: *aaBurst, Runs: *aaRuns, Kill: *aaKill, Process: *aaProcess, Probe: pc}, modes, *asJSON)
	}
	if *probe {
		return benchProbe(ctx, loadbench.ProbeConfig{Rate: *rate, N: *probes, PackedHashes: *packed, ServerProcess: *serverProc}, *asJSON)
	}
	if *soak > 0 {
		return benchSoak(ctx, loadbench.SoakConfig{Streams: *soak, Hold: *soakHold, Channel: *soakChannel, Speedup: *soakSpeedup, ProfileDir: *soakProfile,
			Opening: *soakOpening, SteadyEvery: *soakSteady, HTTP2: *soakHTTP2,
			Progress: slog.New(slog.NewTextHandler(os.Stderr, nil))}, *asJSON)
	}
	if cc.Accounting && !*withChaos {
		return errors.New("-accounting: needs -chaos (it samples the chaos run)")
	}
	if *withChaos {
		cc.Kill = config.SplitList(*kill)
		if cc.Accounting && !flagSet(fs, "kill") {
			cc.Kill = nil // a stopped router or killed worker is not an accounting difference
		}
		fmt.Fprintf(os.Stderr, "chaos: %d streams for %v, faults %v (%v each)…\n", cc.Streams, cc.Duration, cc.Kill, cc.Hold)
		rep, err := chaos.Run(ctx, cc)
		if err != nil {
			return err
		}
		if *asJSON {
			enc := json.NewEncoder(os.Stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(rep)
		}
		rep.Print(os.Stdout)
		return nil
	}
	if *n < 100 {
		return fmt.Errorf("-n %d: need at least 100 calls", *n)
	}
	fmt.Fprintf(os.Stderr, "building the index (%d prompts × %d blocks over %d workers)…\n", benchfig.Prompts, benchfig.Blocks, benchfig.Workers)
	w, err := benchfig.BuildWorld()
	if err != nil {
		return err
	}
	defer w.Router.Close()
	if err := w.AddActive(ctx); err != nil {
		return err
	}
	ix := w.Router.Index()
	var m localrouter.Matches
	find := benchfig.Measure(*n, func(i int) { ix.FindMatches(w.Prompts[(i*31)%len(w.Prompts)].Local, &m) })
	best := benchfig.Measure(*n, func(i int) {
		p := w.Prompts[(i*31)%len(w.Prompts)]
		w.Router.BestWorker(ctx, localrouter.Request{LocalHashes: p.Local, BlockSize: benchfig.BlockSize}, localrouter.BestWorkerOptions{})
	})
	apply := benchfig.ApplyThroughput(w.Prompts[:400], *applyFor)
	fmt.Printf("index: %d blocks, %d (block, worker) entries over %d workers\n", w.Stats.Nodes, w.Stats.Entries, benchfig.Workers)
	fmt.Printf("%-44s %12s %12s %s\n", "figure", "measured", "target", "")
	row := func(name, got, target string, ok bool) {
		mark := "met"
		if !ok {
			mark = "MISSED"
		}
		fmt.Printf("%-44s %12s %12s %s\n", name, got, target, mark)
	}
	row("FindMatches 512 blocks, p50", find.P50.String(), "≤ 10µs", find.P50 <= 10*time.Microsecond)
	row("FindMatches 512 blocks, p99", find.P99.String(), "", true)
	row("event apply, stored blocks/s (one core)", fmt.Sprintf("%.2fM", apply/1e6), "≥ 2M", apply >= 2e6)
	row("memory per (block, worker) entry", fmt.Sprintf("%.1f B", w.BytesPerEntry), "≤ 120 B", w.BytesPerEntry <= 120)
	row("BestWorker 64 workers, 200 active, p50", best.P50.String(), "≤ 25µs", best.P50 <= 25*time.Microsecond)
	row("BestWorker 64 workers, 200 active, p99", best.P99.String(), "", true)
	return nil
}

// benchProbe prints the side-by-side probe figures.
func benchProbe(ctx context.Context, cfg loadbench.ProbeConfig, asJSON bool) error {
	fmt.Fprintf(os.Stderr, "building the index, then %d probes per mode at %d/s, channel and unary alternating…\n", cfg.N, cfg.Rate)
	res, err := loadbench.Probe(ctx, cfg)
	if err != nil {
		return err
	}
	if asJSON {
		return json.NewEncoder(os.Stdout).Encode(res)
	}
	fmt.Printf("%-10s %10s %10s %14s %21s %10s %7s\n", "mode", "p50", "p99", "CPU/probe", "client / server CPU", "rate", "errors")
	for _, r := range []struct {
		name string
		f    loadbench.ProbeFigures
	}{{"channel", res.Channel}, {"unary", res.Unary}, {"harness", res.Harness}, {"grpc-floor", res.GRPCFloor}} {
		split := "-"
		if cfg.ServerProcess && r.name != "harness" {
			split = fmt.Sprintf("%.1fµs / %.1fµs", r.f.ClientCPUusPerProbe, r.f.ServerCPUusPerProbe)
		}
		fmt.Printf("%-10s %8.0fµs %8.0fµs %12.1fµs %21s %9.0f/s %7d\n", r.name, r.f.P50us, r.f.P99us, r.f.CPUusPerProbe, split, r.f.Rate, r.f.Errors)
	}
	fmt.Println("harness: the same pacing with a probe that does nothing (its CPU is in the others' too)")
	fmt.Println("grpc-floor: a probe-sized request and an empty answer on a bare gRPC stream to the same server: the transport alone")
	if res.Channel.P99us > 0 && res.Channel.CPUusPerProbe > 0 {
		fmt.Printf("unary/channel: p99 ×%.2f, CPU ×%.2f (targets: channel p99 ≤ 300µs, CPU/probe ≤ 25µs)\n",
			res.Unary.P99us/res.Channel.P99us, res.Unary.CPUusPerProbe/res.Channel.CPUusPerProbe)
	}
	return nil
}

func countTrue(b ...bool) int {
	n := 0
	for _, x := range b {
		if x {
			n++
		}
	}
	return n
}

func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// benchDecision prints the decision figures of each commit mode and
// number of pools.
func benchDecision(ctx context.Context, cfg loadbench.DecisionConfig, modes []globalrouter.CommitMode, pools []int, asJSON bool) error {
	fmt.Fprintf(os.Stderr, "decision: commit %v, pools %v: %d sequential, then %d requests at %d/s (kvgate in its own process: %v); load average %s\n",
		modes, pools, cfg.Sequential, cfg.N, cfg.Rate, cfg.ServerProcess, loadbench.LoadAverage())
	rep, err := loadbench.DecisionModes(ctx, cfg, modes, pools)
	if err != nil {
		return err
	}
	if asJSON {
		return json.NewEncoder(os.Stdout).Encode(rep)
	}
	for _, res := range rep.Runs {
		fmt.Printf("commit %s, %d pool(s) × %d workers; load average %s\n", res.Commit, res.Pools, res.Workers, res.LoadAverage)
		fmt.Printf("  sequential (%d): decision p50 %.0fµs p99 %.0fµs; tokenize p50 %.0fµs; gRPC floor p50 %.0fµs (back to back %.0fµs, %d B)\n",
			res.Sequential, res.DecisionP50us, res.DecisionP99us, res.TokenizeP50us, res.GRPCFloorP50us, res.GRPCFloorBackToBackP50us, res.ProbeBytes)
		fmt.Printf("  round trips waited per decision %.2f, messages not waited %.2f; target decision p50 ≤ tokenize + 1.3 × floor = %.0fµs: %s\n",
			res.RoundTripsPerDecision, res.UnwaitedPerDecision, res.TargetDecisionP50us, metOrMissed(res.TargetMet))
		fmt.Printf("  paced: exchange p50 %.0fµs p99 %.0fµs; decision p50 %.0fµs p99 %.0fµs; %.0f req/s held; messages per request %v; %d best-effort (no probe answered in time)\n",
			res.ExchangeP50us, res.ExchangeP99us, res.PacedDecisionP50us, res.PacedDecisionP99us, res.Rate, res.MessagesPerRequest, res.BestEffort)
		if res.ServerProcess {
			fmt.Printf("  CPU per request: client %.0fµs, kvgate %.0fµs", res.ClientCPUusPerReq, res.ServerCPUusPerReq)
		} else {
			fmt.Printf("  CPU per request (client and kvgate in one process): %.0fµs", res.ClientCPUusPerReq)
		}
		if res.CPUvsDecide > 0 {
			fmt.Printf(" (×%.2f decide's)", res.CPUvsDecide)
		}
		fmt.Println()
	}
	return nil
}

func metOrMissed(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}

// benchActiveActive runs and prints the active-active bursts of each
// commit mode.
func benchActiveActive(ctx context.Context, cfg loadbench.ActiveActiveConfig, modes []globalrouter.CommitMode, asJSON bool) error {
	fmt.Fprintf(os.Stderr, "active-active: %d global routers (child processes: %v), pools %v, %d runs of %d per mode %v (kill: %v); load average %s\n",
		cfg.Routers, cfg.Process, cfg.Pools, cfg.Runs, cfg.Burst, modes, cfg.Kill, loadbench.LoadAverage())
	var all []loadbench.ActiveActiveResult
	for _, m := range modes {
		c := cfg
		if m != "" {
			c.Probe.Commit = m
		}
		res, err := loadbench.ActiveActive(ctx, c)
		if err != nil {
			return err
		}
		all = append(all, res)
	}
	if asJSON {
		return json.NewEncoder(os.Stdout).Encode(all)
	}
	fmt.Printf("%-10s %5s %10s %11s %18s %6s %11s %7s  %s\n", "commit", "runs", "even runs", "exact runs", "max on one worker", "moved", "held twice", "failed", "first run's placement")
	for _, r := range all {
		moved, twice, failed := 0, 0, 0
		for _, run := range r.Runs {
			moved, twice, failed = moved+run.Moved, max(twice, run.HeldTwice), failed+run.Failed
		}
		fmt.Printf("%-10s %5d %10d %11d %18d %6d %11d %7d  %v\n", r.Commit, len(r.Runs), r.EvenRuns, r.ExactRuns, r.MaxOnOneWorker, moved, twice, failed, r.Runs[0].Placed)
		for i, run := range r.Runs {
			for _, v := range run.Violations {
				fmt.Printf("  run %d: %s\n", i, v)
			}
		}
	}
	fmt.Printf("even: every worker got %d / workers; exact: every in-flight count matched the client's during (sampled), at the hold and after (0)\n", cfg.Burst)
	fmt.Println("moved: contended commits moved to another pool (decide over several pools), each held on two pools for a moment; held twice: the most requests the local routers held above the exchanges opened; failed: the killed router's exchanges not routed")
	return nil
}

// commitModes is -commit's list ("": one run with the configuration's
// mode).
func commitModes(s string) ([]globalrouter.CommitMode, error) {
	if s == "" {
		return []globalrouter.CommitMode{""}, nil
	}
	var out []globalrouter.CommitMode
	for _, m := range config.SplitList(s) {
		if err := loadbench.CheckCommitMode(globalrouter.CommitMode(m)); err != nil {
			return nil, fmt.Errorf("-commit %s: %w", m, err)
		}
		out = append(out, globalrouter.CommitMode(m))
	}
	return out, nil
}

// counts is a flag's comma-separated list of positive counts.
func counts(flagName, s string) ([]int, error) {
	var out []int
	for _, f := range config.SplitList(s) {
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%s %q: want positive counts separated by commas", flagName, s)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: empty", flagName)
	}
	return out, nil
}

// benchSoak prints the soak's figures.
func benchSoak(ctx context.Context, cfg loadbench.SoakConfig, asJSON bool) error {
	fmt.Fprintf(os.Stderr, "soak: %d concurrent streams held %v (channel %v); load average %s\n", cfg.Streams, cfg.Hold, cfg.Channel, loadbench.LoadAverage())
	res, err := loadbench.Soak(ctx, cfg)
	if err != nil {
		return err
	}
	if asJSON {
		return json.NewEncoder(os.Stdout).Encode(res)
	}
	fmt.Printf("streams held:             %d (failed %d)\n", res.Streams, res.Failed)
	if res.FirstError != "" {
		fmt.Printf("first failure:            %s\n", res.FirstError)
	}
	fmt.Printf("router heap per stream:   %.0f B (target ≤ 64 KB); whole process %.0f B\n", res.HeapBytesPerStream, res.AllHeapBytesPerStream)
	fmt.Printf("router goroutines/stream: %.2f (target ≤ 4); all goroutines/stream %.2f\n", res.GoroutinesPerStream, res.AllGoroutinesPerStream)
	fmt.Printf("ramp:                     %.1f s\n", res.RampSeconds)
	fmt.Printf("decision p99:             %.0f µs (whole run)\n", res.DecisionP99us)
	fmt.Printf("ramp decisions:           p50 %.0f µs, p99 %.0f µs\n", res.RampDecisionP50us, res.RampDecisionP99us)
	fmt.Printf("steady decisions:         %d, p50 %.0f µs, p99 %.0f µs (%d failed)\n", res.SteadyDecisions, res.SteadyDecisionP50us, res.SteadyDecisionP99us, res.SteadyFailed)
	fmt.Printf("CPU per stream:           %.0f µs\n", res.CPUusPerStream)
	fmt.Printf("leaked requests:          %d (want 0)\n", res.LeakedRequests)
	return nil
}

// benchIdle prints the idle-streams figures.
func benchIdle(ctx context.Context, cfg loadbench.IdleConfig, asJSON bool) error {
	fmt.Fprintf(os.Stderr, "idle: %d rounds of %d silent ext_proc streams over %d connections, server -max-streams %d -stream-request-timeout %v; load average %s\n",
		cfg.Rounds, cfg.Streams, cfg.Conns, cfg.MaxStreams, cfg.RequestTimeout, loadAverage())
	res, err := loadbench.Idle(ctx, cfg)
	if err != nil {
		return err
	}
	if asJSON {
		return json.NewEncoder(os.Stdout).Encode(res)
	}
	mb := func(b uint64) float64 { return float64(b) / (1 << 20) }
	fmt.Printf("streams:          %d: refused %d (max_streams), closed %d (request_timeout), other %d %s\n", res.Streams, res.Refused, res.Closed, res.Other, res.FirstOther)
	fmt.Printf("server counted:   max_streams %.0f, request_timeout %.0f\n", res.ServerRefused["max_streams"], res.ServerRefused["request_timeout"])
	fmt.Printf("closed after:     %v to %v (bound %v)\n", res.ClosedAfterMin.Round(time.Millisecond), res.ClosedAfterMax.Round(time.Millisecond), res.RequestTimeout)
	fmt.Printf("heap (after GC):  before %.2f MB, held %.2f MB (first round), after", mb(res.HeapBefore), mb(res.HeapHeld))
	for i, h := range res.HeapAfterRounds {
		fmt.Printf(" round %d %.2f MB", i+1, mb(h))
	}
	fmt.Println()
	fmt.Printf("goroutines:       before %d, held %d, after %d\n", res.GoroutinesBefore, res.GoroutinesHeld, res.GoroutinesAfter)
	fmt.Printf("streams active:   held %.0f, after %.0f\n", res.ActiveHeld, res.ActiveAfter)
	fmt.Printf("elapsed:          %v; load average after %s\n", res.Elapsed.Round(time.Millisecond), loadAverage())
	return nil
}

// loadAverage is /proc/loadavg's first three fields ("?" elsewhere).
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// benchOverload parses the overload flags that need it and prints the
// overload bench's report.
func benchOverload(ctx context.Context, oc overload.Config, prioMix, tenantMix, sloMS, loadX string, asJSON bool) error {
	var err error
	oc.Priorities, oc.Tenants = nil, nil
	if prioMix != "" {
		if oc.Priorities, err = sim.ParseShares("-priority-mix", prioMix); err != nil {
			return err
		}
	}
	if tenantMix != "" {
		if oc.Tenants, err = sim.ParseShares("-tenant-mix", tenantMix); err != nil {
			return err
		}
	}
	if sloMS != "" {
		if oc.SLOMS, err = sim.ParseSLO(sloMS); err != nil {
			return fmt.Errorf("-slo-ms: %w", err)
		}
	}
	if oc.Load, err = sim.ParseLoad(loadX); err != nil {
		return fmt.Errorf("-load: %w", err)
	}
	where := "kvgate up in the process"
	switch {
	case oc.Addr != "":
		where = oc.Addr
	case oc.Up.FlowControl.Enabled:
		where += ", flow control on"
	}
	fmt.Fprintf(os.Stderr, "overload: %s; calibrating %v with %d streams, then %gx for %v; load average %s\n", where, oc.Calibration, oc.CalibrationStreams, oc.Load, oc.Duration, loadAverage())
	rep, err := overload.Run(ctx, oc)
	if err != nil {
		return err
	}
	if asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	rep.Print(os.Stdout)
	return nil
}
