package globalrouter

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	localrouterv1 "github.com/kvgate/kvgate/api/localrouter/v1"
	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/policies"
	"github.com/kvgate/kvgate/pool"
)

// A global router answers for its subtree (docs/hierarchy.md): the probe a
// parent global router sends a pool's local router, answered over this
// router's own pools, so that a pool of the parent's configuration can be
// another global router.
//
//   - Probe (state free) runs this router's probe and policy chain over its
//     pools without committing and answers the best worker below it, with
//     its worker id qualified by the pool that owns it ("pool/worker"; the
//     pool name has no '/', so the first '/' splits, and a deeper subtree's
//     answer nests: "region/pool/worker" one floor up), its overlap and
//     load as that pool's local router reported them, and a normalised
//     cost (Normalised).
//   - Loads: every worker rank below it, qualified the same way.
//   - Commit with a qualified worker id is forwarded to the pool that owns
//     it; without one (decide-and-commit) it decides as Probe does and
//     commits on the winner, trying the next-ranked pool when a commit
//     cannot be sent. The Tracker is the owning pool's: prefill complete
//     and free are forwarded, and a broken stream frees the request there.
//   - The request comes as block hashes at a block size (pool.Prompt): the
//     pools of that block size answer; pools of another block size are not
//     eligible (the subtree cannot rehash: it has no tokens), and a subtree
//     with none answers INVALID_ARGUMENT (BLOCK_SIZE_MISMATCH). A prompt
//     shorter than one block comes as tokens: every pool is eligible and
//     its local router hashes them. Prefill pools are never eligible: a
//     subtree answers for aggregated and decode workers (a disaggregated
//     pair is chosen by the router that owns both pools).
//   - Loops: every call carries a hop count (pool.HopsMetadata): how many
//     subtree routers it passed. A call whose count reached the maximum
//     depth (SubtreeOptions.MaxDepth, default 8) is refused with
//     FAILED_PRECONDITION "routing loop or tree deeper than N"; the calls
//     made for it carry the count plus one. At configuration load, a pool
//     whose static router is this router's own subtree address, or that is
//     named as this router's own subtree pool, is refused.

// DefaultMaxDepth is the deepest tree of subtree routers a call may cross
// (SubtreeOptions.MaxDepth).
const DefaultMaxDepth = 8

// SubtreeOptions say how a Router answers for its subtree (WithSubtree).
type SubtreeOptions struct {
	// Addresses are this router's own subtree addresses (host:port: the
	// listen address and the advertised one): a pool whose static router
	// is one of them is refused at configuration load.
	Addresses []string
	// Pool is the pool name this router registers as a router of (etcd):
	// a pool of that name in its own configuration is refused.
	Pool string
	// MaxDepth is the deepest tree a call may cross (default
	// DefaultMaxDepth).
	MaxDepth int
	// Model, when set, restricts the subtree to the pools serving it and
	// is the model the policy chain sees (the wire carries none).
	Model string
}

// WithSubtree says how the Router answers for its subtree: loop checks at
// configuration load, the maximum depth, the model. Without it the Router
// still answers (Subtree), with the default depth and every pool.
func WithSubtree(s SubtreeOptions) Option { return func(o *options) { o.subtree = s } }

func (s SubtreeOptions) maxDepth() int {
	if s.MaxDepth > 0 {
		return s.MaxDepth
	}
	return DefaultMaxDepth
}

// checkLoops refuses a configuration in which this router would route to
// itself: a pool whose static router is one of its own subtree addresses,
// or a pool named as its own subtree pool (discovering it in etcd would
// find this router).
func (s SubtreeOptions) checkLoops(cfg *Config) error {
	for _, pc := range cfg.Pools {
		if s.Pool != "" && pc.Name == s.Pool {
			return fmt.Errorf("%s: pool %q: this router answers for its subtree as a router of pool %q (-subtree-pool): routing to it would be a routing loop", cfg.file(), pc.Name, s.Pool)
		}
		for _, a := range pc.Routers.Static {
			for _, self := range s.Addresses {
				if sameAddress(a, self) {
					return fmt.Errorf("%s: pool %q: routers.static %q is this router's own subtree address %q (-subtree-listen): routing to it would be a routing loop", cfg.file(), pc.Name, a, self)
				}
			}
		}
	}
	return nil
}

