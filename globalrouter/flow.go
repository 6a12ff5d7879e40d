package globalrouter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/globalrouter/flowcontrol"
	"github.com/kvgate/kvgate/policies"
)

// flowQueues are a Router's flow-control queues (flow_control), one per
// set of pools a model is served by, made on first use: a request whose
// candidate pools are all saturated waits in its pools' queue, so a
// saturated model does not hold back another's.
type flowQueues struct {
	m   *flowcontrol.Metrics
	log *slog.Logger
	mu  sync.Mutex // serialises making queues and Close
	// qs is copy-on-write: kick (every lease's free) reads it without a
	// lock.
	qs     atomic.Pointer[map[string]*flowcontrol.Live]
	closed bool
}

func newFlowQueues(m *flowcontrol.Metrics, log *slog.Logger) *flowQueues {
	f := &flowQueues{m: m, log: log}
	f.qs.Store(&map[string]*flowcontrol.Live{})
	return f
}

// kick tells every queue a pool may have room. Nil-safe, never blocks.
func (f *flowQueues) kick() {
	if f == nil {
		return
	}
	for _, q := range *f.qs.Load() {
		q.Kick()
	}
}

// queue returns key's queue, made with cfg when new (nil once closed).
// A queue keeps the configuration it was made with: a reload that
// changes flow_control (except its saturation thresholds, read per
// decision) applies to the queues made after it (warned).
func (f *flowQueues) queue(key string, cfg flowcontrol.Config) (*flowcontrol.Live, error) {
	if q := (*f.qs.Load())[key]; q != nil {
		if c := q.Config(); !sameQueueConfig(&c, &cfg) {
			f.log.Warn("flow_control changed: the queue keeps the configuration it started with until the router restarts", "queue", key)
		}
		return q, nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil, nil
	}
	qs := *f.qs.Load()
	if q := qs[key]; q != nil {
		return q, nil
	}
	q, err := flowcontrol.NewLive(cfg, nil, f.m.For(key))
	if err != nil {
		return nil, err
	}
	next := maps.Clone(qs)
	next[key] = q
	f.qs.Store(&next)
	return q, nil
}

// sameQueueConfig reports whether a and b make the same queue (the
// saturation thresholds and the objectives are not the queue's).
func sameQueueConfig(a, b *flowcontrol.Config) bool {
	a2, b2 := *a, *b
	b2.Defaults()
	a2.Saturation, b2.Saturation = flowcontrol.Saturation{}, flowcontrol.Saturation{}
	a2.Objectives, b2.Objectives = nil, nil // read per request
	a2.ObjectivesFile, b2.ObjectivesFile, a2.InferencePool, b2.InferencePool = "", "", "", ""
	return reflect.DeepEqual(a2, b2)
}

func (f *flowQueues) close() {
	f.mu.Lock()
	f.closed = true
	qs := *f.qs.Load()
	f.mu.Unlock()
	for _, q := range qs {
		q.Close()
	}
}

// FlowQueue is one flow-control queue's state, for status pages.
type FlowQueue struct {
	// Pools are the pools the queue's models are served by.
	Pools string
	Bands []flowcontrol.BandStats
}

// FlowQueues returns the flow-control queues (none when flow control is
// off or no request waited yet), by pools.
func (r *Router) FlowQueues() []FlowQueue {
	qs := *r.flow.qs.Load()
	keys := slices.Sorted(maps.Keys(qs))
	out := make([]FlowQueue, 0, len(keys))
	for _, k := range keys {
		out = append(out, FlowQueue{Pools: k, Bands: qs[k].Stats()})
	}
	return out
}

// FlowRequest is how flow control orders req: its priority, tenant, size
// and wait bound, and the key of its queue (the model's pools; "" when no
// pool serves the model, or flow control is off). The replay runs its
// queue with it.
func (r *Router) FlowRequest(req *Request) (flowcontrol.Request, string) {
	st := r.acquire()
	if st == nil {
		return flowcontrol.Request{}, ""
	}
	defer st.release()
	return st.flowRequest(req)
}

// FlowNeed is the predicted time to first token a saturated refusal of
// Decide carries (Refusal.TTFT: the request's service time once
// dispatched, flowcontrol.Request.Need), 0 when err carries none.
func FlowNeed(err error) time.Duration {
	var rf *Refusal
	if errors.As(err, &rf) {
		return rf.TTFT
	}
	return 0
}

func (st *state) flowRequest(req *Request) (flowcontrol.Request, string) {
	me := st.model(req.GetModel())
	if me == nil || !st.cfg.FlowControl.Enabled {
		return flowcontrol.Request{}, ""
	}
	out := flowcontrol.Request{Bytes: int64(req.BodyBytes)}
	if out.Bytes == 0 {
		out.Bytes = int64(len(req.Prompt) + 4*len(req.PromptTokens))
	}
	// Only what Decide honours orders the queue: a steering header or a
	// tenant from a caller who may not send it counts for nothing (its
	// decision will refuse it).
	trusted := st.cfg.Trust.trusted(req.Headers)
	if hdr, err := parseHeaders(req.Headers); err == nil {
		if !st.cfg.Trust.Steering.allows(trusted) {
			hdr = headers{}
		}
		st.cfg.objectivePriority(req.Headers, &hdr, trusted)
		out.Priority, out.Wait = hdr.priority, hdr.slo.TTFT
	}
	if tenant, err := st.cfg.Tenancy.tenant(req, trusted); err == nil {
		out.Flow = tenant
	}
	return out, me.flowKey
}

