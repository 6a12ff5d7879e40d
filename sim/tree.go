package sim

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/localrouter"
	"github.com/kvgate/kvgate/localrouter/inproc"
	"github.com/kvgate/kvgate/membership"
	"github.com/kvgate/kvgate/mocker"
	"github.com/kvgate/kvgate/pool"
)

// TopologyTree is a tree of global routers (docs/hierarchy.md): Regions
// region routers, each a real globalrouter.Router over RegionPools pools of
// local routers, under a top router whose pools are the regions, reached
// through their in-process Subtree clients. Every request goes through the
// top router's Decide; the winning region decides and commits on its best
// pool, whose local router commits on the worker ("pool/worker" ids). The
// workers split evenly over the Regions×RegionPools leaf pools.
const TopologyTree = "tree"

// treeModel is the one model of a tree replay.
const treeModel = "model"

// parseTree parses the "RxP" of "tree=RxP".
func parseTree(s, arg string) (Topology, error) {
	t := Topology{Kind: TopologyTree}
	rs, ps, ok := strings.Cut(arg, "x")
	if !ok {
		return t, fmt.Errorf("%w: topology %q: %q is not REGIONSxPOOLS (e.g. tree=2x2)", ErrConfig, s, arg)
	}
	var err error
	if t.Regions, err = strconv.Atoi(strings.TrimSpace(rs)); err != nil || t.Regions <= 0 {
		return t, fmt.Errorf("%w: topology %q: regions %q is not a positive count", ErrConfig, s, rs)
	}
	if t.RegionPools, err = strconv.Atoi(strings.TrimSpace(ps)); err != nil || t.RegionPools <= 0 {
		return t, fmt.Errorf("%w: topology %q: pools per region %q is not a positive count", ErrConfig, s, ps)
	}
	if t.Regions*t.RegionPools > 1<<16 {
		return t, fmt.Errorf("%w: topology %q: %d leaf pools is too many", ErrConfig, s, t.Regions*t.RegionPools)
	}
	return t, nil
}

// validateTree checks that the workers split evenly over the leaf pools
// and that the policy is a local router's (the tree runs the real routers:
// the sim-side selections, random to kv-overlap, have no router to run in).
func validateTree(c Config, t Topology) error {
	leaves := t.Regions * t.RegionPools
	if t.Regions < 1 || t.RegionPools < 1 || c.Workers%leaves != 0 {
		return fmt.Errorf("%w: %d workers do not split into %d equal leaf pools (topology %s)", ErrConfig, c.Workers, leaves, t.Name())
	}
	for _, p := range c.Policies {
		if p.Kind != KindCost && p.Kind != KindTTFT {
			return fmt.Errorf("%w: topology %s replays the local routers' chains: policy %q is chosen by the replay, not a router (use kvgate, ttft:..., dynamo, kvgate-cost, cost:... or chain:...)", ErrConfig, t.Name(), p.Name)
		}
	}
	return nil
}

