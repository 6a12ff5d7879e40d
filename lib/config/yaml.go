package config

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

// ErrInvalid is wrapped by every configuration error of this package: a
// configuration is invalid; the error names the file, line and field. It
// is policies.ErrConfig too, and keeps that error's text, which operators
// (and the golden files of config errors) already read.
var ErrInvalid = errors.New("invalid policy configuration")

// PosError is a configuration error at a position of a file.
type PosError struct {
	File   string
	Line   int
	Column int
	// What names the thing configured: a policy, a pool, a field path.
	What string
	Msg  string
}

func (e *PosError) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
		if e.Column > 0 {
			fmt.Fprintf(&b, ":%d", e.Column)
		}
	}
	b.WriteString(": ")
	if e.What != "" {
		b.WriteString(e.What)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Unwrap makes every PosError an ErrInvalid.
func (e *PosError) Unwrap() error { return ErrInvalid }

// Errorf returns a PosError at node n of file.
func Errorf(file string, n *yaml.Node, what, format string, args ...any) error {
	e := &PosError{File: file, What: what, Msg: fmt.Sprintf(format, args...)}
	if n != nil {
		e.Line, e.Column = n.Line, n.Column
	}
	return e
}

// ParseFile parses YAML text into its document node. A syntax error names
// the file and the line.
func ParseFile(file string, data []byte) (*yaml.Node, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		e := &PosError{File: file, Msg: strings.TrimPrefix(err.Error(), "yaml: ")}
		var line int
		if _, scanErr := fmt.Sscanf(e.Msg, "line %d:", &line); scanErr == nil {
			e.Line = line
			e.Msg = strings.TrimSpace(e.Msg[strings.Index(e.Msg, ":")+1:])
		}
		return nil, e
	}
	if doc.Kind == 0 {
		return nil, &PosError{File: file, Msg: "empty document"}
	}
	return &doc, nil
}

// DecodeStrict decodes n into out, refusing mapping keys that name no field
// of out's struct types (yaml tags). Types implementing yaml.Unmarshaler
// check their own keys. Errors are PosErrors in file; what prefixes the
// field path.
//
// Every unknown key is reported, and the known ones are still decoded, so a
// caller can go on checking the rest and report every error in one run.
func DecodeStrict(file, what string, n *yaml.Node, out any) error {
	unknown := checkKnown(file, n, reflect.TypeOf(out), what)
	if err := n.Decode(out); err != nil {
		if unknown == nil {
			return wrapDecodeError(file, what, err)
		}
		return errors.Join(unknown, wrapDecodeError(file, what, err))
	}
	return unknown
}

func wrapDecodeError(file, what string, err error) error {
	var pe *PosError
	if errors.As(err, &pe) {
		if pe.File == "" {
			pe.File = file
		}
		return err
	}
	var te *yaml.TypeError
	if errors.As(err, &te) && len(te.Errors) > 0 {
		// "line 3: cannot unmarshal !!str `x` into int"
		msg := te.Errors[0]
		e := &PosError{File: file, What: what, Msg: msg}
		var line int
		if _, scanErr := fmt.Sscanf(msg, "line %d:", &line); scanErr == nil {
			e.Line = line
			e.Msg = strings.TrimSpace(msg[strings.Index(msg, ":")+1:])
		}
		return e
	}
	return &PosError{File: file, What: what, Msg: err.Error()}
}

var (
	unmarshalerType = reflect.TypeOf((*yaml.Unmarshaler)(nil)).Elem()
	nodeType        = reflect.TypeOf(yaml.Node{})
)

// checkKnown reports every unknown key under n, not only the first, so one
// run of `kvgate policy check` lists every typo.
func checkKnown(file string, n *yaml.Node, t reflect.Type, path string) error {
	var errs []error
	checkKnownAll(file, n, t, path, &errs)
	if len(errs) == 1 {
		return errs[0]
	}
	return errors.Join(errs...)
}

func checkKnownAll(file string, n *yaml.Node, t reflect.Type, path string, errs *[]error) {
	for n != nil && (n.Kind == yaml.DocumentNode || n.Kind == yaml.AliasNode) {
		if n.Kind == yaml.AliasNode {
			n = n.Alias
			continue
		}
		if len(n.Content) == 0 {
			return
		}
		n = n.Content[0]
	}
	if n == nil || t == nil {
		return
	}
	if t.Implements(unmarshalerType) || reflect.PointerTo(t).Implements(unmarshalerType) {
		return
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
		if t.Implements(unmarshalerType) || reflect.PointerTo(t).Implements(unmarshalerType) {
			return
		}
	}
	if t == nodeType {
		return
	}
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			return // Decode reports the type error
		}
		fields := yamlFields(t)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			ft, ok := fields[k.Value]
			if !ok {
				*errs = append(*errs, Errorf(file, k, path, "unknown field %q (known: %s)", k.Value, knownList(fields)))
				continue
			}
			checkKnownAll(file, v, ft, join(path, k.Value), errs)
		}
	case reflect.Slice, reflect.Array:
		if n.Kind != yaml.SequenceNode {
			return
		}
		for i, c := range n.Content {
			checkKnownAll(file, c, t.Elem(), fmt.Sprintf("%s[%d]", path, i), errs)
		}
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			checkKnownAll(file, n.Content[i+1], t.Elem(), join(path, n.Content[i].Value), errs)
		}
	}
}

func join(path, field string) string {
	if path == "" {
		return field
	}
	return path + "." + field
}

func yamlFields(t reflect.Type) map[string]reflect.Type {
	m := make(map[string]reflect.Type, t.NumField())
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		tag := f.Tag.Get("yaml")
		if tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if strings.Contains(opts, "inline") {
			for k, v := range yamlFields(f.Type) {
				m[k] = v
			}
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		m[name] = f.Type
	}
	return m
}

func knownList(fields map[string]reflect.Type) string {
	names := make([]string, 0, len(fields))
	for k := range fields {
		names = append(names, k)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

// FixFile fills in the file name of a PosError raised before the file was
// known (by an UnmarshalYAML).
func FixFile(err error, file string) error {
	var pe *PosError
	if errors.As(err, &pe) && pe.File == "" {
		pe.File = file
	}
	return err
}

// Field is the value node of key in mapping n (document and alias nodes
// skipped), nil when n is not a mapping or has no such key. Unlike NodeAt
// it tells an absent key from a present one.
func Field(n *yaml.Node, key string) *yaml.Node {
	n = Deref(n)
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

// NodeAt follows path (mapping keys as strings, sequence indexes as ints)
// from n and returns the deepest node reached, so that a validation error
// points as close to the offending value as the text allows.
func NodeAt(n *yaml.Node, path ...any) *yaml.Node {
	n = Deref(n)
	for _, step := range path {
		var next *yaml.Node
		switch s := step.(type) {
		case string:
			if n != nil && n.Kind == yaml.MappingNode {
				for i := 0; i+1 < len(n.Content); i += 2 {
					if n.Content[i].Value == s {
						next = n.Content[i+1]
						break
					}
				}
			}
		case int:
			if n != nil && n.Kind == yaml.SequenceNode && s >= 0 && s < len(n.Content) {
				next = n.Content[s]
			}
		}
		if next = Deref(next); next == nil {
			return n
		}
		n = next
	}
	return n
}

// Deref skips document and alias nodes.
func Deref(n *yaml.Node) *yaml.Node {
	for n != nil {
		switch {
		case n.Kind == yaml.AliasNode:
			n = n.Alias
		case n.Kind == yaml.DocumentNode && len(n.Content) > 0:
			n = n.Content[0]
		default:
			return n
		}
	}
	return nil
}
