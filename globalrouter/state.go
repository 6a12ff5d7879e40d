package globalrouter

import (
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/kvgate/kvgate/policies"
	"github.com/kvgate/kvgate/pool"
	"github.com/kvgate/kvgate/tokenizer"
)

// state is one configuration, built: immutable but for retirement.
type state struct {
	cfg    *Config
	chain  *policies.Chain
	pools  []*poolEntry // configuration order
	byName map[string]*poolEntry
	models map[string]*modelEntry
	// wildcard serves models no pool names, when a pool serves "*".
	wildcard *modelEntry
	// unread are the request headers this configuration does not read
	// (unreadhdr.go).
	unread []*unreadHeader

	// refs counts the state's users: one for the Router while the state
	// is current, one per decision using it. Once it reaches zero it
	// never rises again, and drained is closed.
	refs    atomic.Int64
	drained chan struct{}
}

type poolEntry struct {
	p   *pool.Pool
	cfg pool.Config
}

type modelEntry struct {
	name       string
	lora       string // adapter name when the model is a LoRA adapter
	tok        Tokenizer
	tcfg       tokenizer.Config
	pools      []*poolEntry
	blockSizes []int // distinct, in order of first use
	// flowKey names the flow-control queue of the model: its pools.
	flowKey string
}

// build opens cfg's pools and tokenizers (reusing old's tokenizers that did
// not change) around chain, the policy chain cfg.validate built.
func (r *Router) build(cfg *Config, chain *policies.Chain, old *state) (_ *state, err error) {
	st := &state{cfg: cfg, chain: chain, byName: map[string]*poolEntry{}, models: map[string]*modelEntry{}, drained: make(chan struct{}),
		unread: r.unreadHeaders(cfg, chain)}
	st.refs.Store(1)
	defer func() {
		if err != nil {
			for _, pe := range st.pools {
				pe.p.Close()
			}
		}
	}()
	for _, pc := range cfg.Pools {
		p, err := pool.Open(pc, pool.Options{Conns: r.conns, ProbeTimeout: cfg.Probe.Timeout,
			ProbeMinTimeout: cfg.Probe.MinTimeout, Ejector: r.ejector, Etcd: r.opts.etcd, Logger: r.opts.logger})
		if err != nil {
			return nil, err
		}
		pe := &poolEntry{p: p, cfg: pc}
		st.pools = append(st.pools, pe)
		st.byName[pc.Name] = pe
	}
	// Pools discovering their routers in etcd get their first listing
	// before the state serves: a reload must not blink to "no router".
	deadline := time.NewTimer(syncTimeout)
	defer deadline.Stop()
	timedOut := false
	for _, pe := range st.pools {
		if timedOut {
			deadline.Reset(0)
		}
		select {
		case <-pe.p.Synced():
		case <-deadline.C:
			timedOut = true
			r.log.Warn("local router discovery has not listed yet; the pool has no router until it does", "pool", pe.cfg.Name)
		}
	}
	var wild []*poolEntry
	for _, pe := range st.pools {
		if pe.cfg.Serves("*") {
			wild = append(wild, pe)
		}
	}
	entry := func(model string) (*modelEntry, error) {
		me := &modelEntry{name: model, tcfg: cfg.tokenizerFor(model), lora: cfg.loraOf(model)}
		if t, ok := r.opts.tokenizers[model]; ok {
			me.tok = t
		} else if prev := old.model(model); prev != nil && sameTokenizer(prev.tcfg, me.tcfg) {
			me.tok = prev.tok
		} else {
			tc := me.tcfg
			tc.Logger = r.opts.logger
			t, err := tokenizer.Load(tc)
			if err != nil {
				return nil, fmt.Errorf("%s: model %q: tokenizer: %w", cfg.file(), model, err)
			}
			me.tok = t
		}
		for _, pe := range st.pools {
			if pe.cfg.Serves(model) {
				me.pools = append(me.pools, pe)
				if !slices.Contains(me.blockSizes, pe.cfg.BlockSize) {
					me.blockSizes = append(me.blockSizes, pe.cfg.BlockSize)
				}
				if me.flowKey != "" {
					me.flowKey += ","
				}
				me.flowKey += pe.cfg.Name
			}
		}
		return me, nil
	}
	for _, pe := range st.pools {
		for _, m := range pe.cfg.Models {
			if m == "*" || st.models[m] != nil {
				continue
			}
			me, err := entry(m)
			if err != nil {
				return nil, err
			}
			st.models[m] = me
		}
	}
	if len(wild) > 0 {
		me, err := entry("*")
		if err != nil {
			return nil, err
		}
		st.wildcard = me
	}
	return st, nil
}

func (st *state) model(name string) *modelEntry {
	if st == nil {
		return nil
	}
	if me := st.models[name]; me != nil {
		return me
	}
	return st.wildcard
}

func chainNames(c *policies.Chain) []string {
	var out []string
	for _, p := range c.Policies() {
		out = append(out, p.Name())
	}
	return out
}

// acquire returns the current state with a reference taken (release it),
// or nil once the Router is closed. It takes no lock: a state retired
// between the load and the reference is skipped and the pointer loaded
// again.
func (r *Router) acquire() *state {
	for {
		st := r.st.Load()
		if st == nil {
			return nil
		}
		if st.ref() {
			return st
		}
	}
}

// ref takes a reference unless the state has drained.
func (st *state) ref() bool {
	for {
		n := st.refs.Load()
		if n <= 0 {
			return false
		}
		if st.refs.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// release drops a reference; the last one closes drained.
func (st *state) release() {
	if st.refs.Add(-1) == 0 {
		close(st.drained)
	}
}

// retire, called once the state is no longer current, drops the Router's
// reference, waits for the decisions using st, and closes its pools.
// Leases keep their own references to the local routers' clients.
func (st *state) retire() {
	st.release()
	<-st.drained
	for _, pe := range st.pools {
		pe.p.Close()
	}
}
