package chaos

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/up"
	"github.com/kvgate/kvgate/localrouter"
	"github.com/kvgate/kvgate/mocker"
)

// The per-request half of -accounting: every request's moments as each
// part saw them, joined by id. The local routers see the ext_proc
// server's request id (a fallback that served it adds a suffix after
// "~"), the engines the client's x-request-id, and the global router's
// decisions carry both.

// reqRecord is one request as the parts saw it.
type reqRecord struct {
	clientID string
	// decideStart and decided bracket the global router's Decide (zero:
	// no decision observed); bestEffort: it went best effort.
	decideStart, decided time.Time
	bestEffort           bool
	// routers is how many router entries the request has now (more than
	// one: counted twice); commit and free the first entry's add and the
	// last entry's removal; double the time it was counted twice.
	routers      int
	commit, free time.Time
	// leaseFree is when the global router's lease was freed (the ext_proc
	// server saw the response's end, or the stream's).
	leaseFree   time.Time
	maxRouters  int
	double      time.Duration
	doubleSince time.Time
	// admit and left are the engine's (zero: never admitted / not left).
	admit, left time.Time
	worker      string // the engine's, pool/worker/rank
	engineKey   string // its key in recorder.byEngine
	// clientEnd is when the client read the response's end (zero: not a
	// client of the run's traffic).
	clientEnd time.Time
}

// recorder joins the parts' observations. Safe for concurrent use.
type recorder struct {
	mu       sync.Mutex
	byRouter map[string]*reqRecord // the ext_proc server's request id
	byClient map[string]*reqRecord // x-request-id
	byEngine map[string]*reqRecord // pool/worker/rank/mocker id
}

func newRecorder() *recorder {
	return &recorder{byRouter: map[string]*reqRecord{}, byClient: map[string]*reqRecord{}, byEngine: map[string]*reqRecord{}}
}

// observers are the up.Observers that feed rec.
func (rec *recorder) observers() up.Observers {
	return up.Observers{
		Decisions: rec.decision,
		Freed:     rec.leaseFreed,
		Router:    func(string) localrouter.ActiveObserver { return routerObs{rec} },
		Engine: func(pool, worker string) mocker.RequestObserver {
			return engineObs{rec: rec, prefix: pool + "/" + worker + "/"}
		},
	}
}

// routerKey is a router entry's request: a request moved to the fallback
// that served it has the id of the decision with a suffix.
func routerKey(id string) string {
	if i := strings.IndexByte(id, '~'); i >= 0 {
		return id[:i]
	}
	return id
}

func (rec *recorder) router(id string) *reqRecord {
	r := rec.byRouter[id]
	if r == nil {
		r = &reqRecord{}
		rec.byRouter[id] = r
	}
	return r
}

func (rec *recorder) client(id string) *reqRecord {
	r := rec.byClient[id]
	if r == nil {
		r = &reqRecord{clientID: id}
		rec.byClient[id] = r
	}
	return r
}

