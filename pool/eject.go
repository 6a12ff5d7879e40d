package pool

import (
	"cmp"
	"slices"
	"sync"
	"time"
)

// Passive health: a worker whose connections fail is ejected from the
// candidates for a bounded time, long before its lease in etcd expires,
// then re-admitted. The signal comes from the response path (the ext_proc
// server sees Envoy's local reply "upstream connect error" and the
// endpoint that actually served, which differs from the primary after a
// connection failure); the pool acts on it in Probe.

// Ejection defaults.
const (
	DefaultEjectBase = time.Second
	DefaultEjectMax  = 30 * time.Second
	// maxEjections bounds the ejection table (addresses come from the
	// router's own decisions, but a table must still not grow without end).
	maxEjections = 4096
)

// Ejector holds the workers ejected by passive health, by address
// (host:port). Each report ejects the worker for a duration that starts at
// Base and doubles with each report that comes while the worker is
// ejected or within Max of its last ejection ending, up to Max; a worker
// left alone for Max starts again from Base. Safe for concurrent use.
type Ejector struct {
	base, max time.Duration
	now       func() time.Time

	mu sync.RWMutex
	m  map[string]*ejection
}

type ejection struct {
	until time.Time
	last  time.Duration
}

// NewEjector returns an Ejector ejecting for base doubling up to max
// (zero: the defaults, 1 s and 30 s); now (nil: time.Now) is its clock.
func NewEjector(base, max time.Duration, now func() time.Time) *Ejector {
	if base <= 0 {
		base = DefaultEjectBase
	}
	if max < base {
		max = maxDur(DefaultEjectMax, base)
	}
	if now == nil {
		now = time.Now
	}
	return &Ejector{base: base, max: max, now: now, m: map[string]*ejection{}}
}

func maxDur(a, b time.Duration) time.Duration {
	if a > b {
		return a
	}
	return b
}

// Report records a connection failure to the worker at addr and returns
// how long it is ejected for, and whether this report ejected it (false:
// it already was). A report that comes while addr is ejected changes
// nothing: the reports of the many requests that saw one failure eject
// once.
func (e *Ejector) Report(addr string) (time.Duration, bool) {
	if e == nil || addr == "" {
		return 0, false
	}
	now := e.now()
	e.mu.Lock()
	defer e.mu.Unlock()
	j, ok := e.m[addr]
	switch {
	case !ok:
		if len(e.m) >= maxEjections {
			e.prune(now)
		}
		if len(e.m) >= maxEjections {
			return 0, false // full of live ejections: nothing more is learnt
		}
		j = &ejection{last: e.base}
		e.m[addr] = j
	case now.Before(j.until):
		return j.until.Sub(now), false // one failure, many reporters
	case now.Sub(j.until) < e.max:
		j.last = min(2*j.last, e.max)
	default:
		j.last = e.base
	}
	j.until = now.Add(j.last)
	return j.last, true
}

// Readmit ends addr's ejection (a request it served succeeded).
func (e *Ejector) Readmit(addr string) {
	if e == nil {
		return
	}
	e.mu.RLock()
	j, ok := e.m[addr]
	ejected := ok && e.now().Before(j.until)
	e.mu.RUnlock()
	if !ejected {
		return
	}
	e.mu.Lock()
	if j, ok := e.m[addr]; ok {
		j.until = e.now()
	}
	e.mu.Unlock()
}

// Ejected reports whether addr is ejected now.
func (e *Ejector) Ejected(addr string) bool {
	if e == nil || addr == "" {
		return false
	}
	e.mu.RLock()
	defer e.mu.RUnlock()
	j, ok := e.m[addr]
	return ok && e.now().Before(j.until)
}

// prune drops the entries whose history no longer matters; e.mu is held.
func (e *Ejector) prune(now time.Time) {
	for a, j := range e.m {
		if now.Sub(j.until) >= e.max {
			delete(e.m, a)
		}
	}
}

// known keeps the workers a pool's probes recently named, with their
// addresses: the last known state that best-effort routing falls back on
// when every local router of the pool is unreachable, and the pool's
// other workers that become fallbacks. Safe for concurrent use.
type known struct {
	mu   sync.Mutex
	m    map[knownKey]knownWorker // last seen
	next int
}

type knownKey struct {
	id   string
	rank uint32
}

type knownWorker struct {
	id   string
	rank uint32
	addr string
	seen time.Time
}

// knownTTL: a worker not named by a probe for this long is forgotten.
const knownTTL = 2 * time.Minute

// maxKnown bounds the table (a pool's workers).
const maxKnown = 1024

func (k *known) add(id string, rank uint32, addr string, now time.Time) {
	if addr == "" {
		return
	}
	key := knownKey{id, rank}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.m == nil {
		k.m = map[knownKey]knownWorker{}
	}
	if _, ok := k.m[key]; !ok && len(k.m) >= maxKnown {
		for kk, w := range k.m {
			if now.Sub(w.seen) > knownTTL {
				delete(k.m, kk)
			}
		}
		if len(k.m) >= maxKnown {
			return
		}
	}
	k.m[key] = knownWorker{id: id, rank: rank, addr: addr, seen: now}
}

// list returns the workers seen within knownTTL whose address keep
// accepts, ordered by id then rank, starting at a rotating offset when
// rotate is set (round robin).
func (k *known) list(now time.Time, rotate bool, keep func(addr string) bool) []knownWorker {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make([]knownWorker, 0, len(k.m))
	for _, w := range k.m {
		if now.Sub(w.seen) <= knownTTL && keep(w.addr) {
			out = append(out, w)
		}
	}
	slices.SortFunc(out, func(a, b knownWorker) int {
		return cmp.Or(cmp.Compare(a.id, b.id), cmp.Compare(a.rank, b.rank))
	})
	if rotate && len(out) > 1 {
		k.next++
		i := k.next % len(out)
		out = slices.Concat(out[i:], out[:i])
	}
	return out
}
