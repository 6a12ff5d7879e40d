// Package overload is `kvgate bench -overload`: the live counterpart of
// `kvgate replay --load` (issue 24). Against `kvgate up` started in the
// process (or a running gateway at an address) it measures the system's
// capacity first, then offers a multiple of it (2× by default) with the
// replay's priority and tenant mixes, sent as the trusted
// x-kvgate-priority header and the tenancy header with the trust token,
// and reports the replay's figures from the real responses: per priority
// and per tenant the TTFT (from the stream's first token), the requests
// refused (429 or 503), the share meeting the priority's TTFT SLO,
// goodput, and Jain's fairness index over the tenants; then it checks
// that every local router's in-flight count is back to 0.
//
// Files: overload.go (the run: system, unloaded floor, calibration, the
// offered load, the in-flight check), request.go (one streamed request
// and its outcome), report.go (the figures and their table).
package overload

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/globalrouter/flowcontrol"
	"github.com/kvgate/kvgate/internal/up"
	"github.com/kvgate/kvgate/lib/config"
	"github.com/kvgate/kvgate/sim"
)

// Config shapes a run. Zero fields take the defaults of DefaultConfig.
type Config struct {
	// Addr is a running gateway's base URL (http://host:port); "" starts
	// Up in the process.
	Addr string
	// Admin is the admin base URL whose /kvgate/status.json lists each
	// pool's in-flight requests (`kvgate up`'s; set for Addr, found for
	// the in-process system); "" with Addr skips the in-flight check
	// (the report says so).
	Admin string
	// Up is the in-process system; its addresses are forced to free
	// loopback ports, its tenancy header and trust token set from
	// TenantHeader and TrustToken.
	Up up.Config
	// TrustToken is sent as x-kvgate-trust (the gateway's token: the
	// tenant header is believed only with it under tenancy.identity
	// trusted). In process, a random one is made when empty.
	TrustToken string
	// TenantHeader names the tenant ("x-tenant").
	TenantHeader string
	Model        string
	// Priorities and Tenants are the mixes (sim.ParseShares), drawn per
	// request from Seed; nil sends no such header.
	Priorities, Tenants []sim.Share
	// SLOMS is the TTFT target of each priority (nil: the replay's rule,
	// sim.DefaultSLOHighMultiple and sim.DefaultSLOLowMultiple × the
	// floor, the slowest unloaded request's whole duration: an engine that
	// runs few sequences makes a request that waits for a slot wait for a
	// whole request, not for a prefill).
	SLOMS map[int]float64
	// Load is the offered rate as a multiple of the measured capacity (2).
	Load float64
	// CalibrationStreams closed-loop clients run for Calibration to
	// measure the capacity.
	CalibrationStreams int
	Calibration        time.Duration
	// Duration is how long the load is offered.
	Duration       time.Duration
	MaxTokens      int
	RequestTimeout time.Duration
	Seed           uint64
	Logger         *slog.Logger
}

// DefaultConfig offers twice the capacity for 20 s, with the mixes of the
// issue, against a `kvgate up` of two pools of one mock worker each
// running at most 4 sequences (so the engines, not the machine, are the
// bottleneck), whose chain sheds at once (Shedding).
func DefaultConfig() Config {
	u := up.DefaultConfig()
	u.Pools = []up.PoolSpec{{Name: "pool-a", Workers: 1}, {Name: "pool-b", Workers: 1}}
	u.MaxNumSeqs = 4
	return Config{
		Up: u, TenantHeader: "x-tenant", Load: 2,
		Priorities:         []sim.Share{{Value: "1", Weight: 0.3}, {Value: "0", Weight: 0.7}},
		Tenants:            []sim.Share{{Value: "a", Weight: 4}, {Value: "b", Weight: 1}, {Value: "c", Weight: 1}, {Value: "d", Weight: 1}},
		CalibrationStreams: 32, Calibration: 6 * time.Second, Duration: 20 * time.Second,
		MaxTokens: 64, RequestTimeout: 2 * time.Minute, Seed: 1,
	}
}

