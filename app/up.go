package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/kvgate/kvgate/envoy/gateway"
	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/extprocd"
	"github.com/kvgate/kvgate/internal/tracing"
	"github.com/kvgate/kvgate/internal/up"
	"github.com/kvgate/kvgate/lib/config"
	"github.com/kvgate/kvgate/localrouter"
	"github.com/kvgate/kvgate/mocker"
)

// runUp starts the whole system locally (`make run`): flags → up.Config →
// up.Run.
func runUp(ctx context.Context, args []string, x *extensions) error {
	cfg, otlp, err := parseUp(args, x)
	if err != nil {
		return err
	}
	tp, err := tracing.Setup(ctx, tracing.Options{Endpoint: otlp, Insecure: true, Service: "kvgate-up"})
	if err != nil {
		return err
	}
	if tp != nil {
		defer func() {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_ = tp.Shutdown(sctx) // flushes what is batched, or gives up
		}()
		cfg.TracerProvider = tp
	}
	return up.Run(ctx, cfg, os.Stdout, 15*time.Second)
}

// parseUp is the system `kvgate up` args ask for, and the OTLP endpoint
// to trace it to.
func parseUp(args []string, x *extensions) (up.Config, string, error) {
	return parseUpTo(args, x, os.Stderr)
}

// parseUpTo is parseUp with the usage and the warnings written to out.
func parseUpTo(args []string, x *extensions, out io.Writer) (up.Config, string, error) {
	cfg := up.DefaultConfig()
	fail := func(err error) (up.Config, string, error) { return up.Config{}, "", err }
	fs := config.NewFlagSet("up", out)
	fs.Var(config.Listen(&cfg.GatewayAddr), "gateway-addr", "HTTP address of the gateway (Envoy's place; a port alone is loopback)")
	fs.Var(config.Listen(&cfg.ExtprocAddr), "extproc-addr", "gRPC address of the ext_proc server")
	fs.Var(config.Listen(&cfg.AdminAddr), "admin-addr", "HTTP address of the status page, status.json and metrics (keep it on loopback: they list every internal address)")
	fs.IntVar(&cfg.MaxBodyBytes, "max-body-bytes", mocker.DefaultMaxBodyBytes, "the one request body limit: the router's cap, the model's max_body_bytes and every worker's")
	fs.Var(&cfg.Extproc.DuplicateKeys, "duplicate-keys", extprocd.DuplicateKeysUsage)
	extprocd.BoundsFlags(fs, &cfg.Extproc)
	fs.IntVar(&cfg.GatewayMaxHeaderBytes, "gateway-max-header-bytes", gateway.DefaultMaxRequestHeadersBytes, "the gateway answers 431 to request headers larger than this (Envoy's max_request_headers_kb, 60 KiB; 0: that default)")
	fs.DurationVar(&cfg.GatewayBodyTimeout, "gateway-body-timeout", gateway.DefaultBodyTimeout, "the gateway answers 408 to a request body that takes longer to arrive (a slow-body client; 0: the default; negative: no bound)")
	fs.StringVar(&cfg.Model, "model", cfg.Model, "model name the mock workers serve")
	fs.Float64Var(&cfg.Speedup, "speedup", cfg.Speedup, "speed-up factor of the mock workers' timing model")
	a := fs.Int("pool-a-workers", 3, "workers in pool-a (-topology flat)")
	b := fs.Int("pool-b-workers", 2, "workers in pool-b (-topology flat)")
	dp := fs.Int("pool-b-dp-size", 2, "data-parallel ranks of pool-b's last worker (each rank its own KV cache; -topology flat)")
	fs.DurationVar(&cfg.MetricsPeriod, "metrics-period", cfg.MetricsPeriod, "how often the local routers scrape the workers' engine metrics (0 or negative: never, as kvgate localrouter -router-metrics-period 0)")
	fs.BoolVar(&cfg.SecureServing, "secure-serving", false, "TLS on the ext_proc hop and mutual TLS on the local-router hop, with a CA made at start (its file is printed)")
	chainA := fs.String("pool-a-worker-chain", "", "pool-a's worker chain, inline or a YAML file (as kvgate localrouter -worker-chain; empty: the default; -topology flat)")
	chainB := fs.String("pool-b-worker-chain", "", "pool-b's worker chain (as -pool-a-worker-chain)")
	topology := fs.String("topology", up.TopologyFlat, "flat (the pools under the one global router), regions (2 regions x 2 pools: two region routers serving their subtrees, under the global router behind the gateway; docs/hierarchy.md) or disaggregated (a prefill pool and a decode pool, the disaggregate policy pairing them; docs/disaggregated.md)")
	prefillWorkers := fs.Int("prefill-workers", 1, "workers in the prefill pool of -topology disaggregated")
	decodeWorkers := fs.Int("decode-workers", 2, "workers in the decode pool of -topology disaggregated")
	regionWorkers := fs.Int("region-pool-workers", 2, "workers in each pool of -topology regions")
	var tenancy tenancyFlags
	tenancy.register(fs)
	otlp := fs.String("otlp-endpoint", "", `OTLP/gRPC collector host:port to trace the global router's decisions to, without TLS ("" : off)`)
	var logging config.Logging
	logging.Flags(fs, "warn")
	if err := fs.Parse(args, os.Getenv); err != nil {
		return fail(err)
	}
	log, err := logging.Logger(os.Stderr)
	if err != nil {
		return fail(err)
	}
	if cfg.MaxBodyBytes <= 0 {
		return fail(fmt.Errorf("-max-body-bytes %d: want a positive limit", cfg.MaxBodyBytes))
	}
	if !(cfg.Speedup > 0) {
		return fail(fmt.Errorf("-speedup %v: want a positive factor", cfg.Speedup))
	}
	if cfg.MetricsPeriod == 0 {
		cfg.MetricsPeriod = -1 // never: up.Config's 0 is its default, the flag's is off
	}
	if *a < 1 || *b < 1 {
		return fail(errors.New("each pool needs at least one worker"))
	}
	if *dp < 1 || *dp > mocker.MaxDPSize {
		return fail(fmt.Errorf("-pool-b-dp-size %d: want 1..%d", *dp, mocker.MaxDPSize))
	}
	if cfg.Tenancy, cfg.TrustTokensSHA256, err = tenancy.config(); err != nil {
		return fail(err)
	}
	dpSizes := make([]int, *b)
	dpSizes[*b-1] = *dp
	cfg.Scorers = x.scorerRegistry()
	if reg := x.policyRegistry(); reg != nil {
		cfg.GlobalOptions = append(cfg.GlobalOptions, globalrouter.WithPolicies(reg))
	}
	cfg.Pools = []up.PoolSpec{{Name: "pool-a", Workers: *a}, {Name: "pool-b", Workers: *b, DPSizes: dpSizes}}
	for i, spec := range []string{*chainA, *chainB} {
		rc := localrouter.DefaultConfig()
		rc.Scorers = x.scorerRegistry()
		chain, err := localrouter.LoadWorkerChain(spec, rc)
		if err != nil {
			return fail(fmt.Errorf("-%s-worker-chain: %w", cfg.Pools[i].Name, err))
		}
		cfg.Pools[i].WorkerChain = chain
	}
	// Each topology reads its own pool flags: the others', set, are
	// refused rather than passed over.
	flat := []string{"pool-a-workers", "pool-b-workers", "pool-b-dp-size", "pool-a-worker-chain", "pool-b-worker-chain"}
	regions, disagg := []string{"region-pool-workers"}, []string{"prefill-workers", "decode-workers"}
	for _, t := range []struct {
		topology string
		names    []string
	}{{up.TopologyFlat, flat}, {up.TopologyRegions, regions}, {up.TopologyDisaggregated, disagg}} {
		if t.topology == *topology {
			continue
		}
		if err := fs.NotRead(fmt.Sprintf("read by -topology %s only (this is -topology %s)", t.topology, *topology), t.names...); err != nil {
			return fail(err)
		}
	}
	switch *topology {
	case up.TopologyFlat:
	case up.TopologyRegions:
		if cfg.SecureServing {
			return fail(fmt.Errorf("-secure-serving: not supported with -topology %s (the region routers serve their subtrees in plaintext)", up.TopologyRegions))
		}
		if *regionWorkers < 1 {
			return fail(errors.New("-region-pool-workers: each pool needs at least one worker"))
		}
		cfg.Topology, cfg.Pools = up.TopologyRegions, up.RegionPools(*regionWorkers)
	case up.TopologyDisaggregated:
		if *prefillWorkers < 1 || *decodeWorkers < 1 {
			return fail(errors.New("-prefill-workers, -decode-workers: each pool needs at least one worker"))
		}
		cfg.Topology, cfg.Pools = up.TopologyDisaggregated, up.DisaggregatedPools(*prefillWorkers, *decodeWorkers)
	default:
		return fail(fmt.Errorf("-topology %q: want %s, %s or %s", *topology, up.TopologyFlat, up.TopologyRegions, up.TopologyDisaggregated))
	}
	cfg.Logger = log
	return cfg, *otlp, nil
}
