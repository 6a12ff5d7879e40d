package loadbench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvgate/kvgate/envoy/extprocclient"
	"github.com/kvgate/kvgate/extproc"
	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/lib/config"
	"github.com/kvgate/kvgate/pool"
)

// aaServer is one global router behind its ext_proc server, in this
// process (aaLocal) or in a child process (aaChild).
type aaServer interface {
	addr() string
	// metric sums the gauge or counter name's series (those whose label
	// is value, if label is set); a metric not exported yet is 0.
	metric(name, label, value string) (int, error)
	// kill cuts the router's channels to the local routers and its
	// ext_proc streams at once, nothing freed gracefully first: what a
	// crash leaves.
	kill()
	stop()
}

// aaSide is a router under test and the client's connection to it.
type aaSide struct {
	srv    aaServer
	conn   *grpc.ClientConn
	client *extprocclient.Client
	killed atomic.Bool
	// opened and routed count the client's exchanges to it.
	opened, routed atomic.Int64
	lastMoved      atomic.Int64
}

// errKilled is a killed router's answer to every question.
var errKilled = errors.New("the router was killed")

// read is srv.metric, errKilled once the router is killed (a child
// killed mid-question fails it).
func (s *aaSide) read(name, label, value string) (int, error) {
	if s.killed.Load() {
		return 0, errKilled
	}
	n, err := s.srv.metric(name, label, value)
	if err != nil && s.killed.Load() {
		return 0, errKilled
	}
	return n, err
}

// inflight is the ext_proc server's count of streams in flight
// (kvgate_extproc_streams_active).
func (s *aaSide) inflight() (int, error) {
	return s.read("kvgate_extproc_streams_active", "", "")
}

// moved is the router's contended commits that moved to another pool
// (kvgate_globalrouter_contended_commits_total{outcome="moved"}): each
// held its request on two pools for a moment (commit.go's recheck commits
// on the new pool, then frees the old). A killed router's is its last
// count.
func (s *aaSide) moved() (int, error) {
	n, err := s.read("kvgate_globalrouter_contended_commits_total", "outcome", "moved")
	if errors.Is(err, errKilled) {
		return int(s.lastMoved.Load()), nil
	}
	s.lastMoved.Store(int64(n))
	return n, err
}

func (s *aaSide) kill() {
	if !s.killed.Swap(true) {
		s.srv.kill()
	}
}

func (s *aaSide) stop() {
	if s.conn != nil {
		_ = s.conn.Close()
	}
	s.kill()
	s.srv.stop()
}

func startAASide(ctx context.Context, process bool, pcs []pool.Config, probe globalrouter.ProbeConfig, tok globalrouter.Tokenizer) (_ *aaSide, err error) {
	s := &aaSide{}
	if process {
		s.srv, err = startAAChild(ctx, pcs, probe)
	} else {
		s.srv, err = startAALocal(pcs, probe, tok)
	}
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			s.stop()
		}
	}()
	if s.conn, err = grpc.NewClient(s.srv.addr(), append(extprocclient.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...); err != nil {
		return nil, err
	}
	s.client, err = extprocclient.New(s.conn, extprocclient.Config{
		ProcessingMode: &extprocfilterv3.ProcessingMode{
			RequestBodyMode: extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED, RequestTrailerMode: extprocfilterv3.ProcessingMode_SEND,
			ResponseBodyMode: extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED, ResponseTrailerMode: extprocfilterv3.ProcessingMode_SEND,
		},
		ReceivingNamespaces: []string{"envoy.lb"},
		MessageTimeout:      60 * time.Second,
		BufferLimit:         32 << 20,
	}, slog.New(slog.DiscardHandler))
	return s, err
}

// aaLocal is a global router and its ext_proc server in this process.
type aaLocal struct {
	router *globalrouter.Router
	reg    *prometheus.Registry
	g      *grpc.Server
	lis    net.Listener
}

func startAALocal(pcs []pool.Config, probe globalrouter.ProbeConfig, tok globalrouter.Tokenizer) (_ *aaLocal, err error) {
	s := &aaLocal{reg: prometheus.NewRegistry()}
	cfg := globalrouter.DefaultConfig(pcs...)
	cfg.Probe = probe
	cfg.Defaults()
	discard := slog.New(slog.DiscardHandler)
	if tok == nil { // a child process's: its own, loaded once
		if tok, err = loadDecisionTokenizer(); err != nil {
			return nil, err
		}
	}
	opts := []globalrouter.Option{globalrouter.WithLogger(discard), globalrouter.WithRegisterer(s.reg), globalrouter.WithTokenizer(decisionModel, tok)}
	if s.router, err = globalrouter.New(cfg, opts...); err != nil {
		return nil, err
	}
	xs, err := extproc.New(extproc.Config{}, s.router, discard, s.reg)
	if err != nil {
		_ = s.router.Close()
		return nil, err
	}
	s.g = grpc.NewServer()
	xs.Register(s.g)
	if s.lis, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		_ = s.router.Close()
		return nil, err
	}
	go func() { _ = s.g.Serve(s.lis) }()
	return s, nil
}

