package localrouter

import (
	"fmt"
	"os"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/kvgate/kvgate/lib/config"
)

// DecodeWorkerChain strictly decodes a YAML list of chain entries
// ({name, weight, args}) at node n of file and checks each against the
// registry and cfg. Errors are config.PosErrors naming the file, the
// entry's line and what is wrong (an unknown key, filter, scorer or
// argument, a bad weight).
func DecodeWorkerChain(file, what string, n *yaml.Node, cfg Config) ([]ScorerSpec, error) {
	if n == nil || n.Kind == 0 {
		return nil, nil
	}
	if n.Kind == yaml.DocumentNode && len(n.Content) == 1 {
		n = n.Content[0]
	}
	if n.Kind != yaml.SequenceNode {
		return nil, config.Errorf(file, n, what, "must be a list of {name, weight, args}")
	}
	out := make([]ScorerSpec, 0, len(n.Content))
	seen := map[string]bool{}
	for i, en := range n.Content {
		w := fmt.Sprintf("%s[%d]", what, i)
		var sp ScorerSpec
		if err := config.DecodeStrict(file, w, en, &sp); err != nil {
			return nil, err
		}
		if sp.Name == "" {
			return nil, config.Errorf(file, en, w, "name required")
		}
		if seen[sp.Name] {
			return nil, config.Errorf(file, en, w, "%q named twice", sp.Name)
		}
		seen[sp.Name] = true
		if err := ValidateScorerSpec(i, sp, cfg); err != nil {
			return nil, config.Errorf(file, en, w, "%s", strings.TrimPrefix(err.Error(), ErrInvalidConfig.Error()+": "))
		}
		out = append(out, sp)
	}
	if len(out) > 0 {
		if err := ValidateWorkerChain(out, cfg); err != nil {
			return nil, config.Errorf(file, n, what, "%s", strings.TrimPrefix(err.Error(), ErrInvalidConfig.Error()+": "))
		}
	}
	return out, nil
}

// LoadWorkerChain reads a chain: from a YAML file when s names one (ends
// in .yaml or .yml, or starts with @, which is dropped), else inline
// (ParseWorkerChain). The chain is validated against cfg.
func LoadWorkerChain(s string, cfg Config) ([]ScorerSpec, error) {
	s = strings.TrimSpace(s)
	path, isFile := strings.CutPrefix(s, "@")
	if !isFile && !strings.HasSuffix(s, ".yaml") && !strings.HasSuffix(s, ".yml") {
		specs, err := ParseWorkerChain(s)
		if err != nil {
			return nil, err
		}
		if len(specs) > 0 {
			if err := ValidateWorkerChain(specs, cfg); err != nil {
				return nil, err
			}
		}
		return specs, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: worker chain file: %w", ErrInvalidConfig, err)
	}
	doc, err := config.ParseFile(path, data)
	if err != nil {
		return nil, err
	}
	return DecodeWorkerChain(path, "worker_chain", doc, cfg)
}