// Decide implements Decider. With flow control on, a request whose pools
// are all saturated waits in its pools' queue (flow.go) until a pool has
// room, its deadline, or its client leaving; a request arriving while
// others of its band or above wait joins them without a decision of its
// own (it would overtake them).
func (r *Router) Decide(ctx context.Context, req *Request) (*Decision, error) {
	d, err := r.decideFlow(ctx, req)
	r.countDecision(d, err)
	return d, err
}

// decideFlow is Decide, uncounted.
func (r *Router) decideFlow(ctx context.Context, req *Request) (*Decision, error) {
	st := r.acquire()
	if r.opts.noFlowQueue || st == nil {
		if st != nil {
			st.release()
		}
		return r.decideOnce(ctx, req)
	}
	me := st.model(req.GetModel())
	cfg := st.cfg.FlowControl
	st.release()
	if me == nil || !cfg.Enabled {
		return r.decideOnce(ctx, req)
	}
	q, err := r.flow.queue(me.flowKey, cfg)
	switch {
	case err != nil:
		return nil, fmt.Errorf("%w: flow control: %w", ErrNoPool, err)
	case q == nil:
		return nil, fmt.Errorf("%w: the global router is closed", ErrNoPool)
	}
	var need time.Duration
	fr, key := r.FlowRequest(req)
	seen := q.Kicks() // a free during its decision is not lost (WaitAfter)
	if q.Ahead(fr.Priority) == 0 {
		d, err := r.decideOnce(ctx, req)
		if !errors.Is(err, ErrSaturated) || ctx.Err() != nil {
			return d, err
		}
		need = FlowNeed(err)
	}
	if key != me.flowKey { // reloaded meanwhile: no longer its queue
		return r.decideOnce(ctx, req)
	}
	fr.Need = need
	var d *Decision
	var start time.Time // set by Wait before any try
	try := func(ctx context.Context) error {
		dd, err := r.decideOnce(ctx, req)
		if errors.Is(err, ErrSaturated) {
			return flowcontrol.ErrSaturated
		}
		if err == nil {
			// Deadline-aware dispatch: a request that would miss its
			// target on the worker it got goes back, refused, and its
			// place serves one that can still make it.
			if rf := flowcontrol.Late(&fr, r.opts.now().Sub(start), dd.TTFT); rf != nil {
				_ = dd.Lease.Free(context.WithoutCancel(ctx))
				return rf
			}
		}
		d = dd
		return err
	}
	undo := func() { _ = d.Lease.Free(context.WithoutCancel(ctx)) }
	start = r.opts.now()
	err = q.WaitAfter(ctx, fr, seen, try, undo)
	var rf *flowcontrol.Refused
	if errors.As(err, &rf) {
		return nil, &Refusal{Kind: ErrSaturated, Reason: rf.Reason, Public: rf.Msg, Err: rf}
	}
	if err != nil {
		return nil, err
	}
	return d, nil
}

// flowSaturated reports whether flow control holds the request: it is on
// and every candidate that serves (prefill pools aside: a decode worker
// can prefill locally) is saturated: above the saturation thresholds,
// under the priority policy's shed rule (policies.PriorityShed.Loaded)
// applied to the load the request would join (its best worker's
// potential load less the request's own share: its uncached prompt, its
// blocks, so that a prompt longer than the threshold still goes to an
// idle pool), or every worker's engine saturated as the pool's worker
// chain sees it (the saturation filter's saturation_waiting,
// saturation_kv_usage; the probe's AllSaturated).
//
// need is the request's least predicted time to first token among the
// serving candidates (routing.Selection.TTFT): the time it still needs
// once dispatched, which shortens its queue deadline.
func flowSaturated(cfg *flowcontrol.Config, cands []policies.Candidate, isl, priority int) (saturated bool, need time.Duration) {
	if !cfg.Enabled {
		return false, 0
	}
	need = -1
	sat := cfg.SaturationFor(priority)
	rule := policies.PriorityShed{MaxPrefillTokens: max(sat.MaxPrefillTokens, 0), MaxDecodeTokens: sat.MaxDecodeTokens}
	serving := 0
	for _, c := range cands {
		if c.Role == policies.RolePrefill {
			continue
		}
		serving++
		if t := millis(c.Probe.TTFT); need < 0 || t < need {
			need = t
		}
		pr := c.Probe
		pr.ISL = isl
		c.Probe.PrefillTokens = max(pr.PrefillTokens-pr.UncachedTokens(), 0)
		c.Probe.DecodeBlocks = max(pr.DecodeBlocks-pr.RequestBlocks, 0)
		if !rule.Loaded(c) && !c.Probe.AllSaturated {
			return false, 0
		}
	}
	return serving > 0, max(need, 0)
}

// millis is a routing.Selection's milliseconds as a duration.
func millis(ms float64) time.Duration {
	if !(ms > 0) || ms > float64(math.MaxInt64/int64(time.Millisecond)) {
		return 0
	}
	return time.Duration(ms * float64(time.Millisecond))
}
