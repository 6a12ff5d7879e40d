package pool

import (
	"strings"

	"github.com/kvgate/kvgate/membership"
)

// sink follows the pool's routers in etcd (registry.Sink). Its calls
// come from the watch goroutine, one at a time; disc is theirs alone.
type sink Pool

func (s *sink) Reset(kvs map[string][]byte) {
	p := (*Pool)(s)
	p.disc = make(map[string][]byte, len(kvs))
	for k, v := range kvs {
		p.disc[k] = v
	}
	p.rediscover()
	select {
	case <-p.synced:
	default:
		close(p.synced)
	}
}

func (s *sink) Put(key string, value []byte) {
	p := (*Pool)(s)
	p.disc[key] = value
	p.rediscover()
}

func (s *sink) Delete(key string) {
	p := (*Pool)(s)
	delete(p.disc, key)
	p.rediscover()
}

func (p *Pool) rediscover() {
	addrs := make(map[string]bool, len(p.disc))
	for k, v := range p.disc {
		if a, ok := p.routerAddr(k, v); ok {
			addrs[a] = true
		}
	}
	p.setRouters(addrs)
	p.seedKnown()
}

func (p *Pool) routerAddr(key string, value []byte) (string, bool) {
	info, err := membership.ParseRouterInfo(value)
	if err != nil {
		p.log.Warn("ignoring local router registration", "key", key, "err", err)
		return "", false
	}
	if info.BlockSize != p.cfg.BlockSize {
		p.log.Warn("ignoring local router with another block size", "key", key, "router_block_size", info.BlockSize, "pool_block_size", p.cfg.BlockSize)
		return "", false
	}
	return info.GRPCAddress, true
}

// setRouters makes addrs the pool's routers, taking references on new ones
// and releasing the ones gone.
func (p *Pool) setRouters(addrs map[string]bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	old := *p.routers.Load()
	keep := make([]*conn, 0, len(addrs))
	have := map[string]bool{}
	for _, c := range old {
		if addrs[c.addr] {
			keep = append(keep, c)
			have[c.addr] = true
		} else {
			p.conns.release(c)
		}
	}
	for a := range addrs {
		if have[a] {
			continue
		}
		c, err := p.conns.acquire(a)
		if err != nil {
			p.log.Warn("cannot connect to discovered local router", "router", a, "err", err)
			continue
		}
		keep = append(keep, c)
	}
	p.routers.Store(&keep)
	p.log.Info("local routers", "routers", strings.Join(addrsOf(keep), ","))
}

func addrsOf(cs []*conn) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = c.addr
	}
	return out
}
