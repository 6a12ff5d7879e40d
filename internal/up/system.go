package up

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/kvgate/kvgate/envoy/gateway"
	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/embedded"
	"github.com/kvgate/kvgate/internal/localrouterd"
	"github.com/kvgate/kvgate/internal/status"
	"github.com/kvgate/kvgate/localrouter"
	"github.com/kvgate/kvgate/membership"
)

// System is a running local kvgate.
type System struct {
	cfg     Config
	log     *slog.Logger
	started time.Time
	etcd    *etcdServer
	nats    *embedded.NATS
	nc      *nats.Conn
	Pools   []*Pool
	// Regions are the region routers (TopologyRegions), nil otherwise.
	Regions  []*Region
	Global   *globalrouter.Router
	Registry *prometheus.Registry // the ext_proc server's and global router's metrics
	// Live is the live status page (/kvgate/status/); Decisions its last
	// decisions.
	Live      *status.Page
	Decisions *status.Recorder

	extprocAddr string
	// ClientCertFile and ClientKeyFile are a client certificate the local
	// routers' mutual TLS accepts (the global router's), for a client such
	// as grpcurl under SecureServing; removed by Close.
	ClientCertFile, ClientKeyFile string

	// CAFile is the CA to trust for the ext_proc and local-router hops
	// under SecureServing ("" otherwise); removed by Close.
	CAFile       string
	tlsDir       string
	extprocStop  context.CancelFunc
	extprocDone  chan error
	conn         *grpc.ClientConn
	gw           *gateway.Gateway
	gatewayAddr  string
	gatewayHTTP  *http.Server
	gatewayDone  chan error
	adminAddr    string
	adminHTTP    *http.Server
	adminDone    chan error
	closeStarted bool
}

// Pool is one running pool: its local router and its workers.
type Pool struct {
	Name string
	// Role is the pool's role: aggregated, prefill or decode.
	Role    membership.Role
	Router  *localrouterd.Service
	Workers []*Worker
	stopped atomic.Bool // read by the status page while a test stops it
	rcfg    localrouterd.Config
	log     *slog.Logger
	// Registry holds the local router's metrics (kvgate_localrouter_*).
	Registry *prometheus.Registry
	// obs watches the local router's lifecycle state (Observers.Router;
	// nil: none).
	obs localrouter.ActiveObserver
}

// StopRouter closes the pool's local router (as if its process died or
// was drained); the workers keep running. Idempotent.
func (p *Pool) StopRouter(ctx context.Context) error {
	if p.stopped.Swap(true) {
		return nil
	}
	return p.Router.Close(ctx)
}

// Requests reports the requests in flight the pool's local router tracks.
func (p *Pool) Requests() int { return p.Router.Router().Active().Stats().Requests }

// Loads reports the local router's load of each worker.
func (p *Pool) Loads() map[localrouter.WorkerKey]localrouter.WorkerLoad {
	out := map[localrouter.WorkerKey]localrouter.WorkerLoad{}
	p.Router.Router().Active().Loads(func(k localrouter.WorkerKey, l localrouter.WorkerLoad) { out[k] = l })
	return out
}

// GatewayURL is the gateway's base URL (http://host:port).
func (s *System) GatewayURL() string { return "http://" + s.gatewayAddr }

// AdminURL is the admin listener's base URL: the status page is at
// AdminURL()+"/kvgate/", its JSON at /kvgate/status.json, the metrics at
// /kvgate/metrics.
func (s *System) AdminURL() string { return "http://" + s.adminAddr }

// ExtprocAddr is the ext_proc server's gRPC address.
func (s *System) ExtprocAddr() string { return s.extprocAddr }

// EtcdEndpoints are the embedded etcd's client URLs.
func (s *System) EtcdEndpoints() []string { return slices.Clone(s.etcd.endpoints) }

// NATSURL is the embedded NATS server's URL.
func (s *System) NATSURL() string { return s.nats.URL() }

