package loadbench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/kvgate/kvgate/envoy/extprocclient"
	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/localrouter"
	"github.com/kvgate/kvgate/pool"
	"github.com/kvgate/kvgate/pool/pooltest"
)

// ActiveActiveConfig is the active-active burst (`kvgate bench
// -active-active N`, issue 26 item 3): Routers global routers, each behind
// its own ext_proc server (Envoy Gateway runs the ext_proc server with
// two replicas), share the same local routers (Pools: workers per pool,
// real gRPC on loopback, the production transport); the Envoy-faithful
// client sends Burst identical long prompts at once, request i to router
// i mod Routers, and holds every routed stream open (requests in flight)
// until the whole burst is routed. With Kill, router 0 is killed (its
// local-router channels cut, then its ext_proc streams) once it routed
// half of its share: the local routers must free what it held.
type ActiveActiveConfig struct {
	Routers int   // default 2
	Pools   []int // workers per pool; default [4]
	Burst   int   // default 64
	Runs    int   // bursts, each on fresh global routers; default 1
	Kill    bool
	// Process runs each global router and its ext_proc server in a child
	// process (this binary re-executed: its main, or TestMain, must call
	// ServeChild first), killed with SIGKILL; off, in this process, killed
	// by closing its connections at once.
	Process bool
	// Probe is the global routers' probe configuration (commit mode,
	// deadlines; a -probe-config file's); zero: the defaults with deadlines
	// of 30 s, so that no commit falls back for want of an answer on a
	// loaded machine (the fall-back is not what is measured). Its Commit
	// is the mode measured.
	Probe  globalrouter.ProbeConfig
	Logger *slog.Logger // progress; nil: none
	// Tokenizer is the in-process global routers' (nil: cl100k_base,
	// loaded by this call; a child process loads its own): tests share
	// one across their rows.
	Tokenizer globalrouter.Tokenizer
}

// ActiveActiveRun is one burst's outcome.
type ActiveActiveRun struct {
	// Placed is the requests in flight on each worker ("pool/worker") once
	// every exchange ended its request phase, as the local routers count
	// them.
	Placed map[string]int `json:"placed"`
	// Routed is each router's exchanges that got a destination; Failed
	// those that did not (the killed router's).
	Routed []int `json:"routed"`
	Failed int   `json:"failed"`
	// Even: every worker got Burst / workers (not asked of a run with Kill).
	Even bool `json:"even"`
	// Samples is how often the counts were sampled during the burst;
	// Violations every count found off (during, at the hold, after).
	// HeldTwice is the most requests the local routers held above the
	// exchanges opened in any sample (a contended commit moving pools, a
	// reservation on a losing pool), and Moved the contended commits that
	// moved pools (probe.commit: decide over several pools).
	Samples    int      `json:"samples"`
	HeldTwice  int      `json:"held_twice"`
	Moved      int      `json:"moved"`
	Violations []string `json:"violations,omitempty"`
}

// ActiveActiveResult is every run's outcome.
type ActiveActiveResult struct {
	Commit  globalrouter.CommitMode `json:"commit"`
	Routers int                     `json:"routers"`
	Pools   []int                   `json:"pools"`
	Burst   int                     `json:"burst"`
	Kill    bool                    `json:"kill"`
	Process bool                    `json:"process"`
	Runs    []ActiveActiveRun       `json:"runs"`
	// EvenRuns counts the runs that spread exactly; MaxOnOneWorker is the
	// most requests one worker got in any run; ExactRuns counts the runs
	// with no violation.
	EvenRuns       int `json:"even_runs"`
	ExactRuns      int `json:"exact_runs"`
	MaxOnOneWorker int `json:"max_on_one_worker"`
}

