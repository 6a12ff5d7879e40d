package pool

import (
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/lib/config"
	"github.com/kvgate/kvgate/policies"
)

// Config defines one pool.
type Config struct {
	// Name is unique among the pools; it is the etcd and NATS pool name.
	Name string `yaml:"name"`
	// Role: aggregated (default), prefill or decode.
	Role policies.Role `yaml:"role"`
	// Models the pool serves; "*" serves any.
	Models []string `yaml:"models"`
	// BlockSize is the pool's KV block size in tokens (default 16).
	BlockSize int `yaml:"block_size"`
	// Weight is handed to policies (default 1).
	Weight float64 `yaml:"weight"`
	// DPRankBodyField also sets SGLang's routed_dp_rank body field to the
	// chosen data-parallel rank (the ext_proc server rewrites the JSON
	// body, a client's own value replaced), for SGLang builds that read
	// the rank from the body rather than the X-Data-Parallel-Rank header
	// (false: the header alone).
	DPRankBodyField bool `yaml:"dp_rank_body_field"`
	// Routers says where the pool's local routers are.
	Routers Routers `yaml:"routers"`
	// Policy is the pool's policy section, inline: per-policy arguments
	// keyed by policy name.
	Policy policies.PoolSection `yaml:"policy"`
	// PolicyFile is the pool's policy section in its own file (relative to
	// the configuration file); exclusive with Policy. DecodeConfigs loads
	// it into Policy.
	PolicyFile string `yaml:"policy_file"`
	// WorkerChain is how the pool's local routers rank its workers:
	// filters and weighted scorers, a list of {name, weight, args}
	// (routing.ScorerSpec; docs/localrouter.md "Worker chain"). Empty:
	// the default chain (saturation, then the ttft scorer). The global
	// router only validates it; the pool's local routers take it from
	// this file, started with `kvgate localrouter -pools-file FILE -pool
	// NAME` (the same file or ConfigMap; they refuse a -worker-chain as
	// well), as the replay does; `kvgate up` gives its local routers its
	// own -pool-a-worker-chain / -pool-b-worker-chain.
	WorkerChain []routing.ScorerSpec `yaml:"worker_chain"`

	// File and node locate the pool in its configuration for errors.
	File string     `yaml:"-"`
	node *yaml.Node `yaml:"-"`
}

// Routers locate a pool's local routers: static addresses, or discovery in
// etcd under membership.RoutersPrefix(pool) (the routers register themselves).
type Routers struct {
	// Static lists the local routers' gRPC addresses (host:port).
	Static []string `yaml:"static"`
	// Etcd discovers the local routers in etcd.
	Etcd bool `yaml:"etcd"`
}

// DefaultBlockSize is the block size of a pool that sets none.
const DefaultBlockSize = 16

// NewConfig returns the configuration of an aggregated pool serving models whose
// local routers listen at addrs, with defaults for everything else: the
// Go-side constructor for configurations built in code.
func NewConfig(name string, blockSize int, models []string, addrs ...string) Config {
	c := Config{Name: name, Role: policies.RoleAggregated, Models: models, BlockSize: blockSize,
		Routers: Routers{Static: addrs}}
	c.Defaults()
	return c
}

// Defaults fills in the fields left unset.
func (c *Config) Defaults() {
	if c.Role == "" {
		c.Role = policies.RoleAggregated
	}
	if c.BlockSize == 0 {
		c.BlockSize = DefaultBlockSize
	}
	if c.Weight == 0 {
		c.Weight = 1
	}
}

// Validate checks the configuration; errors name the file, line and field.
func (c *Config) Validate() error {
	switch {
	case c.Name == "":
		return c.errorf("name", "required")
	case strings.ContainsAny(c.Name, "/. *>"):
		return c.errorf("name", "%q must not contain '/', '.', ' ', '*' or '>'", c.Name)
	case !c.Role.Valid():
		return c.errorf("role", "%q: want aggregated, prefill or decode", c.Role)
	case len(c.Models) == 0:
		return c.errorf("models", "at least one model required")
	case c.BlockSize <= 0:
		return c.errorf("block_size", "got %d, want > 0", c.BlockSize)
	case !(c.Weight > 0):
		return c.errorf("weight", "got %v, want > 0", c.Weight)
	case len(c.Routers.Static) == 0 && !c.Routers.Etcd:
		return c.errorf("routers", "set static addresses or etcd: true")
	case len(c.Routers.Static) > 0 && c.Routers.Etcd:
		return c.errorf("routers", "static and etcd are exclusive")
	}
	for _, m := range c.Models {
		if m == "" {
			return c.errorf("models", "empty model name")
		}
	}
	for _, a := range c.Routers.Static {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return c.errorf("routers", "static address %q: %v", a, err)
		}
	}
	if dup := firstDup(c.Routers.Static); dup != "" {
		return c.errorf("routers", "static address %q listed twice", dup)
	}
	if len(c.WorkerChain) > 0 {
		if err := c.validateWorkerChain(); err != nil {
			return err
		}
	}
	return nil
}

