package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/lib/config"
	"github.com/kvgate/kvgate/localrouter"
	"github.com/kvgate/kvgate/mocker"
	"github.com/kvgate/kvgate/sim"
)

// runReplay replays a trace against simulated workers and compares routing
// policies (sim.Run), replays a global router configuration (--config), or
// sweeps parameters (--sweep, sim.Sweep).
func runReplay(ctx context.Context, args []string, x *extensions) error {
	return replayCmd(ctx, x, "replay", args, os.Stdout, os.Stderr)
}

// replayCmd is kvgate replay (cmdName: the command that runs it, for usage).
func replayCmd(ctx context.Context, x *extensions, cmdName string, args []string, stdout, stderr io.Writer) error {
	fs := config.NewFlagSet(cmdName, stderr)
	var (
		configPath  = fs.String("config", "", "replay this global router configuration (the real Decide: its pools, chain and pool policies) instead of --topology × --policies")
		poolWorkers = fs.String("pool-workers", "", "with --config: workers per pool, name=N,... (pools not named share --workers evenly)")
		models      = fs.String("models", "", "with --config: spread requests over models, name=weight,... (default: the configuration's first model)")
		priorityMix = fs.String("priority-mix", "", "with --config: spread requests over x-kvgate-priority values (read by the configuration's priority policy, and by the SLO figures), priority=weight,... e.g. 1=0.3,0=0.7 (default: no header)")
		tenantMix   = fs.String("tenant-mix", "", "with --config: spread requests over tenants by offered load, tenant=weight,... e.g. a=4,b=1,c=1,d=1 (a sends 4× each other's share), in the configuration's tenancy.header (x-tenant when it has none); read by the by_tenant figures and Jain's fairness index")
		load        = fs.String("load", "", "with --config: offer this multiple of the pools' capacity, which the replay measures first and prints (a backlog of the trace's requests at once; docs/replay.md), e.g. 0.7 or 2; replaces --rate")
		sloMS       = fs.String("slo-ms", "", "TTFT target in ms per priority, priority=ms,... e.g. 1=500,0=5000; read by slo_met_ratio and goodput_rps (default: the highest priority of the mix 2× the unloaded TTFT p99, the others 10×)")
		flowControl = fs.Bool("flow-control", false, "with --config: run the global router's flow-control queue in virtual time (requests to saturated pools wait instead of being shed); read by the config replay, set up by the file's flow_control section (its defaults when the section is off; docs/flow-control.md)")
		sweep       = fs.String("sweep", "", "run every combination of named parameters and print the Pareto front, e.g. 'credit=1,2,4,8;scale=1,4,8' (credit, scale, temp, predicted_ttl; with --config also chain.POLICY.KEY)")
		tracePath   = fs.String("trace", "", "trace file: Mooncake JSONL (timestamp, input_length, output_length, hash_ids) or a JSONL of prompts (text or token_ids)")
		generate    = fs.String("generate", "", "replay a generated trace instead of --trace: agentic or agentic:key=value,... (docs/replay.md)")
		generateOut = fs.String("generate-out", "", "also write the generated trace to this file as Mooncake JSONL")
		format      = fs.String("format", sim.FormatAuto, "trace format: auto, mooncake or prompts")
		strict      = fs.Bool("strict", false, "refuse the trace at the first malformed line (default: skip and report them)")
		traceBlock  = fs.Int("trace-block-size", sim.DefaultTraceBlockSize, "tokens per trace hash id")
		rate        = fs.String("rate", "1", "arrival rate multiplier, e.g. 2 or 2x (twice as fast)")
		maxRequests = fs.Int("max-requests", 0, "replay only the first N requests (0: all)")
		seed        = fs.Uint64("seed", 1, "seed of token expansion and every random choice")
		workers     = fs.Int("workers", 8, "simulated workers in total")
		topologies  = fs.String("topology", sim.TopologyFlat, "comma-separated topologies: flat, pools[=P], disagg[=prefill workers], tree=RxP (R region global routers of P pools each under a top global router, the real Decide at every floor; router policies only: kvgate, ttft:..., dynamo, kvgate-cost, cost:..., chain:...; docs/hierarchy.md)")
		policies    = fs.String("policies", "random,round-robin,least-loaded,kv-overlap,dynamo,kvgate", "comma-separated policies: random, round-robin, least-loaded, kv-overlap, dynamo, kvgate (predicted TTFT, each worker's timing calibrated online by its local router), kvgate-static (the shipped curves, no calibration), kvgate-oracle (each engine's true timing pinned: the bound), kvgate-hist (calibrated from the engines' time to first token histograms alone), kvgate-cost (its Dynamo-formula form), kvgate-no-tiers, kvgate-r1, ttft:ext=W[,calib=online|static|oracle|histograms], cost:credit=C,scale=S,temp=T,tiers=0|1, chain:<worker chain> (e.g. chain:cost=1/normalize=max,prefix=1,cold=0.3; docs/localrouter.md)")
		blockSize   = fs.Int("block-size", 16, "KV block size of workers and routers, in tokens (with --config: each pool's block_size instead, and this flag is refused)")
		kvTokens    = fs.Int("kv-tokens", 1<<20, "KV cache capacity of each worker, in tokens")
		cpuTokens   = fs.Int("cpu-kv-tokens", 0, "CPU KV tier of each worker, in tokens (0: none): GPU evictions offload there, hits reload; compare policies kvgate-cost and kvgate-no-tiers")
		maxSeqs     = fs.Int("max-num-seqs", 256, "running sequences per worker")
		maxBatched  = fs.Int("max-num-batched-tokens", 8192, "tokens computed per iteration per worker")
		speedup     = fs.Float64("speedup", 1, "divide the timing model's durations by this")
		engSpeeds   = fs.String("engine-speeds", "", "per-worker engine speed factors, one per worker, e.g. 1,1,1,1,0.5,0.5,0.5,0.5 (0.5: twice as slow); read by the simulated engines only, never told to the routers' scorers")
		engTiming   = fs.String("engine-timing", "", "YAML/JSON file of the engines' timing curves (mocker.Curves: prefill_ms and decode_ms {quadratic, linear, constant}, speedup); read by the simulated engines only, never told to the routers' scorers")
		engNoise    = fs.Float64("engine-noise", 0, "multiplicative noise on each engine iteration, uniform in [1-N, 1+N], deterministic by --seed; read by the simulated engines only")
		scrapeEvery = fs.Duration("engine-scrape-period", sim.DefaultScrapePeriod, "how often the routers read each engine's running, waiting and KV usage (as a local router's metrics scraper does; 0: never); read by worker chains using engine signals (saturation, waiting, kv-usage, running, ttft's KV usage) and the llm-d policy")
		scrapeDelay = fs.Duration("engine-scrape-delay", 0, "how late each scrape reaches the routers; read with --engine-scrape-period")
		eventDelay  = fs.Duration("event-delay", 0, "delay of KV events between a worker and its router")
		predTTL     = fs.Duration("predicted-ttl", 10*time.Second, "TTL of the routers' predicted index entries (0: none)")
		parallel    = fs.Int("parallel", 1, "simulations run at once")
		asJSON      = fs.Bool("json", false, "print the report as JSON instead of a table")
		jsonOut     = fs.String("json-out", "", "also write the report as JSON to this file")
		plot        = fs.String("plot", "", "write the TTFT CDF and hit ratio chart to this file: .svg or .png")
		showProg    = fs.Bool("progress", false, "draw a progress bar on stderr even when it is not a terminal")
	)
	if err := fs.Parse(args, os.Getenv); err != nil {
		return err
	}
	// Given: on the command line or from the environment (KVGATE_TOPOLOGY
	// set and --config given is the same contradiction as --topology).
	onCLI := map[string]bool{}
	for _, n := range []string{"topology", "policies", "rate", "engine-scrape-period", "engine-scrape-delay"} {
		onCLI[n] = fs.Given(n)
	}
	switch {
	case *configPath != "" && (onCLI["topology"] || onCLI["policies"]):
		return errors.New("--config replays the configuration's pools and chain: --topology and --policies do not apply")
	case *configPath != "" && fs.Given("block-size"):
		return errors.New("--config replays the configuration's pools, each with its own block_size: --block-size does not apply")
	case *configPath == "" && (*poolWorkers != "" || *models != "" || *priorityMix != "" || *tenantMix != "" || *load != "" || *flowControl):
		return errors.New("--pool-workers, --models, --priority-mix, --tenant-mix, --load and --flow-control need --config")
	case *load != "" && onCLI["rate"]:
		return errors.New("--load sets the arrival rate from the measured capacity: --rate does not apply")
	case *load != "" && *sweep != "":
		return errors.New("--load does not apply to --sweep")
	case *sweep != "" && onCLI["policies"]:
		return errors.New("--sweep makes its own cost policies: --policies does not apply")
	case *tracePath == "" && *generate == "":
		return errors.New("--trace or --generate is required")
	case *tracePath != "" && *generate != "":
		return errors.New("--trace and --generate are exclusive")
	case *generateOut != "" && *generate == "":
		return errors.New("--generate-out needs --generate")
	}
	var plotFormat sim.PlotFormat
	if *plot != "" {
		f, err := sim.PlotFormatOf(*plot)
		if err != nil {
			return fmt.Errorf("--plot: %w", err)
		}
		plotFormat = f
	}
	r, err := strconv.ParseFloat(strings.TrimSuffix(*rate, "x"), 64)
	if err != nil || r <= 0 {
		return fmt.Errorf("--rate %q: want a positive number such as 2 or 2x", *rate)
	}
	var loadX float64
	if *load != "" {
		if loadX, err = sim.ParseLoad(*load); err != nil {
			return fmt.Errorf("--load: %w", err)
		}
	}
	var slo map[int]float64
	if *sloMS != "" {
		if slo, err = sim.ParseSLO(*sloMS); err != nil {
			return fmt.Errorf("--slo-ms: %w", err)
		}
	}
	tops, err := sim.ParseTopologies(*topologies)
	if err != nil {
		return err
	}
	pols, err := sim.ParsePolicies(*policies)
	if err != nil {
		return err
	}
	var global *sim.GlobalReplay
	if *configPath != "" {
		gc, err := globalrouter.LoadConfig(*configPath, x.policyRegistry())
		if err != nil {
			return err
		}
		if err := gc.CheckWorkerChains(localrouter.PoolChainCheck(x.scorerRegistry())); err != nil {
			return err
		}
		global = &sim.GlobalReplay{Config: gc, Name: filepath.Base(*configPath), Policies: x.policyRegistry()}
		if reg := x.scorerRegistry(); reg != nil {
			global.Router = func(_ string, c *localrouter.Config) { c.Scorers = reg }
		}
		if *poolWorkers != "" {
			if global.PoolWorkers, err = sim.ParsePoolWorkers(*poolWorkers); err != nil {
				return fmt.Errorf("--pool-workers: %w", err)
			}
		}
		if *models != "" {
			if global.Models, err = sim.ParseShares("--models", *models); err != nil {
				return err
			}
		}
		if *priorityMix != "" {
			if global.Priorities, err = sim.ParseShares("--priority-mix", *priorityMix); err != nil {
				return err
			}
		}
		if *tenantMix != "" {
			if global.Tenants, err = sim.ParseShares("--tenant-mix", *tenantMix); err != nil {
				return err
			}
		}
	}
	var sweepParams []sim.SweepParam
	if *sweep != "" {
		if sweepParams, err = sim.ParseSweep(*sweep); err != nil {
			return fmt.Errorf("--sweep: %w", err)
		}
	}
	var trace *sim.Trace
	name := filepath.Base(*tracePath)
	if *generate != "" {
		ac, err := sim.ParseAgentic(*generate)
		if err != nil {
			return fmt.Errorf("--generate: %w", err)
		}
		if trace, err = sim.GenerateAgentic(ac); err != nil {
			return fmt.Errorf("--generate: %w", err)
		}
		name = *generate
		if *generateOut != "" {
			if err := writeFile(stderr, "the generated trace", *generateOut, trace.WriteMooncake); err != nil {
				return err
			}
		}
	} else {
		trace, err = sim.LoadTraceFile(*tracePath, sim.LoadOptions{Format: *format, Strict: *strict, BlockSize: *traceBlock})
		if err != nil {
			return err
		}
		for _, le := range trace.Skipped {
			fmt.Fprintf(stderr, "kvgate replay: %s: skipped %v\n", *tracePath, le)
		}
	}
	var prog io.Writer
	if *showProg || isTerminal(os.Stderr) {
		prog = os.Stderr
	}
	if *predTTL < 0 {
		return fmt.Errorf("--predicted-ttl %v: want ≥ 0", *predTTL)
	}
	pttl := *predTTL
	if pttl == 0 {
		pttl = -1
	}
	engines, err := engineProfile(*engSpeeds, *engTiming, *engNoise, *scrapeEvery, *scrapeDelay, *maxBatched)
	if err != nil {
		return err
	}
	cfg := sim.Config{
		Trace: trace, TraceName: name, Rate: r, MaxRequests: *maxRequests, Seed: *seed,
		Workers: *workers, Topologies: tops, Policies: pols, BlockSize: *blockSize, KVTokens: *kvTokens, CPUKVTokens: *cpuTokens,
		MaxNumSeqs: *maxSeqs, MaxNumBatchedTokens: *maxBatched, Speedup: *speedup, EventDelay: *eventDelay, PredictedTTL: pttl,
		Parallel: *parallel, Progress: prog, Global: global, Load: loadX, SLOMS: slo, FlowControl: *flowControl, Engines: engines,
	}
	readers := cfg.SignalReaders()
	switch {
	case *configPath != "":
	case (onCLI["engine-scrape-period"] || onCLI["engine-scrape-delay"]) && *scrapeEvery > 0 && len(readers) == 0:
		fmt.Fprintln(stderr, "kvgate replay: warning: --engine-scrape-period/--engine-scrape-delay set, but no policy replayed reads engine signals (llm-d, kvgate/ttft, chains with waiting, running, kv-usage, saturation thresholds or lora)")
	case *scrapeEvery == 0 && len(readers) > 0:
		fmt.Fprintf(stderr, "kvgate replay: warning: %s read engine signals, which --engine-scrape-period 0 never delivers\n", strings.Join(readers, ", "))
	}
	if sweepParams != nil {
		if *plot != "" {
			return errors.New("--plot does not apply to --sweep")
		}
		cfg.Progress = nil // one bar per combination would interleave
		sw, err := sim.Sweep(ctx, cfg, sweepParams)
		if err != nil {
			return err
		}
		if *jsonOut != "" {
			if err := writeFile(stderr, "the sweep as JSON", *jsonOut, sw.WriteJSON); err != nil {
				return err
			}
		}
		if *asJSON {
			return sw.WriteJSON(stdout)
		}
		return sw.WriteTable(stdout)
	}
	rep, err := sim.Run(ctx, cfg)
	if err != nil {
		return err
	}
	if *plot != "" {
		err := writeFile(stderr, "the TTFT CDF and hit ratio chart", *plot, func(w io.Writer) error { return rep.WritePlot(w, plotFormat) })
		if err != nil {
			return err
		}
	}
	if *jsonOut != "" {
		if err := writeFile(stderr, "the report as JSON", *jsonOut, rep.WriteJSON); err != nil {
			return err
		}
	}
	if *asJSON {
		return rep.WriteJSON(stdout)
	}
	return rep.WriteTable(stdout)
}