func (c *ActiveActiveConfig) defaults() {
	if c.Routers <= 0 {
		c.Routers = 2
	}
	if len(c.Pools) == 0 {
		c.Pools = []int{4}
	}
	if c.Burst <= 0 {
		c.Burst = 64
	}
	if c.Runs <= 0 {
		c.Runs = 1
	}
	if c.Probe.Timeout <= 0 {
		c.Probe.Timeout, c.Probe.MinTimeout = 30*time.Second, 30*time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// AcceptedCommitModes splits the commit modes kvgate knows of into those
// the global router's configuration validation accepts and those it
// refuses: tests run a row per accepted mode and log the refused (a
// mode a later version adds joins this list).
func AcceptedCommitModes() (accepted, refused []globalrouter.CommitMode) {
	for _, m := range []globalrouter.CommitMode{globalrouter.CommitDecide, globalrouter.CommitPipelined, globalrouter.CommitReserve} {
		if CheckCommitMode(m) == nil {
			accepted = append(accepted, m)
		} else {
			refused = append(refused, m)
		}
	}
	return accepted, refused
}

// CheckCommitMode is the global router's configuration validation of a
// configuration whose probe.commit is m.
func CheckCommitMode(m globalrouter.CommitMode) error {
	cfg := globalrouter.DefaultConfig(pool.NewConfig("p", 16, []string{decisionModel}, "127.0.0.1:1"))
	cfg.Probe.Commit = m
	return cfg.Validate(nil)
}

// ActiveActive runs the active-active bursts.
func ActiveActive(ctx context.Context, cfg ActiveActiveConfig) (ActiveActiveResult, error) {
	cfg.defaults()
	res := ActiveActiveResult{Commit: cfg.Probe.Commit, Routers: cfg.Routers, Pools: cfg.Pools, Burst: cfg.Burst, Kill: cfg.Kill, Process: cfg.Process}
	if res.Commit == "" {
		res.Commit = globalrouter.CommitDecide
	}
	if err := CheckCommitMode(res.Commit); err != nil {
		return res, fmt.Errorf("active-active: %w", err)
	}
	tok := cfg.Tokenizer
	if tok == nil {
		var err error
		if tok, err = loadDecisionTokenizer(); err != nil {
			return res, err
		}
	}
	var (
		servers []*pooltest.Server
		pcs     []pool.Config
	)
	defer func() {
		for _, s := range servers {
			s.Close()
		}
	}()
	for i, n := range cfg.Pools {
		name := fmt.Sprint("pool-", i)
		s, err := pooltest.Serve("127.0.0.1:0", name, 16, pooltest.Workers(fmt.Sprint("p", i), n)...)
		if err != nil {
			return res, err
		}
		servers = append(servers, s)
		pcs = append(pcs, pool.NewConfig(name, 16, []string{decisionModel}, s.Addr))
	}
	body := aaBody()
	for run := range cfg.Runs {
		r, err := activeActiveRun(ctx, cfg, servers, pcs, tok, body)
		if err != nil {
			return res, fmt.Errorf("active-active run %d: %w", run, err)
		}
		res.Runs = append(res.Runs, r)
		if r.Even {
			res.EvenRuns++
		}
		if len(r.Violations) == 0 {
			res.ExactRuns++
		}
		for _, n := range r.Placed {
			res.MaxOnOneWorker = max(res.MaxOnOneWorker, n)
		}
		cfg.Logger.Info("active-active run", "run", run, "commit", res.Commit, "routers", cfg.Routers, "placed", r.Placed, "routed", r.Routed,
			"failed", r.Failed, "violations", len(r.Violations))
	}
	return res, nil
}

// aaBody is the burst's prompt: a completion of about 7,000 tokens, the
// same for every request.
func aaBody() []byte {
	return fmt.Appendf(nil, `{"model":%q,"stream":true,"max_tokens":8,"prompt":%q}`, decisionModel, strings.Repeat(decisionParagraph, 4))
}

// poolLoads is the requests in flight on each worker of servers
// ("pool/worker") and their total.
func poolLoads(servers []*pooltest.Server) (map[string]int, int) {
	out := map[string]int{}
	total := 0
	for i, s := range servers {
		s.Router.Active().Loads(func(k localrouter.WorkerKey, l localrouter.WorkerLoad) {
			if l.ActiveRequests > 0 {
				out[fmt.Sprintf("pool-%d/%s", i, k.ID)] += l.ActiveRequests
				total += l.ActiveRequests
			}
		})
	}
	return out, total
}

// reservationStats are each local router's reservation counters (for a
// count found off: an expired or missed reservation explains one).
func reservationStats(servers []*pooltest.Server) string {
	var b strings.Builder
	for i, s := range servers {
		fmt.Fprintf(&b, "pool-%d %+v; ", i, s.Router.ReservationStats())
	}
	return strings.TrimSuffix(b.String(), "; ")
}

// pollUntil calls cond every 2 ms until it holds (nil) or ctx ends
// (cond's last error).
func pollUntil(ctx context.Context, cond func() error) error {
	for {
		err := cond()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// aaExchange sends one request on s and reads until the request is
// released upstream with a destination (routed), or fails; the stream
// stays open (the request in flight) until the caller closes it. A gate
// (nil: none) holds the body back until it closes.
func aaExchange(ctx context.Context, side *aaSide, body []byte, gate <-chan struct{}) (*extprocclient.Stream, string, error) {
	st := side.client.Open(ctx, nil)
	side.opened.Add(1)
	hdr := extprocclient.Headers{
		{Key: ":method", Value: "POST"}, {Key: ":path", Value: "/v1/completions"},
		{Key: ":authority", Value: "gateway.local"}, {Key: ":scheme", Value: "http"},
		{Key: "content-type", Value: "application/json"},
	}
	if err := st.SendRequestHeaders(ctx, hdr, false); err != nil {
		return st, "", err
	}
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return st, "", ctx.Err()
		}
	}
	if err := st.SendRequestData(ctx, body, true); err != nil {
		return st, "", err
	}
	dest := ""
	for {
		f, err := st.ReadUpstream(ctx)
		switch {
		case errors.Is(err, io.EOF):
			if dest == "" {
				return st, "", errors.New("request released without a destination")
			}
			side.routed.Add(1)
			return st, dest, nil
		case errors.Is(err, extprocclient.ErrLocalReply):
			lr := st.Info().LocalReply
			return st, "", fmt.Errorf("local reply %d %s", lr.Status, lr.Body)
		case err != nil:
			return st, "", err
		}
		if f.Kind == extprocclient.FrameHeaders {
			if d, ok := f.Headers.Get("x-gateway-destination-endpoint"); ok {
				dest, _, _ = strings.Cut(d, ",") // the primary; fallbacks follow
			}
		}
	}
}

// aaViolations is a run's violations (the first 20).
type aaViolations struct {
	mu   sync.Mutex
	list []string
}

func (v *aaViolations) add(format string, args ...any) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if len(v.list) < 20 {
		v.list = append(v.list, fmt.Sprintf(format, args...))
	}
}