// validateWorkerChain checks the worker chain's shape: every entry named,
// no name twice, weights finite and ≥ 0. Which names and arguments exist
// is the local router's registry's to say (CheckWorkerChain); the client
// side does not link it.
func (c *Config) validateWorkerChain() error {
	seen := make(map[string]bool, len(c.WorkerChain))
	for i, sp := range c.WorkerChain {
		var msg string
		switch {
		case sp.Name == "":
			msg = "name required"
		case seen[sp.Name]:
			msg = fmt.Sprintf("%q named twice", sp.Name)
		case !(sp.Weight >= 0) || math.IsInf(sp.Weight, 0):
			msg = fmt.Sprintf("weight %g must be > 0", sp.Weight)
		}
		if msg != "" {
			// From a file, the error points at the entry.
			if n := c.field("worker_chain"); n != nil && c.File != "" && n.Kind == yaml.SequenceNode && i < len(n.Content) {
				return config.Errorf(c.File, n.Content[i], fmt.Sprintf("pool %q: worker_chain[%d]", c.Name, i), "%s", msg)
			}
			return c.errorf("worker_chain", "entry %d: %s", i+1, msg)
		}
		seen[sp.Name] = true
	}
	return nil
}

// ChainCheck checks a pool's worker chain against a local router's
// registry of filters and scorers (localrouter.CheckPoolWorkerChain):
// from a file, n is the worker_chain node and file the file's name, so the
// error can point at the faulty entry's line; what names the field in
// errors. blockSize is the pool's.
type ChainCheck func(file, what string, n *yaml.Node, specs []routing.ScorerSpec, blockSize int) error

// CheckWorkerChain checks the pool's worker chain with check (nil: nothing
// to check). The process that links both the pools file and a local
// router's registry (the ext_proc assembly, kvgate policy check, the
// replay) calls it after Validate.
func (c *Config) CheckWorkerChain(check ChainCheck) error {
	if check == nil || len(c.WorkerChain) == 0 {
		return nil
	}
	what := fmt.Sprintf("pool %q: worker_chain", c.Name)
	if n := c.field("worker_chain"); n != nil && c.File != "" {
		return check(c.File, what, n, c.WorkerChain, c.BlockSize)
	}
	if err := check("", what, nil, c.WorkerChain, c.BlockSize); err != nil {
		return c.errorf("worker_chain", "%s", strings.TrimPrefix(err.Error(), routing.ErrInvalidConfig.Error()+": "))
	}
	return nil
}

// field is the value node of key in the pool's mapping, nil when unknown.
func (c *Config) field(key string) *yaml.Node { return config.Field(c.node, key) }

// Serves reports whether the pool serves model.
func (c *Config) Serves(model string) bool {
	return slices.Contains(c.Models, model) || slices.Contains(c.Models, "*")
}

func (c *Config) errorf(field, format string, args ...any) error {
	n := c.node
	if n != nil && n.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == field {
				n = n.Content[i]
				break
			}
		}
	}
	what := fmt.Sprintf("pool %q: %s", c.Name, field)
	file := c.File
	if file == "" {
		file = "<go>"
	}
	return config.Errorf(file, n, what, format, args...)
}

func firstDup(s []string) string {
	seen := make(map[string]bool, len(s))
	for _, v := range s {
		if seen[v] {
			return v
		}
		seen[v] = true
	}
	return ""
}

// DecodeConfigs strictly decodes a YAML sequence of pools from file, applies
// defaults, loads policy files (relative to file's folder) and validates
// each pool. Errors name the file, line and field.
func DecodeConfigs(file string, n *yaml.Node) ([]Config, error) {
	if n == nil || n.Kind == 0 {
		return nil, nil
	}
	if n.Kind != yaml.SequenceNode {
		return nil, config.Errorf(file, n, "pools", "must be a list of pools")
	}
	out := make([]Config, 0, len(n.Content))
	names := map[string]bool{}
	var errs []error // every pool is checked: one run reports each pool's error
	for i, pn := range n.Content {
		c, err := decodeConfig(file, i, pn)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if names[c.Name] {
			errs = append(errs, c.errorf("name", "pool %q defined twice", c.Name))
			continue
		}
		names[c.Name] = true
		out = append(out, c)
	}
	if len(errs) == 1 {
		return nil, errs[0]
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}

// decodeConfig decodes and validates the pool at index i of file.
func decodeConfig(file string, i int, pn *yaml.Node) (Config, error) {
	var c Config
	if err := config.DecodeStrict(file, fmt.Sprintf("pools[%d]", i), pn, &c); err != nil {
		return c, err
	}
	c.File, c.node = file, pn
	c.Defaults()
	c.Policy.SetFile(file)
	if c.PolicyFile != "" && len(c.Policy) > 0 {
		return c, c.errorf("policy_file", "policy and policy_file are exclusive")
	}
	if c.PolicyFile != "" {
		sec, err := LoadPolicyFile(resolve(file, c.PolicyFile))
		if err != nil {
			if _, positioned := errors.AsType[*policies.PosError](err); !positioned {
				return c, c.errorf("policy_file", "%v", err) // unreadable: point at the reference
			}
			return c, err
		}
		c.Policy = sec
	}
	return c, c.Validate()
}

// LoadPolicyFile reads a pool policy file: a mapping of policy name to that
// policy's per-pool arguments.
func LoadPolicyFile(path string) (policies.PoolSection, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("pool policy file: %w", err)
	}
	var empty yaml.Node
	if yaml.Unmarshal(data, &empty) == nil && empty.Kind == 0 {
		return policies.PoolSection{}, nil // only comments: no per-pool arguments
	}
	doc, err := config.ParseFile(path, data)
	if err != nil {
		return nil, err
	}
	var sec policies.PoolSection
	if err := config.DecodeStrict(path, "policy", doc, &sec); err != nil {
		return nil, err
	}
	sec.SetFile(path)
	return sec, nil
}

func resolve(base, p string) string {
	if filepath.IsAbs(p) || base == "" || strings.HasPrefix(base, "<") {
		return p
	}
	return filepath.Join(filepath.Dir(base), p)
}