// sameAddress reports whether two host:port addresses name one listener:
// equal, or the same port on hosts that are both this machine (loopback,
// unspecified, localhost).
func sameAddress(a, b string) bool {
	if a == b {
		return true
	}
	ha, pa, err1 := net.SplitHostPort(a)
	hb, pb, err2 := net.SplitHostPort(b)
	if err1 != nil || err2 != nil || pa != pb {
		return false
	}
	local := func(h string) bool {
		if h == "" || strings.EqualFold(h, "localhost") {
			return true
		}
		ip := net.ParseIP(h)
		return ip != nil && (ip.IsLoopback() || ip.IsUnspecified())
	}
	return strings.EqualFold(ha, hb) || (local(ha) && local(hb))
}

// Subtree is a Router answering for the subtree it routes, as a pool's
// local router answers for its workers. It implements pool.Client (in
// process: tests and the replay stack routers without gRPC), and
// globalrouter/subtree serves it over gRPC. Safe for concurrent use.
type Subtree struct {
	r *Router
}

var _ pool.Client = (*Subtree)(nil)

// Subtree returns the Router answering for its subtree.
func (r *Router) Subtree() *Subtree { return &Subtree{r: r} }

// treeError is an error of the subtree with the gRPC status a local router
// would answer (code and ErrorInfo reason), unwrapping to the local
// router's sentinel where one applies: errors.Is works in process, and
// status.FromError at the server.
type treeError struct {
	st  *status.Status
	err error
}

func (e *treeError) Error() string              { return e.st.Message() }
func (e *treeError) GRPCStatus() *status.Status { return e.st }
func (e *treeError) Unwrap() error              { return e.err }

func treeErr(code codes.Code, reason string, sentinel error, format string, args ...any) error {
	st := status.New(code, fmt.Sprintf(format, args...))
	if reason != "" {
		if d, err := st.WithDetails(&errdetails.ErrorInfo{Domain: localrouterv1.ErrorDomain, Reason: reason}); err == nil {
			st = d
		}
	}
	return &treeError{st: st, err: sentinel}
}

// ErrRoutingLoop is the error of a call refused for its hop count.
var ErrRoutingLoop = errors.New("routing loop")

// IsRoutingLoop reports whether err is a call refused for its hop count,
// here or below (over the wire, by its message).
func IsRoutingLoop(err error) bool {
	if errors.Is(err, ErrRoutingLoop) {
		return true
	}
	st, ok := status.FromError(err)
	return ok && st.Code() == codes.FailedPrecondition && strings.Contains(st.Message(), "routing loop or tree deeper than")
}

// enter checks a call's hop count and takes the current state; ctx is
// returned with the count the calls made for it carry. release the state.
func (s *Subtree) enter(ctx context.Context) (context.Context, *state, error) {
	h, max := pool.Hops(ctx), s.r.opts.subtree.maxDepth()
	if h >= max {
		return ctx, nil, treeErr(codes.FailedPrecondition, "", ErrRoutingLoop,
			"routing loop or tree deeper than %d: the call already crossed %d global routers", max, h)
	}
	st := s.r.acquire()
	if st == nil {
		return ctx, nil, treeErr(codes.Unavailable, localrouterv1.ReasonClosed, routing.ErrClosed, "the global router is closed")
	}
	return pool.WithHops(ctx, h+1), st, nil
}

