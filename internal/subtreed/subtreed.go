// Package subtreed is the process assembly of a global router's subtree
// service (`kvgate extproc -subtree-*`; docs/hierarchy.md): its flags, its
// listener and TLS, its etcd registration. The service itself is
// globalrouter/subtree.
package subtreed

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/globalrouter/subtree"
	"github.com/kvgate/kvgate/internal/localrouterd"
	"github.com/kvgate/kvgate/internal/runner"
	"github.com/kvgate/kvgate/internal/tlsconfig"
	"github.com/kvgate/kvgate/lib/config"
	"github.com/kvgate/kvgate/localrouter/server"
	"github.com/kvgate/kvgate/membership"
	"github.com/kvgate/kvgate/membership/registry"
)

// DefaultListen is -subtree-listen's host when the flag names a port
// only (":9300" listens on loopback: exposing the subtree is a choice).
const DefaultListen = config.ListenHost

// Config is the subtree service of `kvgate extproc` (flags -subtree-*).
type Config struct {
	// Listen is the gRPC listen address ("" : the service is off; a
	// port alone, ":9300", listens on DefaultListen).
	Listen string
	// Advertise is the address registered in etcd and checked for loops
	// (default: the listen address).
	Advertise string
	// Pool is the parent's pool name this router registers as a router of
	// in etcd ("" : no registration; parents list the address statically).
	Pool string
	// BlockSize is the block size registered (0: the pools', when they
	// all have one).
	BlockSize int
	// Model restricts the subtree to the pools serving it
	// (globalrouter.SubtreeOptions.Model).
	Model string
	// MaxDepth is the deepest tree a call may cross (default
	// globalrouter.DefaultMaxDepth).
	MaxDepth int
	// ID is the router id registered (default: the host name and port).
	ID string
	// RegisterTTL is the etcd lease's TTL (0: 10 s).
	RegisterTTL time.Duration
	// AuthorizedClients, under mutual TLS, are the client certificate
	// names (tlsconfig.PeerNames: SANs, the CN without them) allowed lifecycle calls (Commit, Track,
	// Channel, Free, MarkPrefillComplete, BestWorker with a request id);
	// empty: any verified client. The TLS is the process's
	// (-tls-cert-file, -tls-client-ca-file, as the ext_proc listener's).
	AuthorizedClients []string
	// AnonymousCommitExpiry frees a request recorded by a unary call
	// (Commit, BestWorker with request_id) after this long unless freed
	// before, on a service without mutual TLS: the local router's
	// -anonymous-commit-expiry, same name and meaning. 0:
	// localrouterd.DefaultAnonymousCommitExpiry; negative: off.
	AnonymousCommitExpiry time.Duration
}

// Flags defines the -subtree-* flags on fs.
func (c *Config) Flags(fs *config.FlagSet) {
	fs.Var(config.Listen(&c.Listen), "subtree-listen", `serve this router's subtree over the local-router gRPC API at this address, so a parent global router's pool can be this router ("" : off; ":9300" listens on `+DefaultListen+`)`)
	fs.Var(config.String(&c.Advertise), "subtree-advertise", "subtree address registered in etcd (default: the listen address)")
	fs.Var(config.String(&c.Pool), "subtree-pool", "register the subtree in etcd as a router of this pool (the parent's pool name, routers: {etcd: true}); needs -etcd")
	fs.Var(config.Int(&c.BlockSize, 0), "subtree-block-size", "block size registered for the subtree (0: its pools', when they share one)")
	fs.Var(config.String(&c.Model), "subtree-model", "model the subtree answers for (its pools serving it; default: the first model its pools name)")
	fs.Var(config.Int(&c.MaxDepth, 0), "subtree-max-depth", fmt.Sprintf("deepest tree of global routers a call may cross before it is refused as a loop (0: %d)", globalrouter.DefaultMaxDepth))
	fs.Var(config.String(&c.ID), "subtree-router-id", "router id of the subtree's etcd registration (default: host name and port)")
	fs.Var(config.Duration(&c.RegisterTTL), "subtree-register-ttl", "lease TTL of the subtree's etcd registration (0: 10s)")
	fs.Var(config.SignedDuration(&c.AnonymousCommitExpiry), "anonymous-commit-expiry", fmt.Sprintf("read by the subtree service (-subtree-listen) without mutual TLS (anyone reaching the port may commit): a request recorded by a unary Commit or BestWorker with request_id is freed after this long unless freed before (requests on a Channel or Track stream end with their stream; 0: %v; negative: off, held until Free)", localrouterd.DefaultAnonymousCommitExpiry))
	fs.Var(config.List(&c.AuthorizedClients), "authorized-clients", "under mutual TLS, comma-separated client certificate names (DNS or URI SANs; the CN only when there is no SAN) allowed the subtree's lifecycle calls (Commit, Track, Channel, Free, MarkPrefillComplete); empty: any verified client")
}

