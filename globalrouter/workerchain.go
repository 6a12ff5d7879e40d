package globalrouter

import "github.com/kvgate/kvgate/pool"

// CheckWorkerChains checks every pool's worker chain with check (a local
// router's registry, localrouter.PoolChainCheck): Validate checks only the
// chains' shape, since the global router does not link the local router's
// scorers. The first error is returned, pointing at the entry's line when
// the configuration came from a file.
func (c *Config) CheckWorkerChains(check pool.ChainCheck) error {
	for i := range c.Pools {
		if err := c.Pools[i].CheckWorkerChain(check); err != nil {
			return err
		}
	}
	return nil
}