// engineProfile builds the replay's engine profile from its flags.
func engineProfile(speeds, timingFile string, noise float64, period, delay time.Duration, maxBatched int) (sim.EngineProfile, error) {
	p := sim.EngineProfile{Noise: noise, ScrapePeriod: period, ScrapeDelay: delay}
	switch {
	case period < 0:
		return p, fmt.Errorf("--engine-scrape-period %v: want ≥ 0 (0: never)", period)
	case period == 0 && delay != 0:
		return p, errors.New("--engine-scrape-delay needs --engine-scrape-period > 0: without scrapes no signal is delayed")
	case period == 0:
		p.ScrapePeriod = -1
	}
	if speeds != "" {
		s, err := sim.ParseEngineSpeeds(speeds)
		if err != nil {
			return p, fmt.Errorf("--engine-speeds: %w", err)
		}
		p.Speeds = s
	}
	if timingFile != "" {
		data, err := os.ReadFile(timingFile)
		if err != nil {
			return p, fmt.Errorf("--engine-timing: %w", err)
		}
		c, err := mocker.ParseCurves(timingFile, data, maxBatched)
		if err != nil {
			return p, fmt.Errorf("--engine-timing: %w", err)
		}
		p.Timing, p.TimingName = &c, filepath.Base(timingFile)
	}
	return p, nil
}

func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// writeFile writes path with write, then says on log what it wrote
// where (the absolute path), so a --plot or --json-out is found.
func writeFile(log io.Writer, what, path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if abs, err := filepath.Abs(path); err == nil {
		path = abs
	}
	fmt.Fprintf(log, "wrote %s to %s\n", what, path)
	return nil
}
