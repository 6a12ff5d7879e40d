package globalrouter

import (
	"context"
	"errors"
	"time"

	"github.com/kvgate/kvgate/policies"
)

// Reload replaces the configuration with cfg. A configuration that does not
// validate or build (bad policy arguments, a tokenizer that does not load)
// is refused and the current one stays.
func (r *Router) Reload(cfg Config) error {
	r.reloadMu.Lock()
	defer r.reloadMu.Unlock()
	old := r.st.Load()
	if old == nil {
		return errors.New("globalrouter: closed")
	}
	cfg.Defaults()
	err := applyShadowFile(&cfg, r.opts.shadowFile)
	var chain *policies.Chain
	if err == nil {
		chain, err = cfg.validate(r.opts.registry)
	}
	if err == nil {
		err = r.opts.subtree.checkLoops(&cfg)
	}
	var st *state
	if err == nil {
		st, err = r.build(&cfg, chain, old)
	}
	if err != nil {
		r.m.reloads.WithLabelValues("refused").Inc()
		r.noteReload(cfg.File, err)
		r.log.Error("configuration refused; keeping the current one", "file", cfg.File, "err", err)
		return err
	}
	r.conns.SetCircuitOptions(cfg.Probe.circuit())
	r.st.Store(st)
	old.retire()
	r.m.reloads.WithLabelValues("ok").Inc()
	r.noteReload(cfg.File, nil)
	r.log.Info("configuration reloaded", "file", cfg.File, "pools", len(st.pools), "chain", chainNames(st.chain))
	for _, why := range cfg.Unread() {
		r.log.Warn("setting takes no effect", "why", why)
	}
	return nil
}

// ReloadFile reads path and reloads it (see Reload).
func (r *Router) ReloadFile(path string) error {
	// Read and decoded here, validated (and the chain built) once, by
	// Reload.
	cfg, err := readConfig(path)
	if err != nil {
		r.m.reloads.WithLabelValues("refused").Inc()
		r.noteReload(path, err)
		r.log.Error("configuration refused; keeping the current one", "file", path, "err", err)
		return err
	}
	return r.Reload(*cfg)
}

// DefaultWatchInterval is how often WatchFile looks at the file.
const DefaultWatchInterval = 2 * time.Second

// WatchFile reloads the configuration from path whenever the content of
// the file, of a file it references (pool policy files, tokenizer files,
// chat templates; watchfiles.go) or of the shadow file (WithShadowFile)
// changes, looking every interval (default DefaultWatchInterval), until ctx
// ends. Polling the content rather than watching events survives editors
// that replace files and Kubernetes ConfigMaps that swap symlinks. A bad new
// file is refused (logged, counted in kvgate_globalrouter_config_reloads_total)
// and the current configuration stays; it is tried again once it changes
// (a file read half-written is refused, and its complete content, being a
// change, is reloaded at the next look).
// changed, when not nil, is told the result of each reload attempt. When
// the current configuration was not read from path, the first look reloads.
func (r *Router) WatchFile(ctx context.Context, path string, interval time.Duration, changed func(error)) error {
	if interval <= 0 {
		interval = DefaultWatchInterval
	}
	// The baseline is the content the current configuration was read
	// from: a change made before this call is still picked up.
	var last [32]byte
	if cfg := r.Config(); cfg.File == path {
		last = r.withShadowSum(cfg.sum)
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		sum, err := r.fileSum(path)
		if err != nil {
			r.log.Warn("cannot read the configuration file; keeping the current configuration", "file", path, "err", err)
			continue
		}
		if sum == last {
			continue
		}
		last = sum
		err = r.ReloadFile(path)
		if changed != nil {
			changed(err)
		}
	}
}