// eligible are the pools that answer for p: of p's block size (any, for a
// prompt given as tokens), not prefill, serving the subtree's model.
func (s *Subtree) eligible(st *state, p pool.Prompt) ([]*poolEntry, error) {
	var out []*poolEntry
	var sizes []int
	model := s.r.opts.subtree.Model
	for _, pe := range st.pools {
		if pe.cfg.Role == policies.RolePrefill || (model != "" && !pe.cfg.Serves(model)) {
			continue
		}
		if !slices.Contains(sizes, pe.cfg.BlockSize) {
			sizes = append(sizes, pe.cfg.BlockSize)
		}
		if len(p.Hashes) > 0 && pe.cfg.BlockSize != p.BlockSize {
			continue
		}
		out = append(out, pe)
	}
	if len(out) == 0 {
		if len(sizes) == 0 {
			return nil, treeErr(codes.Unavailable, localrouterv1.ReasonNoWorkers, routing.ErrNoWorkers, "the subtree has no pool that can answer")
		}
		return nil, treeErr(codes.InvalidArgument, localrouterv1.ReasonBlockSizeMismatch, routing.ErrBlockSizeMismatch,
			"block size %d: no pool of the subtree has it (its pools have %v)", p.BlockSize, sizes)
	}
	return out, nil
}

// forPool is the prompt as pe's local router takes it.
func forPool(p pool.Prompt, pe *poolEntry) pool.Prompt {
	// A subtree reserves nothing below it: its probes are state-free.
	p.ReserveID, p.ReserveTTL = "", 0
	if len(p.Hashes) == 0 {
		p.BlockSize = pe.cfg.BlockSize
	}
	return p
}

