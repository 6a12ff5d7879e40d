package up

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/globalrouter/subtree"
	"github.com/kvgate/kvgate/internal/subtreed"
	"github.com/kvgate/kvgate/membership"
	"github.com/kvgate/kvgate/membership/registry"
	"github.com/kvgate/kvgate/pool"
)

// Topologies of Config.Topology.
const (
	// TopologyFlat: the global router behind the gateway routes over the
	// pools (the default).
	TopologyFlat = "flat"
	// TopologyRegions: two region global routers, each over two pools,
	// serve their subtrees (globalrouter/subtree), registered in etcd as
	// the routers of pools "region-a" and "region-b"; the global router
	// behind the gateway routes over those two pools (docs/hierarchy.md).
	TopologyRegions = "regions"
)

// RegionPools are the pools of TopologyRegions: region-a-p0, region-a-p1,
// region-b-p0, region-b-p1, with workers workers each.
func RegionPools(workers int) []PoolSpec {
	var out []PoolSpec
	for _, r := range []string{"region-a", "region-b"} {
		for i := range 2 {
			out = append(out, PoolSpec{Name: fmt.Sprintf("%s-p%d", r, i), Region: r, Workers: workers})
		}
	}
	return out
}

// Region is a running region router: a global router over the region's
// pools, serving its subtree over gRPC.
type Region struct {
	Name string
	// Pools are the names of the region's pools.
	Pools  []string
	Router *globalrouter.Router
	// Server is the subtree service (its Active count is the requests in
	// flight through it).
	Server *subtree.Server
	// Addr is the subtree's gRPC address, registered in etcd.
	Addr     string
	Registry *prometheus.Registry
	grpc     *grpc.Server
	done     chan error
	reg      *registry.Registration
}

// startRegions starts a region router per region of pools (configuration
// order) and returns the top router's pools: one per region, its routers
// discovered in etcd.
func (s *System) startRegions(ctx context.Context, pools []pool.Config, opts func(reg prometheus.Registerer) []globalrouter.Option) ([]pool.Config, error) {
	var order []string
	byRegion := map[string][]pool.Config{}
	for i, ps := range s.cfg.Pools {
		if ps.Region == "" {
			return nil, fmt.Errorf("topology %s: pool %s has no region", TopologyRegions, ps.Name)
		}
		if byRegion[ps.Region] == nil {
			order = append(order, ps.Region)
		}
		byRegion[ps.Region] = append(byRegion[ps.Region], pools[i])
	}
	var top []pool.Config
	for _, name := range order {
		lis, err := net.Listen("tcp", net.JoinHostPort(s.cfg.Host, "0"))
		if err != nil {
			return nil, fmt.Errorf("region %s: %w", name, err)
		}
		rg := &Region{Name: name, Addr: lis.Addr().String(), Registry: prometheus.NewRegistry(), done: make(chan error, 1)}
		for _, pc := range byRegion[name] {
			rg.Pools = append(rg.Pools, pc.Name)
		}
		s.Regions = append(s.Regions, rg)
		gcfg := globalrouter.DefaultConfig(byRegion[name]...)
		s.probeTimeout(&gcfg)
		gcfg.Models = []globalrouter.ModelConfig{{Name: s.cfg.Model, Tokenizer: globalrouter.DefaultTokenizer, MaxBodyBytes: s.cfg.MaxBodyBytes}}
		ropts := append(opts(rg.Registry), globalrouter.WithSubtree(globalrouter.SubtreeOptions{Addresses: []string{rg.Addr}, Pool: name, Model: s.cfg.Model}))
		if rg.Router, err = globalrouter.New(gcfg, ropts...); err != nil {
			lis.Close()
			return nil, fmt.Errorf("region %s: %w", name, err)
		}
		rg.Server = subtree.NewServer(rg.Router.Subtree(), name, name+"-router", s.cfg.Logger)
		rg.grpc = grpc.NewServer(subtreed.ServerOptions()...)
		rg.Server.Register(rg.grpc)
		go func() { rg.done <- rg.grpc.Serve(lis) }()
		info := membership.RouterInfo{ID: name + "-router", GRPCAddress: rg.Addr, Pool: name, BlockSize: s.cfg.BlockSize}
		if rg.reg, err = registry.RegisterRouter(ctx, s.etcd.cli, info, 5*time.Second, s.cfg.Logger); err != nil {
			return nil, fmt.Errorf("region %s: %w", name, err)
		}
		pc := pool.NewConfig(name, s.cfg.BlockSize, []string{s.cfg.Model})
		pc.Routers = pool.Routers{Etcd: true}
		top = append(top, pc)
	}
	return top, nil
}

// probeTimeout applies Config.ProbeTimeout to gcfg.
func (s *System) probeTimeout(gcfg *globalrouter.Config) {
	if s.cfg.ProbeTimeout > 0 {
		// A fixed deadline, as asked (the default adapts).
		gcfg.Probe.Timeout, gcfg.Probe.MinTimeout = s.cfg.ProbeTimeout, s.cfg.ProbeTimeout
	}
}

// closeRegions stops the region routers (after the top router: its
// streams to them end first, which frees what they committed).
func (s *System) closeRegions(ctx context.Context) error {
	var errs []error
	for _, rg := range s.Regions {
		if rg.reg != nil {
			errs = append(errs, rg.reg.Close())
		}
		if rg.grpc != nil {
			rg.Server.Shutdown()
			stopped := make(chan struct{})
			go func() { rg.grpc.GracefulStop(); close(stopped) }()
			select {
			case <-stopped:
			case <-ctx.Done():
				rg.grpc.Stop()
			}
			if err := <-rg.done; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				errs = append(errs, fmt.Errorf("region %s: %w", rg.Name, err))
			}
		}
		if rg.Router != nil {
			errs = append(errs, rg.Router.Close())
		}
	}
	return errors.Join(errs...)
}

// Region returns the region named name, or nil.
func (s *System) Region(name string) *Region {
	for _, r := range s.Regions {
		if r.Name == name {
			return r
		}
	}
	return nil
}