// Enabled reports whether the service runs.
func (c Config) Enabled() bool { return c.Listen != "" }

// ListenAddr is Listen as config.ListenAddr reads it: a port alone is
// loopback (DefaultListen), as for every listen flag.
func (c Config) ListenAddr() string { return config.ListenAddr(c.Listen) }

// CheckGiven refuses the -subtree-* flags given on fs (the command line
// or the environment) that c does not read: every one without
// -subtree-listen, the registration's without -subtree-pool, and
// -authorized-clients without mutual TLS (mutualTLS: the process's
// -tls-client-ca-file).
func (c Config) CheckGiven(fs *config.FlagSet, mutualTLS bool) error {
	if !c.Enabled() {
		return fs.NotRead("the subtree service is off (no -subtree-listen)", "subtree-advertise", "subtree-pool", "subtree-block-size",
			"subtree-model", "subtree-max-depth", "subtree-router-id", "subtree-register-ttl", "anonymous-commit-expiry", "authorized-clients")
	}
	if c.Pool == "" {
		if err := fs.NotRead("they shape the subtree's etcd registration, made only with -subtree-pool", "subtree-block-size", "subtree-register-ttl"); err != nil {
			return err
		}
	}
	if !mutualTLS {
		return fs.NotRead("it authorises callers by their client certificates: set -tls-client-ca-file (mutual TLS)", "authorized-clients")
	}
	return nil
}

// Validate reports a bad combination, naming the flag.
func (c Config) Validate() error {
	if !c.Enabled() {
		for flag, set := range map[string]bool{"-subtree-pool": c.Pool != "", "-subtree-advertise": c.Advertise != "", "-anonymous-commit-expiry": c.AnonymousCommitExpiry != 0} {
			if set {
				return fmt.Errorf("%s: needs -subtree-listen", flag)
			}
		}
		return nil
	}
	for flag, a := range map[string]string{"-subtree-listen": c.ListenAddr(), "-subtree-advertise": c.Advertise} {
		if a == "" {
			continue
		}
		if _, p, err := net.SplitHostPort(a); err != nil {
			return fmt.Errorf("%s: %q: %v", flag, a, err)
		} else if _, err := strconv.ParseUint(p, 10, 16); err != nil {
			return fmt.Errorf("%s: %q: bad port %q", flag, a, p)
		}
	}
	if c.Pool != "" && strings.ContainsAny(c.Pool, "/. *>") {
		return fmt.Errorf("-subtree-pool: %q must not contain '/', '.', ' ', '*' or '>'", c.Pool)
	}
	if c.MaxDepth < 0 {
		return fmt.Errorf("-subtree-max-depth: %d is negative", c.MaxDepth)
	}
	return nil
}

// RouterOption is the global router's side of the service: its own
// addresses and pool refused in its configuration (loops), the depth, the
// model. extra are addresses known only once listening (the bound port).
func (c Config) RouterOption(extra ...string) globalrouter.Option {
	addrs := append([]string{}, extra...)
	for _, a := range []string{c.ListenAddr(), c.Advertise} {
		if a != "" && !slices.Contains(addrs, a) {
			addrs = append(addrs, a)
		}
	}
	return globalrouter.WithSubtree(globalrouter.SubtreeOptions{Addresses: addrs, Pool: c.Pool, MaxDepth: c.MaxDepth, Model: c.Model})
}

// Service is the running subtree service.
type Service struct {
	Server     *subtree.Server
	lis        net.Listener
	advertised string
	reg        *registry.Registration
}

// ListenOn opens the service's listener (before the router is built, so
// that the bound address joins the loop checks).
func (c Config) ListenOn() (net.Listener, error) {
	return runner.Listen("subtree-listen", c.ListenAddr())
}

