package localrouter

import (
	"gopkg.in/yaml.v3"
)

// PoolChainCheck returns the check of a pools file's worker chains
// (pool.ChainCheck) against reg (nil: the built-ins): each chain is built
// against the router defaults at the pool's block size. From a file (n
// set), the error points at the faulty entry's line (DecodeWorkerChain).
// The process that links both the pools file and the local router (the
// ext_proc assembly, kvgate policy check, the replay) passes it to
// globalrouter.Config.CheckWorkerChains; the client side never links the
// registry itself.
func PoolChainCheck(reg *ScorerRegistry) func(file, what string, n *yaml.Node, specs []ScorerSpec, blockSize int) error {
	return func(file, what string, n *yaml.Node, specs []ScorerSpec, blockSize int) error {
		rc := DefaultConfig()
		rc.BlockSize = blockSize
		rc.Scorers = reg
		if n != nil && file != "" {
			_, err := DecodeWorkerChain(file, what, n, rc)
			return err
		}
		return ValidateWorkerChain(specs, rc)
	}
}
