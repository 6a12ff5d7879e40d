package policies

import (
	"fmt"

	"gopkg.in/yaml.v3"

	"github.com/kvgate/kvgate/lib/config"
)

// PosError is a configuration error at a position of a file (an alias of
// the project's one config error type).
type PosError = config.PosError

// Section is one piece of configuration text — a policy's arguments in the
// chain or in a pool's policy section — with the file it came from, so that
// errors can name file and line. A zero Section means "no arguments".
type Section struct {
	File string
	Node *yaml.Node
}

// SectionOf encodes v (a struct or map of a policy's arguments) as a
// Section, for configurations built in Go rather than read from YAML.
func SectionOf(v any) Section {
	var n yaml.Node
	if err := n.Encode(v); err != nil {
		// Encode fails only for values YAML cannot represent (channels,
		// functions): a programming error in the caller.
		panic(fmt.Sprintf("policies: SectionOf(%T): %v", v, err))
	}
	return Section{File: "<go>", Node: &n}
}

// Empty reports whether the section holds nothing.
func (s Section) Empty() bool {
	n := s.Node
	for n != nil && n.Kind == yaml.DocumentNode && len(n.Content) > 0 {
		n = n.Content[0]
	}
	return n == nil || n.Kind == 0 || (n.Kind == yaml.ScalarNode && n.Tag == "!!null")
}

// Decode decodes the section into out strictly: an unknown field is an
// error. Errors read "file:line:col: what: message"; what names the policy
// (or pool) for the reader.
func (s Section) Decode(what string, out any) error {
	if s.Empty() {
		return nil
	}
	return config.DecodeStrict(s.File, what, s.Node, out)
}

// Spec is one entry of a policy chain: a policy name and its global
// arguments. In YAML it is either the bare name ("cost") or a mapping
// {name: ..., args: {...}}.
type Spec struct {
	Name string
	Args Section
	// Line and Column locate the entry in Args.File (0 when built in Go).
	Line, Column int
}

// UnmarshalYAML implements yaml.Unmarshaler.
func (s *Spec) UnmarshalYAML(n *yaml.Node) error {
	s.Line, s.Column = n.Line, n.Column
	switch n.Kind {
	case yaml.ScalarNode:
		s.Name = n.Value
		return nil
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			switch k.Value {
			case "name":
				if v.Kind != yaml.ScalarNode {
					return config.Errorf("", v, "chain", "policy name must be a string")
				}
				s.Name = v.Value
			case "args":
				s.Args.Node = v
			default:
				return config.Errorf("", k, "chain", "unknown field %q in policy entry (known: name, args)", k.Value)
			}
		}
		if s.Name == "" {
			return config.Errorf("", n, "chain", "policy entry has no name")
		}
		return nil
	default:
		return config.Errorf("", n, "chain", "policy entry must be a name or {name, args}")
	}
}

// PoolSection is one pool's policy section: per-policy arguments keyed by
// policy name (`cost: {scale: 2}`).
type PoolSection map[string]Section

// UnmarshalYAML implements yaml.Unmarshaler. File names are filled in by
// SetFile.
func (p *PoolSection) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		return config.Errorf("", n, "policy", "pool policy section must be a mapping of policy name to arguments")
	}
	m := make(PoolSection, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := n.Content[i]
		if _, dup := m[k.Value]; dup {
			return config.Errorf("", k, "policy", "policy %q configured twice", k.Value)
		}
		m[k.Value] = Section{Node: n.Content[i+1]}
	}
	*p = m
	return nil
}

// SetFile records file as the origin of every section that has none.
func (p PoolSection) SetFile(file string) {
	for k, s := range p {
		if s.File == "" {
			s.File = file
			p[k] = s
		}
	}
}