// Pool returns the pool named name, or nil.
func (s *System) Pool(name string) *Pool {
	for _, p := range s.Pools {
		if p.Name == name {
			return p
		}
	}
	return nil
}

// Summary is what `kvgate up` prints: each part with its address, and
// curl lines to try.
func (s *System) Summary() string {
	var b strings.Builder
	gw := s.GatewayURL()
	fmt.Fprintf(&b, "kvgate is up (%s to start)\n\n", time.Since(s.started).Round(time.Millisecond))
	fmt.Fprintf(&b, "  %-22s %s\n", "gateway (HTTP)", gw)
	fmt.Fprintf(&b, "  %-22s %s/kvgate/ (admin, loopback only)\n", "status page", s.AdminURL())
	fmt.Fprintf(&b, "  %-22s %s/kvgate/status/ (admin)\n", "live status page", s.AdminURL())
	fmt.Fprintf(&b, "  %-22s %s/kvgate/metrics\n", "metrics", s.AdminURL())
	fmt.Fprintf(&b, "  %-22s %s\n", "ext_proc (gRPC)", s.extprocAddr)
	if s.CAFile != "" {
		fmt.Fprintf(&b, "  %-22s %s (TLS on ext_proc, mutual TLS on local routers)\n", "CA to trust", s.CAFile)
		fmt.Fprintf(&b, "  %-22s %s, key %s (a local router asks its clients for one)\n", "client certificate", s.ClientCertFile, s.ClientKeyFile)
		fmt.Fprintf(&b, "  %-22s removed when kvgate up stops: copy them to keep them\n", "")
	}
	for _, rg := range s.Regions {
		fmt.Fprintf(&b, "  %-22s %s (subtree of %v, registered as pool %s)\n", rg.Name+" router", rg.Addr, rg.Pools, rg.Name)
	}
	for _, p := range s.Pools {
		role := ""
		if p.Role != membership.RoleAggregated {
			role = " (" + string(p.Role) + " pool)"
		}
		fmt.Fprintf(&b, "  %-22s %s%s\n", p.Name+" local router", p.Router.GRPCAddr(), role)
		for _, w := range p.Workers {
			dp := ""
			if w.DPSize > 1 {
				dp = fmt.Sprintf(" (%d data-parallel ranks)", w.DPSize)
			}
			fmt.Fprintf(&b, "  %-22s http://%s%s\n", "  worker "+w.ID, w.Addr, dp)
		}
	}
	fmt.Fprintf(&b, "  %-22s %s\n", "etcd", strings.Join(s.etcd.endpoints, ","))
	fmt.Fprintf(&b, "  %-22s %s\n", "nats", s.nats.URL())
	fmt.Fprintf(&b, "\nmodel %q; try:\n\n", s.cfg.Model)
	fmt.Fprintf(&b, "  curl -si %s/v1/chat/completions -H 'content-type: application/json' \\\n    -d '{\"model\":\"%s\",\"messages\":[{\"role\":\"user\",\"content\":\"Tell me about KV caches.\"}]}'\n\n", gw, s.cfg.Model)
	fmt.Fprintf(&b, "  curl -sN %s/v1/chat/completions -H 'content-type: application/json' -H 'x-kvgate-explain: 1' -D - \\\n    -d '{\"model\":\"%s\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"Tell me about KV caches.\"}]}'\n\n", gw, s.cfg.Model)
	if s.cfg.Topology == TopologyDisaggregated {
		b.WriteString("A prompt of 512 uncached tokens or more is disaggregated: x-kvgate-explain says \"prefill on prefill/…\", the decode\nworker sends the prefill to that worker and pulls its KV (docs/disaggregated.md); the same prefix again stays on the decode worker.\n")
	}
	b.WriteString("Repeat a long prompt and watch x-kvgate-overlap-blocks grow on the same x-kvgate-worker-id. Ctrl-C stops everything.\n")
	return b.String()
}