// Start serves router's subtree on lis in g (TLS when tlsCfg is set; its
// mutual TLS authorises lifecycle calls by c.AuthorizedClients; without
// it unary commits expire after c.AnonymousCommitExpiry, counted on reg
// when set), and
// registers it in etcd as a router of c.Pool when set (etcd required
// then). It returns once serving and registered.
func Start(ctx context.Context, c Config, lis net.Listener, router *globalrouter.Router, tlsCfg *tlsconfig.Server, etcd *clientv3.Client, reg prometheus.Registerer, g *runner.Group, log *slog.Logger) (*Service, error) {
	if log == nil {
		log = slog.Default()
	}
	s := &Service{lis: lis, advertised: c.Advertise}
	if s.advertised == "" {
		s.advertised = lis.Addr().String()
	}
	id := c.ID
	if id == "" {
		id = defaultID(s.advertised)
	}
	s.Server = subtree.NewServer(router.Subtree(), c.Pool, id, log)
	gopts := ServerOptions()
	if tlsCfg != nil && tlsCfg.Enabled() {
		tc, err := tlsCfg.Config(log)
		if err != nil {
			return nil, fmt.Errorf("subtree: %w", err)
		}
		gopts = append(gopts, grpc.Creds(credentials.NewTLS(tc)))
		if tlsCfg.MutualTLS() && len(c.AuthorizedClients) > 0 {
			unary, stream := localrouterd.AuthorizationInterceptors(c.AuthorizedClients)
			gopts = append(gopts, grpc.ChainUnaryInterceptor(unary), grpc.ChainStreamInterceptor(stream))
		}
	}
	// Under mutual TLS every caller is identified by a certificate the
	// client CA verified; otherwise anonymous unary commits expire.
	identified := tlsCfg != nil && tlsCfg.Enabled() && tlsCfg.MutualTLS()
	expiry := c.AnonymousCommitExpiry
	if expiry == 0 {
		expiry = localrouterd.DefaultAnonymousCommitExpiry
	}
	switch {
	case identified && c.AnonymousCommitExpiry != 0:
		log.Warn("-anonymous-commit-expiry is not read: the subtree service's callers are identified by mutual TLS")
	case !identified && expiry > 0:
		expired := prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvgate_subtree_anonymous_expired_total",
			Help: "Requests committed on the subtree service by an unauthenticated unary call (Commit, BestWorker with request_id) and freed by -anonymous-commit-expiry.",
		})
		if reg != nil {
			if err := reg.Register(expired); err != nil {
				return nil, fmt.Errorf("subtree: metrics: %w", err)
			}
		}
		s.Server.ExpireAnonymous(expiry, expired.Inc)
	}
	gs := grpc.NewServer(gopts...)
	s.Server.Register(gs)
	g.ServeGRPC("subtree", gs, lis)
	g.OnStop(func(context.Context) error { s.Server.Shutdown(); return nil })
	if c.Pool != "" {
		if etcd == nil {
			return nil, errors.New("-subtree-pool: needs -etcd (the registration lives there)")
		}
		bs := c.BlockSize
		if bs == 0 {
			var err error
			if bs, err = blockSize(router.Config()); err != nil {
				return nil, err
			}
		}
		info := membership.RouterInfo{ID: id, GRPCAddress: s.advertised, Pool: c.Pool, BlockSize: bs}
		reg, err := registry.RegisterRouter(ctx, etcd, info, c.RegisterTTL, log.With("component", "globalrouter.subtree.registration", "pool", c.Pool))
		if err != nil {
			return nil, fmt.Errorf("subtree: %w", err)
		}
		s.reg = reg
		g.OnStop(func(context.Context) error { return reg.Close() })
	}
	log.Info("serving the subtree", "addr", lis.Addr().String(), "advertised", s.advertised, "pool", c.Pool, "tls", tlsCfg != nil && tlsCfg.Enabled())
	return s, nil
}

// Addr is the address the service listens on.
func (s *Service) Addr() string { return s.lis.Addr().String() }

// Advertised is the address registered (or to list statically).
func (s *Service) Advertised() string { return s.advertised }

// blockSize is the one block size of cfg's pools.
func blockSize(cfg globalrouter.Config) (int, error) {
	var sizes []int
	for _, p := range cfg.Pools {
		if !slices.Contains(sizes, p.BlockSize) {
			sizes = append(sizes, p.BlockSize)
		}
	}
	if len(sizes) != 1 {
		return 0, fmt.Errorf("-subtree-block-size: the pools have block sizes %v; say which one the subtree registers", sizes)
	}
	return sizes[0], nil
}

func defaultID(addr string) string {
	_, port, _ := net.SplitHostPort(addr)
	h, err := osHostname()
	if err != nil || h == "" {
		h = "kvgate"
	}
	return strings.NewReplacer("/", "-", " ", "-").Replace(h) + "-subtree-" + port
}

var osHostname = os.Hostname

// ServerOptions are the subtree service's gRPC server options: a local
// router's transport options (localrouter/server.TransportOptions, without
// its metrics).
func ServerOptions() []grpc.ServerOption { return server.TransportOptions() }
