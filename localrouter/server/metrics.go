package server

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/kvgate/kvgate/localrouter/replica"
)

// Metrics are the service's Prometheus metrics, registered on an injected
// registry. Gauges and counters of the router, the event subscriber and the
// replica sync are read at scrape time; RPC latencies are observed by the
// interceptors.
type Metrics struct {
	rpc *prometheus.HistogramVec
}

// NewMetrics registers the metrics of srv on reg. replicaStats may be nil.
func NewMetrics(reg prometheus.Registerer, srv *Server, replicaStats func() replica.Stats) (*Metrics, error) {
	m := &Metrics{
		rpc: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvgate_localrouter_rpc_duration_seconds",
			Help:    "Latency of local-router RPCs (Track: the stream's lifetime), by method and gRPC code.",
			Buckets: []float64{25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 100e-3, 1, 10, 60},
		}, []string{"method", "code"}),
	}
	if err := reg.Register(m.rpc); err != nil {
		return nil, err
	}
	if err := reg.Register(&collector{srv: srv, replica: replicaStats}); err != nil {
		return nil, err
	}
	return m, nil
}

func shortMethod(full string) string { return full[strings.LastIndexByte(full, '/')+1:] }

// UnaryInterceptor observes unary RPC latencies.
func (m *Metrics) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		start := time.Now()
		resp, err := h(ctx, req)
		m.rpc.WithLabelValues(shortMethod(info.FullMethod), status.Code(err).String()).Observe(time.Since(start).Seconds())
		return resp, err
	}
}

// StreamInterceptor observes stream lifetimes.
func (m *Metrics) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		start := time.Now()
		err := h(srv, ss)
		m.rpc.WithLabelValues(shortMethod(info.FullMethod), status.Code(err).String()).Observe(time.Since(start).Seconds())
		return err
	}
}

var (
	descWorkers        = prometheus.NewDesc("kvgate_localrouter_workers", "Workers in the pool.", nil, nil)
	descReady          = prometheus.NewDesc("kvgate_localrouter_ready", "1 once min_initial_workers workers joined.", nil, nil)
	descIndexBlocks    = prometheus.NewDesc("kvgate_localrouter_index_blocks", "Distinct blocks in the KV index.", nil, nil)
	descIndexEntries   = prometheus.NewDesc("kvgate_localrouter_index_entries", "(block, worker rank) pairs in the KV index.", nil, nil)
	descEventsApplied  = prometheus.NewDesc("kvgate_localrouter_events_applied_total", "KV events applied to the index.", nil, nil)
	descEventsRejected = prometheus.NewDesc("kvgate_localrouter_events_rejected_total", "KV events not applied, by reason.", []string{"reason"}, nil)
	descEventGaps      = prometheus.NewDesc("kvgate_localrouter_event_gaps_total", "Event-id gaps and publisher restarts seen.", nil, nil)
	descDumps          = prometheus.NewDesc("kvgate_localrouter_dumps_total", "Worker dumps requested, by result.", []string{"result"}, nil)
	descExpired        = prometheus.NewDesc("kvgate_localrouter_requests_expired_total", "Requests freed by forced expiry.", nil, nil)
	descActive         = prometheus.NewDesc("kvgate_localrouter_active_requests", "Requests in flight, per worker rank.", []string{"worker_id", "dp_rank"}, nil)
	descPrefill        = prometheus.NewDesc("kvgate_localrouter_prefill_tokens", "Prompt tokens still to prefill, per worker rank.", []string{"worker_id", "dp_rank"}, nil)
	descActiveBlocks   = prometheus.NewDesc("kvgate_localrouter_active_blocks", "Distinct KV blocks of requests in flight, per worker rank.", []string{"worker_id", "dp_rank"}, nil)
	descTrackStreams   = prometheus.NewDesc("kvgate_localrouter_track_streams", "Open Track streams.", nil, nil)
	descChanStreams    = prometheus.NewDesc("kvgate_localrouter_channel_streams", "Open Channel streams.", nil, nil)
	descReservations   = prometheus.NewDesc("kvgate_localrouter_reservations_total", "Worker reservations of reserving probes, by outcome: made, confirmed (a commit turned it into its request), released (the request went elsewhere, or its stream ended), expired (unconfirmed within its TTL), missed (a confirming commit found none and was recorded as an ordinary commit, or an answerless channel confirmation found none, or one on another worker, and was dropped).", []string{"outcome"}, nil)
	descReserved       = prometheus.NewDesc("kvgate_localrouter_reservations", "Worker reservations held now.", nil, nil)
	descReplica        = prometheus.NewDesc("kvgate_localrouter_replica_messages_total", "Replica-sync messages, by direction (sent, received, ignored own, failed).", []string{"direction"}, nil)
)

// collector reads the router's state at scrape time.
type collector struct {
	srv     *Server
	replica func() replica.Stats
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descWorkers, descReady, descIndexBlocks, descIndexEntries, descEventsApplied,
		descEventsRejected, descEventGaps, descDumps, descExpired, descActive, descPrefill, descActiveBlocks, descTrackStreams, descChanStreams, descReplica, descReservations, descReserved} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	r := c.srv.r
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	keys := r.Workers()
	ids := map[string]bool{}
	active := r.Active()
	for _, k := range keys {
		ids[k.ID] = true
		l := active.Load(k)
		rank := strconv.FormatUint(uint64(k.DPRank), 10)
		gauge(descActive, float64(l.ActiveRequests), k.ID, rank)
		gauge(descPrefill, float64(l.PrefillTokens), k.ID, rank)
		gauge(descActiveBlocks, float64(l.ActiveBlocks), k.ID, rank)
	}
	gauge(descWorkers, float64(len(ids)))
	ready := 0.0
	if r.Ready() {
		ready = 1
	}
	gauge(descReady, ready)
	is := r.Index().Stats()
	gauge(descIndexBlocks, float64(is.Nodes))
	gauge(descIndexEntries, float64(is.Entries))
	counter(descEventsApplied, is.EventsApplied)
	counter(descEventsRejected, is.EventsRejected, "index")
	counter(descEventsRejected, r.UnknownWorkerEvents(), "unknown_worker")
	var gaps, dumpsOK, dumpsErr, invalid, stale uint64
	if c.srv.opts.EventStats != nil {
		es := c.srv.opts.EventStats()
		gaps, dumpsOK, dumpsErr, invalid, stale = es.Gaps, es.Dumps, es.DumpErrors, es.Invalid, es.Stale
	}
	counter(descEventsRejected, invalid, "undecodable")
	counter(descEventsRejected, stale, "stale")
	counter(descEventGaps, gaps)
	counter(descDumps, dumpsOK, "ok")
	counter(descDumps, dumpsErr, "error")
	counter(descExpired, active.Stats().Expired)
	rs := r.ReservationStats()
	gauge(descReserved, float64(rs.Held))
	counter(descReservations, rs.Made, "made")
	counter(descReservations, rs.Confirmed, "confirmed")
	counter(descReservations, rs.Released, "released")
	counter(descReservations, rs.Expired, "expired")
	counter(descReservations, rs.Missed, "missed")
	gauge(descTrackStreams, float64(c.srv.trackStreams.Load()))
	gauge(descChanStreams, float64(c.srv.channelStreams.Load()))
	if c.replica != nil {
		rs := c.replica()
		counter(descReplica, rs.Sent, "sent")
		counter(descReplica, rs.Received, "received")
		counter(descReplica, rs.Ignored, "ignored")
		counter(descReplica, rs.Failed, "failed")
	}
}