func (rec *recorder) decision(o globalrouter.Observation) {
	if o.RequestID == "" || o.Decision == nil {
		return
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	r := rec.router(o.RequestID)
	if o.ClientID != "" {
		if c := rec.byClient[o.ClientID]; c != nil && c != r {
			// The engine admitted it before the decision was observed
			// (or the router record came first): merge into r.
			r.admit, r.left, r.worker, r.engineKey = c.admit, c.left, c.worker, c.engineKey
			r.clientEnd = c.clientEnd
			if c.engineKey != "" {
				rec.byEngine[c.engineKey] = r
			}
		}
		r.clientID = o.ClientID
		rec.byClient[o.ClientID] = r
	}
	r.decideStart, r.decided, r.bestEffort = o.Time, o.Time.Add(o.Duration), o.Decision.BestEffort
}

func (rec *recorder) leaseFreed(id string, at time.Time) {
	rec.mu.Lock()
	rec.router(id).leaseFree = at
	rec.mu.Unlock()
}

// clientDone notes when the client read request id's end (nil recorder:
// nothing).
func (rec *recorder) clientDone(id string, at time.Time) {
	if rec == nil {
		return
	}
	rec.mu.Lock()
	rec.client(id).clientEnd = at
	rec.mu.Unlock()
}

type routerObs struct{ rec *recorder }

func (o routerObs) Added(id string, _ localrouter.WorkerKey, at time.Time) {
	o.rec.mu.Lock()
	defer o.rec.mu.Unlock()
	r := o.rec.router(routerKey(id))
	if r.routers == 0 && r.commit.IsZero() {
		r.commit = at
	}
	r.routers++
	if r.routers == 2 {
		r.doubleSince = at
	}
	r.maxRouters = max(r.maxRouters, r.routers)
}

func (o routerObs) Removed(id string, _ localrouter.WorkerKey, at time.Time) {
	o.rec.mu.Lock()
	defer o.rec.mu.Unlock()
	r := o.rec.router(routerKey(id))
	if r.routers == 2 {
		r.double += at.Sub(r.doubleSince)
	}
	r.routers--
	if r.routers == 0 {
		r.free = at
	}
}

type engineObs struct {
	rec    *recorder
	prefix string
}

func (o engineObs) Admitted(rank int, id, clientID string, at time.Time) {
	key := fmt.Sprintf("%s%d/%s", o.prefix, rank, id)
	if clientID == "" {
		clientID = key
	}
	o.rec.mu.Lock()
	defer o.rec.mu.Unlock()
	r := o.rec.client(clientID)
	r.admit, r.worker, r.engineKey = at, fmt.Sprintf("%s%d", o.prefix, rank), key
	o.rec.byEngine[key] = r
}

func (o engineObs) Left(rank int, id string, at time.Time, _ string) {
	o.rec.mu.Lock()
	defer o.rec.mu.Unlock()
	if r := o.rec.byEngine[fmt.Sprintf("%s%d/%s", o.prefix, rank, id)]; r != nil {
		r.left = at
	}
}

// PerRequest is the per-request comparison: for each request both a
// router and an engine counted, how long the router counted it before the
// engine took it (commit → admit) and after the engine let it go (finish
// → free); the requests only one side counted; the requests a router
// counted twice at once; and, to diagnose the routers' count against the
// global router's decisions, how long a router counted a request before
// its Decide returned (commit → decided).
type PerRequest struct {
	// Requests is the number of requests seen by any part; Both the
	// number a router and an engine counted, both from start to end.
	Requests int `json:"requests"`
	Both     int `json:"both"`
	// CommitToAdmit and FinishToFree are the lags in seconds (negative:
	// the engine counted first, or longer).
	CommitToAdmit Lags `json:"commit_to_admit"`
	FinishToFree  Lags `json:"finish_to_free"`
	// OverWindow is the number of requests with either lag above the
	// accounting window, in absolute value; Worst describes the worst.
	OverWindow int    `json:"over_window"`
	Worst      string `json:"worst,omitempty"`
	// RouterOnly: counted by a router, never admitted by an engine (a
	// request that ended before the worker took it, or whose worker was
	// killed first); EngineOnly: admitted by an engine, never counted by
	// a router (unaccounted). Open: still counted by either at the end.
	RouterOnly int `json:"router_only"`
	EngineOnly int `json:"engine_only"`
	Open       int `json:"open"`
	// RouterOnlyCutOff of RouterOnly were freed after the traffic's end:
	// requests the end of the run cut off before their worker took them.
	RouterOnlyCutOff int `json:"router_only_cut_off"`
	// The window check request by request: at each sample time t, the
	// requests a router counted at t that no engine held at any time
	// within t ± the window (RoutersUnmatched, summed over the samples),
	// and the requests an engine held at t that no router counted within
	// it (EnginesUnmatched); SamplesUnmatched is the number of samples
	// with either.
	RoutersUnmatched int `json:"routers_unmatched"`
	EnginesUnmatched int `json:"engines_unmatched"`
	SamplesUnmatched int `json:"samples_unmatched"`
	// Doubled requests had two router entries at once (a contended commit
	// placed again, a move to the fallback that served it), for
	// DoubledSeconds in all and at most MaxRouters entries.
	Doubled        int     `json:"doubled"`
	DoubledSeconds float64 `json:"doubled_seconds"`
	MaxRouters     int     `json:"max_routers"`
	// CommitToDecided is how long a router counted a request before the
	// global router's Decide returned it (decide-and-commit's answer
	// travelling back, a contended decision's recheck).
	CommitToDecided Lags `json:"commit_to_decided"`
	// FinishToClient is from the engine's finish to the client's reading
	// of the response's end (the response's way through the gateway and
	// the ext_proc server), FreeToClient from the router's free to it
	// (the ext_proc server frees before it passes the last chunk on).
	FinishToClient Lags `json:"finish_to_client"`
	FreeToClient   Lags `json:"free_to_client"`
	// FinishToLeaseFree is from the engine's finish to the global router's
	// lease freed (the response's way to the ext_proc server's free), and
	// LeaseFreeToFree from there to the router's free (the free's way).
	FinishToLeaseFree Lags `json:"finish_to_lease_free"`
	LeaseFreeToFree   Lags `json:"lease_free_to_free"`
	// BestEffort counts the best-effort decisions, and BestEffortLate those
	// whose commit reached a router after the engine had admitted them.
	BestEffort     int `json:"best_effort"`
	BestEffortLate int `json:"best_effort_late"`
	// The routers' count against the global router's decisions in flight
	// (the samples' Routers − Decided), and how much of it the requests
	// committed on a router whose Decide had not returned explain
	// (InDecide, at the same sample): RoutersOverDecided is the largest
	// difference, InDecideThen the requests in Decide at that sample, and
	// Residual the largest difference less those in Decide (a double
	// count, or a free sent and not yet applied).
	RoutersOverDecided int `json:"routers_over_decided"`
	InDecideThen       int `json:"in_decide_then"`
	Residual           int `json:"residual"`
	// SampleSkew is the largest difference between a sample's Routers and
	// the routers' count the records give at the sample's time: how far
	// the sampler's reads, one after the other on a starved process, are
	// from one instant (the residual's part that is not the system's).
	SampleSkew int `json:"sample_skew"`
	// DecidedSkew is the same for the samples' Decided against the
	// decisions returned and not freed the records give.
	DecidedSkew int `json:"decided_skew"`
}

// Lags is a distribution of lags, in seconds.
type Lags struct {
	N   int     `json:"n"`
	Min float64 `json:"min"`
	P50 float64 `json:"p50"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

func lagsOf(d []time.Duration) Lags {
	if len(d) == 0 {
		return Lags{}
	}
	slices.Sort(d)
	return Lags{N: len(d), Min: d[0].Seconds(), P50: d[len(d)*50/100].Seconds(), P99: d[min(len(d)-1, len(d)*99/100)].Seconds(), Max: d[len(d)-1].Seconds()}
}

func (l Lags) String() string {
	return fmt.Sprintf("min %.3f s, p50 %.3f s, p99 %.3f s, max %.3f s (n %d)", l.Min, l.P50, l.P99, l.Max, l.N)
}

// report analyses the records against window, with the samples and the
// traffic's end.
func (rec *recorder) report(window time.Duration, samples []up.AccountingSample, end time.Time) *PerRequest {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	seen := map[*reqRecord]bool{}
	var all []*reqRecord
	for _, m := range []map[string]*reqRecord{rec.byRouter, rec.byClient} {
		for _, r := range m {
			if !seen[r] {
				seen[r] = true
				all = append(all, r)
			}
		}
	}
	out := &PerRequest{Requests: len(all)}
	var in, fr, dec, fc, frc, fl, lf []time.Duration
	var worst time.Duration
	for _, r := range all {
		counted, admitted := !r.commit.IsZero(), !r.admit.IsZero()
		if r.routers > 0 || (admitted && r.left.IsZero()) {
			out.Open++
		}
		if r.maxRouters > 1 {
			out.Doubled++
			out.DoubledSeconds += r.double.Seconds()
		}
		out.MaxRouters = max(out.MaxRouters, r.maxRouters)
		if r.bestEffort {
			out.BestEffort++
			if counted && admitted && r.commit.After(r.admit) {
				out.BestEffortLate++
			}
		}
		if counted && !r.decided.IsZero() {
			dec = append(dec, r.decided.Sub(r.commit))
		}
		switch {
		case counted && !admitted:
			out.RouterOnly++
			if !r.free.Before(end) {
				out.RouterOnlyCutOff++
			}
		case admitted && !counted:
			out.EngineOnly++
		}
		if !counted || !admitted || r.free.IsZero() || r.left.IsZero() || r.routers > 0 {
			continue
		}
		out.Both++
		if !r.clientEnd.IsZero() {
			fc, frc = append(fc, r.clientEnd.Sub(r.left)), append(frc, r.clientEnd.Sub(r.free))
		}
		if !r.leaseFree.IsZero() {
			fl, lf = append(fl, r.leaseFree.Sub(r.left)), append(lf, r.free.Sub(r.leaseFree))
		}
		a, f := r.admit.Sub(r.commit), r.free.Sub(r.left)
		in, fr = append(in, a), append(fr, f)
		for _, d := range []time.Duration{a, f} {
			if d < 0 {
				d = -d
			}
			if d > worst {
				worst = d
				out.Worst = fmt.Sprintf("request %s on %s: commit→admit %.3f s, finish→free %.3f s (decided %.3f s after its commit; best effort %v)",
					r.clientID, r.worker, a.Seconds(), f.Seconds(), r.decided.Sub(r.commit).Seconds(), r.bestEffort)
			}
		}
		if abs(a) > window || abs(f) > window {
			out.OverWindow++
		}
	}
	out.CommitToAdmit, out.FinishToFree, out.CommitToDecided = lagsOf(in), lagsOf(fr), lagsOf(dec)
	out.FinishToClient, out.FreeToClient = lagsOf(fc), lagsOf(frc)
	out.FinishToLeaseFree, out.LeaseFreeToFree = lagsOf(fl), lagsOf(lf)
	for _, sm := range samples {
		t := sm.At
		lo, hi := t.Add(-window), t.Add(window)
		bad := false
		inDecide, explained, routers, decided := 0, 0, 0, 0
		for _, r := range all {
			if !r.decided.IsZero() && within(r.decided, r.leaseFree, t, t) {
				decided++
			}
			if within(r.commit, r.free, t, t) {
				routers++
			}
			if !r.decided.IsZero() && within(r.commit, r.decided, t, t) {
				inDecide++
			}
			// What else routers − decided holds: frees sent and not yet
			// applied (+), best-effort decisions not yet committed (−).
			if !r.leaseFree.IsZero() && within(r.leaseFree, r.free, t, t) {
				explained++
			}
			if !r.decided.IsZero() && !r.decided.After(t) && (r.commit.IsZero() || r.commit.After(t)) && (r.leaseFree.IsZero() || r.leaseFree.After(t)) {
				explained--
			}
			// A zero end is open: counted still.
			if within(r.commit, r.free, t, t) && !within(r.admit, r.left, lo, hi) {
				out.RoutersUnmatched++
				bad = true
			}
			if within(r.admit, r.left, t, t) && !within(r.commit, r.free, lo, hi) {
				out.EnginesUnmatched++
				bad = true
			}
		}
		if bad {
			out.SamplesUnmatched++
		}
		if d := sm.Routers - sm.Decided; d > out.RoutersOverDecided {
			out.RoutersOverDecided, out.InDecideThen = d, inDecide
		}
		out.Residual = max(out.Residual, abs(sm.Routers-sm.Decided-inDecide-explained))
		out.SampleSkew = max(out.SampleSkew, abs(sm.Routers-routers))
		out.DecidedSkew = max(out.DecidedSkew, abs(sm.Decided-decided))
	}
	return out
}

// within reports whether the interval [from, to) (to zero: not ended)
// meets [lo, hi]; a zero from never does.
func within(from, to, lo, hi time.Time) bool {
	if from.IsZero() || from.After(hi) {
		return false
	}
	return to.IsZero() || to.After(lo)
}

func abs[T int | time.Duration](d T) T {
	if d < 0 {
		return -d
	}
	return d
}

func (p *PerRequest) print(w io.Writer, window float64) {
	fmt.Fprintf(w, "  per request: %d requests, %d counted by a router and an engine from start to end; router only %d, engine only (unaccounted) %d, still open %d\n",
		p.Requests, p.Both, p.RouterOnly, p.EngineOnly, p.Open)
	fmt.Fprintf(w, "    router commit → engine admit: %v\n", p.CommitToAdmit)
	fmt.Fprintf(w, "    engine finish → router free:  %v\n", p.FinishToFree)
	fmt.Fprintf(w, "    engine finish → lease freed: %v; lease freed → router free: %v\n", p.FinishToLeaseFree, p.LeaseFreeToFree)
	fmt.Fprintf(w, "    engine finish → client read the end: %v; router free → client read the end: %v\n", p.FinishToClient, p.FreeToClient)
	fmt.Fprintf(w, "    either lag beyond ±%.0f s: %d requests; worst: %s\n", window, p.OverWindow, p.Worst)
	fmt.Fprintf(w, "    router only and freed after the traffic's end (cut off): %d; at the samples, requests a router counted that no engine held within ±%.0f s: %d, the reverse: %d (%d samples)\n",
		p.RouterOnlyCutOff, window, p.RoutersUnmatched, p.EnginesUnmatched, p.SamplesUnmatched)
	fmt.Fprintf(w, "    router commit → Decide returned: %v\n", p.CommitToDecided)
	fmt.Fprintf(w, "    routers − decisions in flight, max %d, of which committed and Decide not returned %d; residual once those, the frees in transit and the late commits are taken out, max %d (the samples' own skew: routers up to %d, decided up to %d)\n",
		p.RoutersOverDecided, p.InDecideThen, p.Residual, p.SampleSkew, p.DecidedSkew)
	fmt.Fprintf(w, "    counted twice at once: %d requests, %.3f s in all, at most %d entries; best effort %d, committed after the engine admitted %d\n",
		p.Doubled, p.DoubledSeconds, p.MaxRouters, p.BestEffort, p.BestEffortLate)
}