func (s *aaLocal) addr() string { return s.lis.Addr().String() }

func (s *aaLocal) metric(name, label, value string) (int, error) {
	return gatherSum(s.reg, name, label, value)
}

// gatherSum sums the gauge or counter name's series in reg (those whose
// label is value, if label is set); a metric not exported yet is 0 (a
// counter vector has no series before its first count).
func gatherSum(reg prometheus.Gatherer, name, label, value string) (int, error) {
	mfs, err := reg.Gather()
	if err != nil {
		return 0, err
	}
	n := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if label != "" && !hasLabel(m.GetLabel(), label, value) {
				continue
			}
			n += m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	return int(n), nil
}

func hasLabel(ls []*dto.LabelPair, name, value string) bool {
	for _, l := range ls {
		if l.GetName() == name && l.GetValue() == value {
			return true
		}
	}
	return false
}

// kill closes the router (its local-router connections: the channels
// break, with every lease still open) and stops the ext_proc server at
// once (its streams break).
func (s *aaLocal) kill() {
	_ = s.router.Close()
	s.g.Stop()
}

func (s *aaLocal) stop() {}

// The child process's environment: aaServerEnv marks it, aaPoolsEnv
// lists the pools (name=address, comma-separated, block size 16) and
// aaProbeEnv is the probe configuration as YAML.
const (
	aaServerEnv = config.EnvAAServer
	aaPoolsEnv  = config.EnvAAPools
	aaProbeEnv  = config.EnvAAProbe
)

// aaChild is a global router and its ext_proc server in a child process
// (this binary re-executed; ServeChild): killed with SIGKILL, the kernel
// cuts every connection it had.
type aaChild struct {
	ps *probeServer
}

func startAAChild(ctx context.Context, pcs []pool.Config, probe globalrouter.ProbeConfig) (*aaChild, error) {
	var pools []string
	for _, pc := range pcs {
		pools = append(pools, pc.Name+"="+pc.Routers.Static[0])
	}
	ps, err := startChild(ctx, "active-active", aaServerEnv+"=1", aaPoolsEnv+"="+strings.Join(pools, ","), aaProbeEnv+"="+probeYAML(probe))
	if err != nil {
		return nil, err
	}
	return &aaChild{ps: ps}, nil
}

// probeYAML is the probe configuration the child is started with: the
// commit mode and the deadlines (what ActiveActiveConfig sets).
func probeYAML(p globalrouter.ProbeConfig) string {
	return fmt.Sprintf("probe: {commit: %q, timeout: %q, min_timeout: %q}", p.Commit, p.Timeout, p.MinTimeout)
}

func (c *aaChild) addr() string { return c.ps.addr }

func (c *aaChild) metric(name, label, value string) (int, error) {
	if label == "" {
		label, value = "-", "-"
	}
	if _, err := fmt.Fprintf(c.ps.in, "metric %s %s %s\n", name, label, value); err != nil {
		return 0, fmt.Errorf("active-active: router process: %w", err)
	}
	line, err := c.ps.line()
	if err != nil {
		return 0, fmt.Errorf("active-active: router process: %w", err)
	}
	n, err := strconv.Atoi(strings.TrimPrefix(line, "n "))
	if err != nil {
		return 0, fmt.Errorf("active-active: router process: %q: %w", line, err)
	}
	return n, nil
}

func (c *aaChild) kill() { _ = c.ps.cmd.Process.Kill() }

func (c *aaChild) stop() { c.ps.stop() }

// serveAARouter is the child process: it serves a global router behind
// an ext_proc server on the pools of its environment, prints "addr
// HOST:PORT", and answers each line "metric NAME LABEL VALUE" ("-" for
// no label) with "n COUNT", until its input closes.
func serveAARouter(in io.Reader, out io.Writer) error {
	var pcs []pool.Config
	for _, kv := range strings.Split(os.Getenv(aaPoolsEnv), ",") {
		name, addr, ok := strings.Cut(kv, "=")
		if !ok {
			return fmt.Errorf("%s: %q is not name=address", aaPoolsEnv, kv)
		}
		pcs = append(pcs, pool.NewConfig(name, 16, []string{decisionModel}, addr))
	}
	probe, err := ParseProbeConfig(aaProbeEnv, []byte(os.Getenv(aaProbeEnv)))
	if err != nil {
		return err
	}
	s, err := startAALocal(pcs, probe, nil)
	if err != nil {
		return err
	}
	defer s.kill()
	if _, err := fmt.Fprintf(out, "addr %s\n", s.addr()); err != nil {
		return err
	}
	lines := bufio.NewScanner(in)
	for lines.Scan() {
		f := strings.Fields(lines.Text())
		if len(f) != 4 || f[0] != "metric" {
			return fmt.Errorf("active-active router: unknown command %q", lines.Text())
		}
		if f[2] == "-" {
			f[2], f[3] = "", ""
		}
		n, err := s.metric(f[1], f[2], f[3])
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintf(out, "n %d\n", n); err != nil {
			return err
		}
	}
	return lines.Err()
}