// Shedding is the in-process system's chain: the default pool selection,
// then the priority policy's shed (429 for priorities ≤ 1, both bands of
// the default mix, when every pool's best worker is loaded). Loaded is
// read from the active KV, which counts a request from its commit whether
// the engine has admitted it or not (the mock engine, like vLLM's
// serving_chat.py, sends a stream's role chunk only with its first
// output, so a queued prompt also counts as prefill pending). 6,144 tokens are
// the prompt (about 370 tokens) and output (64) of 14 requests, three and
// a half times a worker's 4 running sequences (the 4-section handbook
// preamble its requests share counts once).
const Shedding = `
chain:
  - model-match
  - kv-overlap
  - cost
  - name: priority
    args:
      shed: {max_priority: 1, max_decode_tokens: 6144}
pools: [{name: p, models: [m], routers: {etcd: true}}]
`

// FlowSaturation is the in-process system's flow_control.saturation when
// its flow control is on and Config.Up sets none: a pool is saturated for
// the top band when its least-loaded worker has more than one engine
// batch of other prompts waiting for their first token, 4 running
// sequences × ~370-token prompts = 1,480 tokens, and for the lower band
// at lower_band_share of it (the default quarter: 370, one prompt), the
// headroom that keeps the top band out of the engine's first-come,
// first-served queue. The mock engine, like vLLM, counts a prompt waiting
// for a running slot as prefill pending, and so does the router until
// the prompt's first token. The flow_control default (16,384 tokens: two
// engine steps of 8,192) presumes the token budget bounds the engine;
// here its 4 running sequences do, and 16,384 tokens are ~44 of these
// prompts, 11 whole requests' wait per worker. One token (the former
// value) held a request whenever another prompt was being prefilled on
// both workers, in the running batch or not: at 0.7× its mean TTFT was
// 218-275 ms against 65-78 ms with the rule off and 85-115 ms shedding;
// this rule measured 85-235 ms (mean of five runs 169), the same 2×
// figures within the noise (BENCHMARKS.md, "Flow control: headroom for
// the high band"). Telling a prompt in the running batch from a queued
// one needs the engine's fresh waiting count, which the router lacks.
var FlowSaturation = flowcontrol.Saturation{MaxPrefillTokens: 4 * 370}

func (c *Config) defaults() error {
	d := DefaultConfig()
	if c.Addr == "" && c.Up.Model == "" && len(c.Up.Pools) == 0 {
		c.Up = d.Up
	}
	if c.TenantHeader == "" {
		c.TenantHeader = d.TenantHeader
	}
	if c.Load == 0 {
		c.Load = d.Load
	}
	config.PositiveOr(&c.CalibrationStreams, d.CalibrationStreams)
	config.PositiveOr(&c.Calibration, d.Calibration)
	config.PositiveOr(&c.Duration, d.Duration)
	config.PositiveOr(&c.MaxTokens, d.MaxTokens)
	config.PositiveOr(&c.RequestTimeout, d.RequestTimeout)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Addr != "" && c.Up.FlowControl.Enabled {
		return errors.New("overload: flow control (-overload-flow-control) is the in-process system's: with an address (-overload-addr) nothing reads it; set flow_control in that gateway's file")
	}
	if !(c.Load > 0) || math.IsInf(c.Load, 0) {
		return fmt.Errorf("overload: load %v: want a positive multiple of the capacity", c.Load)
	}
	for _, s := range c.Priorities {
		if _, err := strconv.Atoi(s.Value); err != nil {
			return fmt.Errorf("overload: priority mix: %q is not an integer priority", s.Value)
		}
	}
	return nil
}

