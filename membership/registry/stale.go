package registry

import (
	"context"
	"log/slog"
	"sync"
)

// StaleMarker carries a worker's staleness (it cannot publish its KV
// events: kvevents.PublisherConfig.OnStale) to its registration, which may
// be made after the publisher starts. The zero value is ready; safe for
// concurrent use.
type StaleMarker struct {
	// Logger (default slog.Default()) hears writes that failed (they are
	// retried when the registration's keep-alive is re-armed).
	Logger *slog.Logger

	mu    sync.Mutex
	reg   *Registration
	stale bool
}

// OnStale records stale and writes it to the attached registration, if
// any; it is a kvevents.PublisherConfig.OnStale.
func (m *StaleMarker) OnStale(stale bool) {
	m.mu.Lock()
	m.stale = stale
	reg := m.reg
	m.mu.Unlock()
	if reg != nil {
		m.write(reg, stale)
	}
}

// Attach makes reg (a worker registration) follow the staleness, writing
// it at once when the worker is already stale.
func (m *StaleMarker) Attach(reg *Registration) {
	m.mu.Lock()
	m.reg = reg
	stale := m.stale
	m.mu.Unlock()
	if stale {
		m.write(reg, true)
	}
}

func (m *StaleMarker) write(reg *Registration, stale bool) {
	if err := reg.SetStale(context.Background(), stale); err != nil {
		log := m.Logger
		if log == nil {
			log = slog.Default()
		}
		log.Warn("mark the worker's registration", "stale", stale, "err", err)
	}
}
