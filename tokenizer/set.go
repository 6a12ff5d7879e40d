package tokenizer

import (
	"errors"
	"fmt"
	"sort"
	"strings"
)

// ErrUnknownModel: Set.Model was asked for a model no Config names.
var ErrUnknownModel = errors.New("tokenizer: unknown model")

// Set holds the tokenizers of the served models, by model name. It is
// read-only once loaded and safe for concurrent use.
type Set struct {
	models map[string]*Model
}

// LoadSet loads one Model per Config. Each Config must name its model,
// once; any load error fails the whole set, naming the model.
func LoadSet(cfgs []Config) (*Set, error) {
	s := &Set{models: make(map[string]*Model, len(cfgs))}
	for i, cfg := range cfgs {
		if cfg.Model == "" {
			return nil, fmt.Errorf("%w: tokenizers[%d]: no model name", ErrConfig, i)
		}
		if _, dup := s.models[cfg.Model]; dup {
			return nil, fmt.Errorf("%w: tokenizers[%d]: model %q configured twice", ErrConfig, i, cfg.Model)
		}
		m, err := Load(cfg)
		if err != nil {
			return nil, fmt.Errorf("model %q: %w", cfg.Model, err)
		}
		s.models[cfg.Model] = m
	}
	return s, nil
}

// Model returns the tokenizer of a model, or an error wrapping
// ErrUnknownModel that lists the configured ones.
func (s *Set) Model(name string) (*Model, error) {
	if m, ok := s.models[name]; ok {
		return m, nil
	}
	names := make([]string, 0, len(s.models))
	for n := range s.models {
		names = append(names, n)
	}
	sort.Strings(names)
	return nil, fmt.Errorf("%w %q: no tokenizer is configured for it (configured: %s)", ErrUnknownModel, name, strings.Join(names, ", "))
}