// Run starts the system (unless Config.Addr), measures it and returns
// the report.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	base, admin := cfg.Addr, cfg.Admin
	if base == "" {
		if cfg.TrustToken == "" {
			// math/rand/v2's global source is ChaCha8 seeded by the
			// runtime from the OS: unpredictable to other local users.
			cfg.TrustToken = fmt.Sprintf("%016x%016x", rand.Uint64(), rand.Uint64())
		}
		u := cfg.Up
		u.OnLoopback()
		u.Logger = cfg.Logger
		if u.FlowControl.Enabled && u.FlowControl.Saturation == (flowcontrol.Saturation{}) {
			u.FlowControl.Saturation = FlowSaturation
		}
		sum := sha256.Sum256([]byte(cfg.TrustToken))
		u.Tenancy = globalrouter.TenancyConfig{Header: cfg.TenantHeader, Salt: true}
		u.TrustTokensSHA256 = []string{hex.EncodeToString(sum[:])}
		if u.Chain == nil {
			g, err := globalrouter.ParseConfig("overload.Shedding", []byte(Shedding), nil)
			if err != nil {
				return nil, err
			}
			u.Chain = g.Chain
		}
		sys, err := up.Start(ctx, u)
		if err != nil {
			return nil, err
		}
		defer func() { _ = sys.CloseWithin(30 * time.Second) }()
		base, admin = sys.GatewayURL(), sys.AdminURL()
		if cfg.Model == "" {
			cfg.Model = u.Model
		}
	}
	if cfg.Model == "" {
		cfg.Model = up.DefaultConfig().Model
	}
	tr := &http.Transport{MaxIdleConnsPerHost: 1024, DisableCompression: true}
	defer tr.CloseIdleConnections()
	b := &bench{cfg: cfg, base: base, client: &http.Client{Transport: tr}}

	rep := &Report{Load: cfg.Load, FlowControl: cfg.Addr == "" && cfg.Up.FlowControl.Enabled, LoadAverageBefore: loadAverage()}
	// The floor: requests one at a time on the idle system.
	var floor []float64
	for i := range 8 {
		o := b.send(ctx, i, "", "")
		if o.err != "" {
			return nil, fmt.Errorf("overload: an unloaded request failed: %s", o.err)
		}
		floor = append(floor, o.ttftMS)
		rep.UnloadedE2EMS = max(rep.UnloadedE2EMS, o.e2eMS)
	}
	rep.UnloadedTTFTMS = slices.Max(floor)
	slo, err := sloTargets(cfg, rep.UnloadedE2EMS)
	if err != nil {
		return nil, err
	}
	b.slo = slo
	rep.SLOMS = map[string]float64{}
	for p, v := range slo {
		rep.SLOMS[strconv.Itoa(p)] = v
	}

	if rep.CapacityRPS, rep.CalibrationRefused, err = b.calibrate(ctx); err != nil {
		return nil, err
	}
	rep.OfferedRPS = cfg.Load * rep.CapacityRPS
	cfg.Logger.Info("overload: capacity measured", "rps", rep.CapacityRPS, "offering", rep.OfferedRPS)

	outs := b.offer(ctx, rep.OfferedRPS)
	rep.WindowSeconds = cfg.Duration.Seconds()
	rep.figures(outs, slo)
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	rep.InFlightAfter, rep.InFlightChecked = b.inFlight(ctx, admin)
	rep.LoadAverageAfter = loadAverage()
	return rep, nil
}

// sloTargets is the replay's rule (sim.Config's SLO defaults) with the
// slowest unloaded request as the floor.
func sloTargets(cfg Config, floorMS float64) (map[int]float64, error) {
	prios := []int{0}
	if len(cfg.Priorities) > 0 {
		prios = prios[:0]
		for _, s := range cfg.Priorities {
			p, _ := strconv.Atoi(s.Value)
			prios = append(prios, p)
		}
	}
	slices.Sort(prios)
	if cfg.SLOMS != nil {
		for _, p := range prios {
			if _, ok := cfg.SLOMS[p]; !ok {
				return nil, fmt.Errorf("overload: slo: no target for priority %d (the mix sends %v)", p, prios)
			}
		}
		for p := range cfg.SLOMS {
			if !slices.Contains(prios, p) {
				return nil, fmt.Errorf("overload: slo: priority %d is not one the mix sends (%v)", p, prios)
			}
		}
		return cfg.SLOMS, nil
	}
	out := map[int]float64{}
	for _, p := range prios {
		k := float64(sim.DefaultSLOLowMultiple)
		if p == prios[len(prios)-1] {
			k = sim.DefaultSLOHighMultiple
		}
		out[p] = math.Ceil(k * floorMS)
	}
	return out, nil
}

type bench struct {
	cfg Config
	// slo is each priority's TTFT target, sent as x-kvgate-ttft-ms once
	// known (not with the unloaded floor's requests).
	slo    map[int]float64
	base   string
	client *http.Client
}

