package globalrouter

import (
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvgate/kvgate/policies"
	"github.com/kvgate/kvgate/pool"
	"github.com/kvgate/kvgate/tokenizer"
)

// Tokenizer is what the global router needs of a model's tokenizer;
// *tokenizer.Model implements it. Safe for concurrent use.
type Tokenizer interface {
	Encode(text string) ([]uint32, error)
	EncodeChat(req *tokenizer.ChatRequest) ([]uint32, error)
}

// Option configures a Router.
type Option func(*options)

type options struct {
	logger     *slog.Logger
	registerer prometheus.Registerer
	etcd       *clientv3.Client
	dialer     pool.Dialer
	registry   *policies.Registry
	now        func() time.Time
	tokenizers map[string]Tokenizer
	shadowFile string         // WithShadowFile (shadow.go)
	subtree    SubtreeOptions // WithSubtree (subtree.go)
	observe    func(Observation)
	freed      func(id string, at time.Time) // WithFreeObserver (observe.go)
	explainObs *explainSampler               // WithObserver (observe.go)
	tracer     trace.TracerProvider          // WithTracerProvider (tracing.go)
	// noFlowQueue: WithoutFlowQueue (flow.go).
	noFlowQueue bool
}

// WithoutFlowQueue makes Decide return flow control's saturated refusal
// (429) instead of waiting in the queue: for a caller that runs the
// queue itself (the replay runs flowcontrol.Queue in virtual time, with
// FlowRequest).
func WithoutFlowQueue() Option { return func(o *options) { o.noFlowQueue = true } }

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// WithRegisterer registers the kvgate_globalrouter_* metrics on reg
// (default: a private registry, nothing exported).
func WithRegisterer(reg prometheus.Registerer) Option {
	return func(o *options) { o.registerer = reg }
}

// WithEtcd gives the etcd client that pools with routers.etcd discover
// their local routers with.
func WithEtcd(cli *clientv3.Client) Option { return func(o *options) { o.etcd = cli } }

// WithDialer replaces the dialer of local routers (default
// pool.ChannelDialer(): probes and commits multiplexed on one stream per
// router; pool.GRPCDialer() is a unary call per probe and a Track stream
// per request).
func WithDialer(d pool.Dialer) Option { return func(o *options) { o.dialer = d } }

// WithPolicies sets the policy registry (default: the built-ins).
func WithPolicies(reg *policies.Registry) Option { return func(o *options) { o.registry = reg } }

// WithClock sets the clock of latencies and circuits (default time.Now).
func WithClock(now func() time.Time) Option { return func(o *options) { o.now = now } }

// WithTokenizer uses t for model instead of loading the configured one.
func WithTokenizer(model string, t Tokenizer) Option {
	return func(o *options) {
		if o.tokenizers == nil {
			o.tokenizers = map[string]Tokenizer{}
		}
		o.tokenizers[model] = t
	}
}
