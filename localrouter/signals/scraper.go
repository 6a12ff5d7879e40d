package signals

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Target is one worker's metrics endpoint.
type Target struct {
	// ID is the worker id the samples are reported under.
	ID string
	// URL is the full metrics URL (http://host:port/metrics).
	URL string
}

// Sink receives a worker's samples after each scrape: the samples of the
// ranks its engine reported, or nil when the scrape failed or the worker
// is no longer a target (its old samples must be dropped). Calls come from
// the scraper's goroutines, at most one at a time per worker id; they must
// not block and must not retain ranks past the call unless they own it
// (Scraper never reuses it).
type Sink interface {
	SetEngineSignals(id string, ranks map[uint32]Sample)
}

// ScraperOptions configure a Scraper; only Targets and Sink are required.
type ScraperOptions struct {
	// Period between the starts of two scrapes of every target (> 0).
	Period time.Duration
	// Targets lists the current targets; called once per period, from the
	// scraper's goroutine. It must not block.
	Targets func() []Target
	Sink    Sink
	// Client does the requests (default: an http.Client with Timeout).
	Client *http.Client
	// Timeout bounds one scrape (default: the period, at most 5 s).
	Timeout time.Duration
	// MaxBytes bounds one metrics body (DefaultMaxBytes).
	MaxBytes int64
	// Concurrency bounds the scrapes in flight (8).
	Concurrency int
	// Registerer receives kvgate_localrouter_engine_scrapes_total{result}
	// (nil: not registered).
	Registerer prometheus.Registerer
	Logger     *slog.Logger
	// Clock stamps the samples (time.Now).
	Clock func() time.Time
}

// Stats are a Scraper's counters.
type Stats struct {
	Scrapes, Failures uint64
}

// Scraper scrapes every target once per period until its Run's context
// ends. Safe for concurrent use.
type Scraper struct {
	opts    ScraperOptions
	log     *slog.Logger
	scrapes atomic.Uint64
	fails   atomic.Uint64
	results *prometheus.CounterVec

	mu    sync.Mutex
	known map[string]bool // targets of the last round, to clear those gone
}

// ErrInvalidOptions is returned by NewScraper for missing or out-of-range
// options.
var ErrInvalidOptions = errors.New("invalid scraper options")

// NewScraper returns a Scraper; Run starts it.
func NewScraper(opts ScraperOptions) (*Scraper, error) {
	switch {
	case opts.Period <= 0:
		return nil, fmt.Errorf("%w: period %v must be positive", ErrInvalidOptions, opts.Period)
	case opts.Targets == nil || opts.Sink == nil:
		return nil, fmt.Errorf("%w: targets and sink are required", ErrInvalidOptions)
	}
	if opts.Timeout <= 0 {
		opts.Timeout = min(opts.Period, 5*time.Second)
	}
	if opts.Client == nil {
		opts.Client = &http.Client{Timeout: opts.Timeout}
	}
	if opts.Concurrency <= 0 {
		opts.Concurrency = 8
	}
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	s := &Scraper{opts: opts, log: log.With("component", "localrouter.signals"), known: map[string]bool{}}
	s.results = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvgate_localrouter_engine_scrapes_total",
		Help: "Scrapes of workers' engine metrics endpoints, by result (ok, error).",
	}, []string{"result"})
	if opts.Registerer != nil {
		if err := opts.Registerer.Register(s.results); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Stats returns the counters.
func (s *Scraper) Stats() Stats { return Stats{Scrapes: s.scrapes.Load(), Failures: s.fails.Load()} }

// Run scrapes every period until ctx ends, then returns ctx's error. The
// first round starts at once.
func (s *Scraper) Run(ctx context.Context) error {
	t := time.NewTicker(s.opts.Period)
	defer t.Stop()
	for {
		s.Round(ctx)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// Round scrapes every current target once and waits for the scrapes;
// targets that left since the last round get a nil Sink call.
func (s *Scraper) Round(ctx context.Context) {
	targets := s.opts.Targets()
	now := map[string]bool{}
	for _, t := range targets {
		now[t.ID] = true
	}
	s.mu.Lock()
	for id := range s.known {
		if !now[id] {
			s.opts.Sink.SetEngineSignals(id, nil)
		}
	}
	s.known = now
	s.mu.Unlock()

	sem := make(chan struct{}, s.opts.Concurrency)
	var wg sync.WaitGroup
	for _, t := range targets {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return
		}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			s.scrapeOne(ctx, t)
		}()
	}
	wg.Wait()
}

func (s *Scraper) scrapeOne(ctx context.Context, t Target) {
	ranks, err := s.Scrape(ctx, t.URL)
	s.scrapes.Add(1)
	if err != nil {
		if ctx.Err() != nil {
			return // stopping: not the worker's fault
		}
		s.fails.Add(1)
		s.results.WithLabelValues("error").Inc()
		s.log.Debug("engine metrics scrape failed", "worker", t.ID, "url", t.URL, "err", err)
		s.opts.Sink.SetEngineSignals(t.ID, nil)
		return
	}
	s.results.WithLabelValues("ok").Inc()
	s.opts.Sink.SetEngineSignals(t.ID, ranks)
}

// Scrape fetches and parses one metrics URL.
func (s *Scraper) Scrape(ctx context.Context, url string) (map[uint32]Sample, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	// The plain text format: the parser reads no protobuf or OpenMetrics.
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := s.opts.Client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: status %d", url, resp.StatusCode)
	}
	return Parse(resp.Body, s.opts.MaxBytes, s.opts.Clock())
}