// calibrate runs CalibrationStreams closed-loop clients (each sends its
// next request when the previous one ends, with the offered run's mixes)
// for Calibration, and returns the completions per second over its
// second half (the first half fills the engines). A client whose request
// is refused pauses 50 ms before its next: the engines stay full (the
// chain sheds only when they are), and the refusals do not become a
// retry storm that measures the machine.
func (b *bench) calibrate(ctx context.Context) (float64, int, error) {
	start := time.Now()
	half, end := start.Add(b.cfg.Calibration/2), start.Add(b.cfg.Calibration)
	var mu sync.Mutex
	done, refused := 0, 0
	var firstErr string
	var wg sync.WaitGroup
	for i := range b.cfg.CalibrationStreams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(b.cfg.Seed, uint64(100+i)))
			for n := 0; time.Now().Before(end) && ctx.Err() == nil; n++ {
				o := b.send(ctx, 1000+i*100000+n, pick(b.cfg.Priorities, rng), pick(b.cfg.Tenants, rng))
				mu.Lock()
				switch {
				case o.refused:
					refused++
				case o.err != "":
					if firstErr == "" {
						firstErr = o.err
					}
				case o.end.After(half) && !o.end.After(end):
					done++
				}
				mu.Unlock()
				if o.refused {
					select {
					case <-ctx.Done():
					case <-time.After(50 * time.Millisecond):
					}
				}
			}
		}()
	}
	wg.Wait()
	switch {
	case ctx.Err() != nil:
		return 0, 0, ctx.Err()
	case firstErr != "":
		return 0, 0, fmt.Errorf("overload: calibration: %s", firstErr)
	case done == 0:
		return 0, 0, fmt.Errorf("overload: calibration: no request completed in its second half (%d refused); lengthen it", refused)
	}
	return float64(done) / end.Sub(half).Seconds(), refused, nil
}

// offer sends requests at rate (Poisson arrivals from Seed) for Duration
// and waits for every one to end.
func (b *bench) offer(ctx context.Context, rate float64) []outcome {
	rng := rand.New(rand.NewPCG(b.cfg.Seed, 24))
	var mu sync.Mutex
	var outs []outcome
	var wg sync.WaitGroup
	start := time.Now()
	at := time.Duration(0)
	for i := 0; ctx.Err() == nil; i++ {
		at += time.Duration(rng.ExpFloat64() / rate * float64(time.Second))
		if at >= b.cfg.Duration {
			break
		}
		prio, tenant := pick(b.cfg.Priorities, rng), pick(b.cfg.Tenants, rng)
		t := time.NewTimer(time.Until(start.Add(at)))
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := b.send(ctx, i, prio, tenant)
			mu.Lock()
			outs = append(outs, o)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return outs
}

// pick draws a share's value by weight ("" for no shares).
func pick(shares []sim.Share, rng *rand.Rand) string {
	var sum float64
	for _, s := range shares {
		sum += s.Weight
	}
	x := rng.Float64() * sum
	for _, s := range shares {
		if x -= s.Weight; x < 0 {
			return s.Value
		}
	}
	if len(shares) == 0 {
		return ""
	}
	return shares[len(shares)-1].Value
}

// inFlight polls admin's status.json until every pool's in-flight count
// is 0 (a stream's end frees it at once; the last frees may take a
// moment), or 10 s; it returns the last counts and whether it could read
// them.
func (b *bench) inFlight(ctx context.Context, admin string) (map[string]int, bool) {
	if admin == "" {
		return nil, false
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		counts, err := b.readInFlight(ctx, admin)
		if err != nil {
			b.cfg.Logger.Warn("overload: status.json", "err", err)
			return nil, false
		}
		total := 0
		for _, n := range counts {
			total += n
		}
		if total == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			return counts, true
		}
		time.Sleep(50 * time.Millisecond) // polling interval
	}
}

func (b *bench) readInFlight(ctx context.Context, admin string) (map[string]int, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", admin+"/kvgate/status.json", nil)
	if err != nil {
		return nil, err
	}
	resp, err := b.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s/kvgate/status.json: %s", admin, resp.Status)
	}
	var st struct {
		Pools []struct {
			Name           string `json:"name"`
			RequestsActive *int   `json:"requests_active"`
		} `json:"pools"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return nil, fmt.Errorf("%s/kvgate/status.json: %w", admin, err)
	}
	out := map[string]int{}
	for _, p := range st.Pools {
		if p.RequestsActive == nil {
			return nil, errors.New("status.json: pool " + p.Name + " lacks requests_active")
		}
		out[p.Name] = *p.RequestsActive
	}
	return out, nil
}
