package loadbench

import (
	"bytes"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/kvgate/kvgate/internal/up"
)

// routerFrames mark a goroutine, or an allocation, of kvgate's router
// code; serverFrames the gRPC servers' (the ext_proc server and the local
// routers are this process's gRPC servers besides embedded etcd).
var (
	routerFrames = []string{
		"github.com/kvgate/kvgate/extproc.",
		"github.com/kvgate/kvgate/globalrouter.",
		"github.com/kvgate/kvgate/pool.",
		"github.com/kvgate/kvgate/localrouter",
	}
	serverFrames = []string{
		"google.golang.org/grpc/internal/transport.(*http2Server)",
		"google.golang.org/grpc/internal/transport.NewServerTransport",
		"google.golang.org/grpc.(*Server)",
	}
)

func hasFrame(s string, frames []string) bool {
	for _, f := range frames {
		if strings.HasPrefix(s, f) {
			return true
		}
	}
	return false
}

// measure returns the live heap after a GC, the part of it the router
// code allocated (heap profile, scaled as pprof scales it), the
// goroutines, and those running router code.
func measure() (heap uint64, routerHeap int64, goroutines, router int) {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	buf := make([]byte, 64<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		goroutines++
		for _, f := range routerFrames {
			if bytes.Contains(g, []byte(f)) {
				router++
				break
			}
		}
	}
	n, _ := runtime.MemProfile(nil, false)
	recs := make([]runtime.MemProfileRecord, n+256)
	n, _ = runtime.MemProfile(recs, false)
	isRouter := map[uintptr]bool{}
	rate := float64(runtime.MemProfileRate)
	for _, r := range recs[:n] {
		inuse := r.InUseBytes()
		if inuse <= 0 || r.AllocObjects == 0 {
			continue
		}
		ours := false
		for _, pc := range r.Stack() {
			v, ok := isRouter[pc]
			if !ok {
				fn := runtime.FuncForPC(pc)
				v = fn != nil && (hasFrame(fn.Name(), routerFrames) || hasFrame(fn.Name(), serverFrames))
				isRouter[pc] = v
			}
			if v {
				ours = true
				break
			}
		}
		if !ours {
			continue
		}
		// pprof's scaling of a sampled record.
		avg := float64(r.AllocBytes) / float64(r.AllocObjects)
		scale := 1 / (1 - math.Exp(-avg/rate))
		routerHeap += int64(float64(inuse) * scale)
	}
	return m.HeapAlloc, routerHeap, goroutines, router
}

// hist is the global router's decision histogram, every outcome merged:
// cumulative counts per upper bound.
type hist struct {
	bounds []float64
	counts []uint64
	total  uint64
}

func decisionHist(sys *up.System) hist {
	var h hist
	mfs, err := sys.Registry.Gather()
	if err != nil {
		return h
	}
	for _, mf := range mfs {
		if mf.GetName() != "kvgate_globalrouter_decision_duration_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			ph := m.GetHistogram()
			h.total += ph.GetSampleCount()
			h.add(ph)
		}
	}
	return h
}

func (h *hist) add(ph *dto.Histogram) {
	for i, b := range ph.GetBucket() {
		if i >= len(h.bounds) {
			h.bounds = append(h.bounds, b.GetUpperBound())
			h.counts = append(h.counts, 0)
		}
		h.counts[i] += b.GetCumulativeCount()
	}
}

// minus is the observations of h not in an earlier snapshot of it.
func (h hist) minus(earlier hist) hist {
	out := hist{bounds: h.bounds, counts: make([]uint64, len(h.counts)), total: h.total - earlier.total}
	for i := range h.counts {
		out.counts[i] = h.counts[i]
		if i < len(earlier.counts) {
			out.counts[i] -= earlier.counts[i]
		}
	}
	return out
}

// quantile interpolates linearly within the bucket holding quantile q (0
// without observations; past the last bucket, its bound).
func (h hist) quantile(q float64) float64 {
	if h.total == 0 {
		return 0
	}
	want := q * float64(h.total)
	lo, prev := 0.0, uint64(0)
	for i, b := range h.bounds {
		if float64(h.counts[i]) >= want && h.counts[i] > prev {
			frac := (want - float64(prev)) / float64(h.counts[i]-prev)
			return lo + frac*(b-lo)
		}
		lo, prev = b, h.counts[i]
	}
	return lo
}

// startProfiles starts a CPU profile into dir (none when dir is empty) and
// returns its stop.
func startProfiles(dir string, log *slog.Logger) (stop func()) {
	if dir == "" {
		return func() {}
	}
	f, err := os.Create(filepath.Join(dir, "ramp.cpu.prof"))
	if err != nil {
		log.Warn("soak: cpu profile", "err", err)
		return func() {}
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		log.Warn("soak: cpu profile", "err", err)
		f.Close()
		return func() {}
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			pprof.StopCPUProfile()
			f.Close()
		})
	}
}

// dumpGoroutines writes the goroutine profile (stacks counted) into dir.
func dumpGoroutines(dir string, at time.Duration, log *slog.Logger) {
	if dir == "" {
		return
	}
	f, err := os.Create(filepath.Join(dir, fmt.Sprintf("goroutines-%03.0fs.txt", at.Seconds())))
	if err != nil {
		log.Warn("soak: goroutine dump", "err", err)
		return
	}
	defer f.Close()
	if err := pprof.Lookup("goroutine").WriteTo(f, 1); err != nil {
		log.Warn("soak: goroutine dump", "err", err)
	}
}