// buildTree makes the leaf pools (a local router and engines each), the
// region routers over them and the top router over the regions.
func (r *run) buildTree() error {
	cfg, t := r.cfg, r.topo
	per := cfg.Workers / (t.Regions * t.RegionPools)
	r.clients = map[string]pool.Client{}
	r.byPool = map[string]*simPool{}
	topClients := make(map[string]pool.Client, t.Regions)
	var topPools []pool.Config
	leaf := 0
	for i := range t.Regions {
		region := fmt.Sprintf("region-%d", i)
		leafClients := make(map[string]pool.Client, t.RegionPools)
		var pcs []pool.Config
		for j := range t.RegionPools {
			name := fmt.Sprintf("%s-p%d", region, j)
			// Leaf 0 draws the flat replay's stream, so tree=1x1 breaks
			// ties as flat does (routerStream).
			rc := r.policy.routerConfig(cfg.BlockSize, cfg.PredictedTTL)
			if r.policy.Kind == KindTTFT {
				rc.WorkerChain = r.policy.ttftChain(cfg)
			}
			rt, err := localrouter.New(rc, localrouter.Options{
				Clock:         r.clock,
				Rand:          newRand(cfg.Seed, routerStream(leaf)),
				Logger:        discardLogger,
				SweepInterval: -1,
			})
			if err != nil {
				return fmt.Errorf("pool %q: %w", name, err)
			}
			leaf++
			p := &simPool{name: name, role: membership.RoleAggregated, router: rt, byKey: make(map[localrouter.WorkerKey]*worker)}
			r.pools = append(r.pools, p)
			r.byPool[name] = p
			for range per {
				if err := r.addWorker(p, cfg.BlockSize); err != nil {
					return fmt.Errorf("pool %q: %w", name, err)
				}
			}
			c := inproc.New(rt, workerAddress(name))
			leafClients[name] = c
			r.clients[name] = c
			pcs = append(pcs, pool.NewConfig(name, cfg.BlockSize, []string{treeModel}, pool.LocalAddress(name)))
		}
		rg, err := r.newTreeRouter(globalrouter.DefaultConfig(pcs...), leafClients)
		if err != nil {
			return fmt.Errorf("region %q: %w", region, err)
		}
		r.regions = append(r.regions, rg)
		topClients[region] = rg.Subtree()
		topPools = append(topPools, pool.NewConfig(region, cfg.BlockSize, []string{treeModel}, pool.LocalAddress(region)))
	}
	var err error
	if r.gr, err = r.newTreeRouter(globalrouter.DefaultConfig(topPools...), topClients); err != nil {
		return fmt.Errorf("top router: %w", err)
	}
	r.models = []Share{{Value: treeModel, Weight: 1}}
	r.leases = make([]globalrouter.Lease, len(r.wl.reqs))
	r.decodeOf = make([]*worker, len(r.wl.reqs))
	r.decideErrors = map[string]int{}
	return nil
}

// newTreeRouter is a global router of the tree over clients, in virtual
// time (probe deadlines an hour, as in the config replay). TreeCommit, when
// set, is its probe.commit mode.
func (r *run) newTreeRouter(gcfg globalrouter.Config, clients map[string]pool.Client) (*globalrouter.Router, error) {
	gcfg.Probe.Timeout, gcfg.Probe.MinTimeout = time.Hour, time.Hour
	if r.cfg.TreeCommit != "" {
		gcfg.Probe.Commit = r.cfg.TreeCommit
	}
	return globalrouter.New(gcfg,
		globalrouter.WithDialer(pool.LocalDialer(clients)),
		globalrouter.WithClock(r.clock),
		globalrouter.WithRegisterer(prometheus.NewRegistry()),
		globalrouter.WithLogger(discardLogger),
		globalrouter.WithTokenizer(treeModel, noTokenizer{}),
		globalrouter.WithTokenizer("*", noTokenizer{}),
	)
}

// addWorker adds an aggregated engine to pool p and its router.
func (r *run) addWorker(p *simPool, blockSize int) error {
	cfg := r.cfg
	w := &worker{index: len(r.workers), pool: p, busy: new(time.Duration)}
	w.key = localrouter.WorkerKey{ID: fmt.Sprintf("w%d", w.index)}
	var err error
	w.eng, err = mocker.NewEngine(mocker.Config{
		BlockSize:           blockSize,
		NumBlocks:           cfg.KVTokens / blockSize,
		CPUBlocks:           cfg.CPUKVTokens / blockSize,
		MaxNumSeqs:          cfg.MaxNumSeqs,
		MaxNumBatchedTokens: cfg.MaxNumBatchedTokens,
		Role:                p.role,
		Timing:              meteredTiming{model: mocker.DefaultTiming{Speedup: cfg.Speedup}, busy: w.busy},
		Speedup:             cfg.Speedup,
	})
	if err != nil {
		return err
	}
	p.router.AddWorker(w.key.ID, 1)
	if err := r.policy.pinWorker(p, w, mocker.DefaultTiming{Speedup: cfg.Speedup}, cfg.MaxNumBatchedTokens); err != nil {
		return err
	}
	p.workers = append(p.workers, w)
	p.byKey[w.key] = w
	r.workers = append(r.workers, w)
	return nil
}

// treeEndpoint maps a top-router decision's endpoint (pool: a region;
// worker: "leaf-pool/worker") back to the leaf pool's name and the worker
// id its local router knows.
func (r *run) treeEndpoint(e globalrouter.Endpoint) (string, string, error) {
	leafPool, id, ok := strings.Cut(e.WorkerID, "/")
	if !ok || !strings.HasPrefix(leafPool, e.Pool+"-") {
		return "", "", fmt.Errorf("decision names worker %q of region %q, not a pool/worker of that region", e.WorkerID, e.Pool)
	}
	return leafPool, id, nil
}
