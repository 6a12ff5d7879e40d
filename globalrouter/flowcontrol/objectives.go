package flowcontrol

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/kvgate/kvgate/lib/config"
)

// The Gateway API Inference Extension's InferenceObjective, as its
// endpoint picker reads it (sigs.k8s.io/gateway-api-inference-extension
// v1.0.0, the version deploy/validate pins):
//   - config/crd/bases/inference.networking.x-k8s.io_inferenceobjectives.yaml:
//     group inference.networking.x-k8s.io, version v1alpha2 (the only
//     one served), spec.priority an integer ("an unset value" is 0),
//     spec.poolRef {group (default inference.networking.k8s.io), kind
//     (default InferencePool), name (required)} required;
//   - pkg/epp/controller/inferenceobjective_reconciler.go: the picker of
//     a pool keeps the objectives whose poolRef names its pool (name and
//     group), by metadata.name (pkg/epp/datastore/datastore.go
//     ObjectiveSet).
const (
	ObjectiveAPIVersion = "inference.networking.x-k8s.io/v1alpha2"
	ObjectiveKind       = "InferenceObjective"
	// PoolGroup and PoolKind are poolRef's defaults.
	PoolGroup = "inference.networking.k8s.io"
	PoolKind  = "InferencePool"
)

// Objective is one InferenceObjective as flow control reads it: a request
// naming Name (x-gateway-inference-objective) has priority Priority.
type Objective struct {
	Name     string `yaml:"name"`
	Priority int    `yaml:"priority"`
}

// objectiveManifest is an InferenceObjective manifest: the fields the
// CRD's schema defines (metadata and status are read loosely, as the API
// server does; spec strictly).
type objectiveManifest struct {
	APIVersion string    `yaml:"apiVersion"`
	Kind       string    `yaml:"kind"`
	Metadata   yaml.Node `yaml:"metadata"`
	Spec       struct {
		Priority *int `yaml:"priority"`
		PoolRef  *struct {
			Group *string `yaml:"group"`
			Kind  *string `yaml:"kind"`
			Name  string  `yaml:"name"`
		} `yaml:"poolRef"`
	} `yaml:"spec"`
	Status yaml.Node `yaml:"status"`
}

// listManifest is `kubectl get inferenceobjectives -o yaml`'s List.
type listManifest struct {
	APIVersion string      `yaml:"apiVersion"`
	Kind       string      `yaml:"kind"`
	Metadata   yaml.Node   `yaml:"metadata"`
	Items      []yaml.Node `yaml:"items"`
}

// dnsSubdomain is Kubernetes' object name rule (RFC 1123 subdomain, at
// most 253 characters): the header names an objective by it.
var dnsSubdomain = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

// ParseObjectives reads InferenceObjective manifests: YAML documents
// separated by ---, each an InferenceObjective or a List (kind List or
// InferenceObjectiveList, as kubectl prints them) of them. With pool
// set, only the objectives whose poolRef names that InferencePool are
// kept, as that pool's endpoint picker keeps them; "" keeps every one.
// Every error names file:line and the field; all are reported.
func ParseObjectives(file string, data []byte, pool string) ([]Objective, error) {
	var errs []error
	var out []Objective
	at := map[string]int{} // name → line, for duplicates
	add := func(n *yaml.Node) {
		o, keep, err := parseObjective(file, n, pool)
		if err != nil {
			errs = append(errs, err)
			return
		}
		if !keep {
			return
		}
		if line, ok := at[o.Name]; ok {
			errs = append(errs, config.Errorf(file, n, "metadata.name", "objective %q defined twice (first at line %d)", o.Name, line))
			return
		}
		at[o.Name] = n.Line
		out = append(out, o)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var doc yaml.Node
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			// A syntax error ends the stream: the decoder cannot resync.
			errs = append(errs, syntaxError(file, err))
			break
		}
		n := config.Deref(&doc)
		if n == nil || n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
			continue // an empty document (a trailing ---)
		}
		if n.Kind != yaml.MappingNode {
			errs = append(errs, config.Errorf(file, n, "", "want an %s manifest (a mapping)", ObjectiveKind))
			continue
		}
		kind := config.Field(n, "kind")
		if kind != nil && (kind.Value == "List" || kind.Value == ObjectiveKind+"List") {
			var l listManifest
			if err := config.DecodeStrict(file, "", n, &l); err != nil {
				errs = append(errs, err)
				continue
			}
			for i := range l.Items {
				add(&l.Items[i])
			}
			continue
		}
		add(n)
	}
	return out, errors.Join(errs...)
}

