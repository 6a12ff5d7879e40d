package sim

import (
	"context"
	"fmt"
	"math"

	"github.com/kvgate/kvgate/globalrouter/flowcontrol"
	"github.com/kvgate/kvgate/policies"
)

// CalibrationRequests bounds the requests of a calibration run.
const CalibrationRequests = 1000

// Capacity is the configured pools' capacity, measured by Calibrate.
type Capacity struct {
	// RPS is the sustained request rate the pools serve at saturation on
	// the trace's request mix: a backlog of Requests requests sampled
	// evenly from the trace (every k-th) all arrive at once, and RPS is
	// the completions between the 10th and the 90th percentile completion
	// over the time between them (the ramp-up before the first completions
	// and the drain after the backlog empties are left out).
	RPS float64 `json:"rps"`
	// Requests is the calibration's backlog (Refused of them refused);
	// WindowSeconds the time
	// between its 10th and 90th percentile completions (virtual).
	Requests      int     `json:"requests"`
	WindowSeconds float64 `json:"window_seconds"`
	// Refused counts the backlog's requests the configuration refused
	// even without its priority policy (a prompt too long for any KV
	// cache; with flow control, a queue deadline): the completions alone
	// make the rate.
	Refused int `json:"refused"`
	// TraceRPS is the replayed trace's own mean arrival rate, (n−1) /
	// (last arrival − first), before any scaling.
	TraceRPS float64 `json:"trace_rps"`
}

// rateFor is the multiplier of the trace's arrivals that offers load ×
// the capacity.
func (c *Capacity) rateFor(load float64) float64 { return load * c.RPS / c.TraceRPS }

// Calibrate measures the capacity of cfg's configured pools (Config.Global)
// on cfg's trace (Capacity.RPS). The calibration replays the same
// configuration with the same workers, without the priority and tenant
// mixes and without the admission rules: the chain's priority policy
// (its shedding would refuse the backlog) and flow control (the queue, or
// its saturation rule shedding, would refuse the backlog at its deadline
// or at once): the capacity is the pools', not the admission rule's, so
// a run with --flow-control and one without measure the same.
// The rate counts completions only; at least 10 are needed.
func Calibrate(ctx context.Context, cfg Config) (*Capacity, error) {
	cfg = cfg.withDefaults()
	if cfg.Global == nil || cfg.Global.Config == nil {
		return nil, fmt.Errorf("%w: capacity: needs a configuration replay", ErrConfig)
	}
	reqs := cfg.Trace.Scale(1, cfg.MaxRequests).Requests
	if len(reqs) < 10 {
		return nil, fmt.Errorf("%w: capacity: %d requests; the calibration needs at least 10", ErrConfig, len(reqs))
	}
	span := (reqs[len(reqs)-1].Arrival - reqs[0].Arrival).Seconds()
	if span <= 0 {
		return nil, fmt.Errorf("%w: capacity: the trace's arrivals span no time; --load cannot scale it", ErrConfig)
	}
	step := (len(reqs) + CalibrationRequests - 1) / CalibrationRequests
	var backlog []Request
	for i := 0; i < len(reqs); i += step {
		q := reqs[i]
		q.Arrival = 0
		backlog = append(backlog, q)
	}
	g := *cfg.Global
	g.Priorities, g.Tenants = nil, nil
	gc := *g.Config
	gc.Chain = nil
	for _, s := range g.Config.Chain {
		if s.Name != policies.NamePriority {
			gc.Chain = append(gc.Chain, s)
		}
	}
	gc.FlowControl = flowcontrol.Config{}
	g.Config = &gc
	c := cfg
	c.FlowControl = false
	c.Trace = &Trace{Requests: backlog, BlockSize: cfg.Trace.BlockSize}
	c.Rate, c.MaxRequests, c.Load, c.SLOMS, c.Progress, c.Parallel = 1, 0, 0, nil, nil, 1
	c.Global = &g
	rep, err := Run(ctx, c)
	if err != nil {
		return nil, fmt.Errorf("capacity: %w", err)
	}
	res := rep.Results[0]
	f := res.finishes
	if len(f) < 10 {
		return nil, fmt.Errorf("%w: capacity: the calibration served %d of %d requests (refused %v); it needs at least 10", ErrConfig, len(f), len(backlog), res.DecideRejected)
	}
	lo, hi := rank(len(f), 0.1), rank(len(f), 0.9)
	window := (f[hi] - f[lo]).Seconds()
	if hi <= lo || window <= 0 {
		return nil, fmt.Errorf("%w: capacity: the backlog of %d requests finished at once; nothing to measure", ErrConfig, len(backlog))
	}
	return &Capacity{RPS: float64(hi-lo) / window, Requests: len(backlog), Refused: res.Rejected, WindowSeconds: window,
		TraceRPS: float64(len(reqs)-1) / span}, nil
}

// rank is the index of the nearest-rank p-quantile of n sorted values.
func rank(n int, p float64) int {
	return max(0, min(n-1, int(math.Ceil(p*float64(n)))-1))
}