// ranked probes the eligible pools and ranks them with the chain; results
// are every pool's probe.
func (s *Subtree) ranked(ctx context.Context, st *state, eligible []*poolEntry, p pool.Prompt, id string) ([]policies.Candidate, []probeResult, error) {
	results := make([]probeResult, len(eligible))
	var wg sync.WaitGroup
	for i, pe := range eligible {
		wg.Go(func() {
			t0 := s.r.opts.now()
			sel, err := pe.p.Probe(ctx, forPool(p, pe))
			if sel.BlockSize == 0 {
				sel.BlockSize = pe.cfg.BlockSize
			}
			sel.ISL = p.ISL
			results[i] = probeResult{pe: pe, sel: sel, err: err, dur: s.r.opts.now().Sub(t0)}
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, results, err
	}
	var cands []policies.Candidate
	for _, res := range results {
		if res.err == nil {
			cands = append(cands, candidate(res))
		}
	}
	if len(cands) == 0 {
		return nil, results, subtreeFailure(results)
	}
	view := policies.Request{ID: id, Model: subtreeModel(s.r.opts.subtree.Model, eligible), ISL: p.ISL, SessionKey: p.SessionKey}
	s.r.noteUnreadSession(st, p.SessionKey) // unreadhdr.go
	out, err := st.chain.Rank(&view, cands, nil)
	if err != nil {
		if errors.Is(err, policies.ErrSaturated) {
			return nil, results, treeErr(codes.ResourceExhausted, "", err, "subtree: shed for load: %v", err)
		}
		return nil, results, treeErr(codes.FailedPrecondition, "", err, "subtree: no pool accepts the request: %v", err)
	}
	return out, results, nil
}

// subtreeModel is the model the chain sees: the configured one, else the
// first model an eligible pool names ("*" when they serve any): the wire
// carries no model, so a subtree whose pools serve several is told which
// one it answers for (SubtreeOptions.Model, -subtree-model).
func subtreeModel(model string, eligible []*poolEntry) string {
	if model != "" {
		return model
	}
	for _, pe := range eligible {
		for _, m := range pe.cfg.Models {
			if m != "*" {
				return m
			}
		}
	}
	return "*"
}

// subtreeFailure is the error of a probe no pool answered: a routing loop
// below wins (it must reach the top as one); then a refusal every pool
// shares keeps its code (the request is at fault, not the subtree); else
// the subtree is unavailable.
func subtreeFailure(results []probeResult) error {
	all := errors.Join(errs(results)...)
	for _, res := range results {
		if IsRoutingLoop(res.err) {
			return res.err
		}
	}
	code := codes.Unknown
	for _, res := range results {
		c := status.Code(res.err)
		if outage(res.err) {
			c = codes.Unavailable
		}
		if code == codes.Unknown {
			code = c
		} else if code != c {
			code = codes.Unavailable
		}
	}
	if code == codes.Unknown || code == codes.OK {
		code = codes.Unavailable
	}
	if code != codes.Unavailable {
		if st, ok := status.FromError(results[0].err); ok {
			// Keep the first pool's reason (NO_ALLOWED_WORKER, ...).
			p := st.Proto()
			p.Message = "subtree: " + all.Error()
			return &treeError{st: status.FromProto(p), err: results[0].err}
		}
	}
	return treeErr(code, "", all, "subtree: no pool answered: %v", all)
}

// qualify names a selection of pool poolName from above: the pool-qualified
// worker id, no router address (the caller's client sets its own).
func qualify(poolName string, sel routing.Selection) routing.Selection {
	sel.WorkerID = poolName + "/" + sel.WorkerID
	sel.Router = ""
	return sel
}

// SplitWorker splits a subtree's qualified worker id into the pool that
// owns the worker and the worker's id in that pool.
func SplitWorker(id string) (poolName, worker string, ok bool) {
	poolName, worker, ok = strings.Cut(id, "/")
	return poolName, worker, ok && poolName != "" && worker != ""
}

// normalisedCost is the subtree's cost of candidate c: its local router's
// cost (milliseconds, one unit whatever the pool's worker chain) divided
// by the pool's scale in this router's cost policy (1 without one). A
// parent's `cost` policy divides by its own scale for the subtree: each
// pool's speed declared once, where it is configured.
func normalisedCost(st *state, c policies.Candidate) float64 {
	for _, pol := range st.chain.Policies() {
		if cp, ok := pol.(*policies.Cost); ok {
			return cp.Normalised(c)
		}
	}
	return c.Probe.Cost
}

// Probe implements pool.Client: the best worker below this router for p,
// without changing any state (see the comment at the top of the file).
func (s *Subtree) Probe(ctx context.Context, p pool.Prompt) (routing.Selection, error) {
	ctx, st, err := s.enter(ctx)
	if err != nil {
		return routing.Selection{}, err
	}
	defer st.release()
	eligible, err := s.eligible(st, p)
	if err != nil {
		return routing.Selection{}, err
	}
	ranked, results, err := s.ranked(ctx, st, eligible, p, "")
	if err != nil {
		return routing.Selection{}, err
	}
	return s.answer(st, ranked[0], results), nil
}

// answer is the candidate c as the subtree's answer.
func (s *Subtree) answer(st *state, c policies.Candidate, results []probeResult) routing.Selection {
	out := qualify(c.Pool, c.Probe)
	out.Cost = normalisedCost(st, c)
	n := 0
	for _, res := range results {
		if res.err == nil {
			n += max(res.sel.Candidates, 1)
		}
	}
	out.Candidates = n
	return out
}

// Loads implements pool.Client: every worker rank below this router, its
// id qualified, as each pool's local router reports it. A pool that does
// not answer is left out; none answering is the error.
func (s *Subtree) Loads(ctx context.Context, p pool.Prompt) ([]routing.Selection, error) {
	ctx, st, err := s.enter(ctx)
	if err != nil {
		return nil, err
	}
	defer st.release()
	eligible, err := s.eligible(st, p)
	if err != nil {
		return nil, err
	}
	per := make([][]routing.Selection, len(eligible))
	results := make([]probeResult, len(eligible))
	var wg sync.WaitGroup
	for i, pe := range eligible {
		wg.Go(func() {
			ls, err := pe.p.Loads(ctx, forPool(p, pe))
			results[i] = probeResult{pe: pe, err: err}
			for _, l := range ls {
				if l.BlockSize == 0 {
					l.BlockSize = pe.cfg.BlockSize
				}
				per[i] = append(per[i], qualify(pe.cfg.Name, l))
			}
		})
	}
	wg.Wait()
	var out []routing.Selection
	answered := false
	for i := range per {
		if results[i].err == nil {
			answered = true
		} else {
			s.r.log.Warn("subtree loads: a pool did not answer", "pool", eligible[i].cfg.Name, "err", results[i].err)
		}
		out = append(out, per[i]...)
	}
	if !answered {
		return nil, subtreeFailure(results)
	}
	return out, nil
}

// Close implements pool.Client. It does not close the Router.
func (s *Subtree) Close() error { return nil }