// parseObjective reads one manifest: its objective, and whether pool
// keeps it.
func parseObjective(file string, n *yaml.Node, pool string) (Objective, bool, error) {
	var m objectiveManifest
	if err := config.DecodeStrict(file, "", n, &m); err != nil {
		return Objective{}, false, err
	}
	bad := func(at *yaml.Node, what, format string, args ...any) (Objective, bool, error) {
		if at == nil || at.Line == 0 {
			at = n
		}
		return Objective{}, false, config.Errorf(file, at, what, format, args...)
	}
	switch {
	case m.Kind != ObjectiveKind:
		return bad(config.Field(n, "kind"), "kind", "%q: want %s (or a List of them)", m.Kind, ObjectiveKind)
	case m.APIVersion != ObjectiveAPIVersion:
		return bad(config.Field(n, "apiVersion"), "apiVersion", "%q: want %s (the Inference Extension's InferenceObjective)", m.APIVersion, ObjectiveAPIVersion)
	}
	name := config.Field(&m.Metadata, "name")
	switch {
	case name == nil || name.Kind != yaml.ScalarNode || name.Value == "":
		return bad(config.Field(n, "metadata"), "metadata.name", "required")
	case len(name.Value) > 253 || !dnsSubdomain.MatchString(name.Value):
		return bad(name, "metadata.name", "%q is not a Kubernetes object name (lower-case letters, digits, '-' and '.', at most 253)", name.Value)
	}
	ref := m.Spec.PoolRef
	spec := config.Field(n, "spec")
	if ref == nil {
		return bad(spec, "spec.poolRef", "required (the InferencePool the objective belongs to)")
	}
	refAt := config.Field(spec, "poolRef")
	group, kind := PoolGroup, PoolKind
	if ref.Group != nil {
		group = *ref.Group
	}
	if ref.Kind != nil {
		kind = *ref.Kind
	}
	switch {
	case ref.Name == "" || len(ref.Name) > 253:
		return bad(config.NodeAt(refAt, "name"), "spec.poolRef.name", "required, at most 253 characters")
	case len(kind) == 0 || len(kind) > 63:
		return bad(config.NodeAt(refAt, "kind"), "spec.poolRef.kind", "%q: want 1 to 63 characters", kind)
	case len(group) > 253 || group != "" && !dnsSubdomain.MatchString(group):
		return bad(config.NodeAt(refAt, "group"), "spec.poolRef.group", "%q is not an API group", group)
	}
	o := Objective{Name: name.Value}
	if m.Spec.Priority != nil {
		// The decoder truncates a float into an int; the CRD's is an integer.
		if p := config.Field(spec, "priority"); p != nil && p.Tag != "!!int" {
			return bad(p, "spec.priority", "%q: want an integer", p.Value)
		}
		o.Priority = *m.Spec.Priority
	}
	// The picker's reconciler matches the pool's name and group.
	keep := pool == "" || ref.Name == pool && group == PoolGroup
	return o, keep, nil
}

// syntaxError is a YAML syntax error of file at its line.
func syntaxError(file string, err error) error {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	e := &config.PosError{File: file, Msg: msg}
	var line int
	if _, scanErr := fmt.Sscanf(msg, "line %d:", &line); scanErr == nil {
		e.Line = line
		e.Msg = strings.TrimSpace(msg[strings.Index(msg, ":")+1:])
	}
	return e
}
