package tokenizer

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/valyala/fastjson"
)

// DuplicateKeys says how a request body that names a key twice in one
// JSON object is read. RFC 8259 leaves such a body's meaning open, and
// readers differ: fastjson (and so kvgate, before) takes the first
// occurrence, Python's json (vLLM, SGLang) the last. A router that reads
// one and an engine that runs the other route {"model":"a","model":"b"}
// to a's pool and run b there.
type DuplicateKeys uint8

const (
	// DuplicatesRefuse refuses the body: a *BodyError with
	// ReasonDuplicateKey naming the key and its place ($.messages[1].role).
	// The default: no reader downstream can then read it another way.
	DuplicatesRefuse DuplicateKeys = iota
	// DuplicatesLast reads the body as Python's json does, at every
	// depth: of a key named twice the last value counts, at the place of
	// the first (a dict keeps the key's first insertion order).
	DuplicatesLast
)

// ReasonDuplicateKey is a BodyError's Reason for a key named twice in one
// object, under DuplicatesRefuse.
const ReasonDuplicateKey = "duplicate_key"

// String is the mode's name as ParseDuplicateKeys reads it.
func (d DuplicateKeys) String() string {
	if d == DuplicatesLast {
		return "last"
	}
	return "refuse"
}

// Set reads a mode's name, so that *DuplicateKeys is a flag.Value.
func (d *DuplicateKeys) Set(s string) error {
	m, err := ParseDuplicateKeys(s)
	if err == nil {
		*d = m
	}
	return err
}

// ParseDuplicateKeys reads a mode's name: "refuse" or "last".
func ParseDuplicateKeys(s string) (DuplicateKeys, error) {
	switch strings.TrimSpace(s) {
	case "refuse":
		return DuplicatesRefuse, nil
	case "last":
		return DuplicatesLast, nil
	}
	return 0, fmt.Errorf("duplicate keys %q: want refuse or last", s)
}

// mayHaveDuplicates reports whether an object in v may name a key twice.
// It errs towards yes: a key that fastjson's best-effort unescaping
// leaves with a backslash, or that is not valid UTF-8, counts as a
// possible duplicate, and the exact reading (resolveDuplicates) decides.
// Nothing is allocated for objects of up to 16 keys.
func mayHaveDuplicates(v *fastjson.Value) bool {
	switch v.Type() {
	case fastjson.TypeObject:
		o, _ := v.Object()
		if objectMayHaveDuplicates(o) {
			return true
		}
		found := false
		o.Visit(func(_ []byte, c *fastjson.Value) {
			if !found && nested(c) {
				found = mayHaveDuplicates(c)
			}
		})
		return found
	case fastjson.TypeArray:
		a, _ := v.Array()
		for _, c := range a {
			if nested(c) && mayHaveDuplicates(c) {
				return true
			}
		}
	}
	return false
}

func nested(v *fastjson.Value) bool {
	t := v.Type()
	return t == fastjson.TypeObject || t == fastjson.TypeArray
}

func objectMayHaveDuplicates(o *fastjson.Object) bool {
	n := o.Len()
	if n < 2 {
		return false
	}
	var small [16][]byte
	var seen map[string]struct{}
	keys, i, dup := small[:0], 0, false
	if n > len(small) {
		seen = make(map[string]struct{}, min(n, 1024)) // grown as needed: n is the client's
	}
	// The key slices point into the parser's memory, which stays put
	// until the parser is reused, after this call.
	o.Visit(func(k []byte, _ *fastjson.Value) {
		i++
		if dup {
			return
		}
		if !plainKey(k) {
			dup = true
			return
		}
		if seen != nil {
			if _, ok := seen[string(k)]; ok {
				dup = true
			}
			seen[string(k)] = struct{}{}
			return
		}
		for _, p := range keys {
			if string(p) == string(k) {
				dup = true
				return
			}
		}
		keys = append(keys, k)
	})
	return dup
}

// plainKey: an unescaped key whose bytes are its text.
func plainKey(k []byte) bool {
	for _, c := range k {
		if c == '\\' || c >= utf8.RuneSelf {
			return utf8.Valid(k) && !strings.Contains(string(k), `\`)
		}
	}
	return true
}

// resolveDuplicates reads body (valid JSON, nested at most fastjson's
// MaxDepth) exactly as Python's json does and returns it written anew
// with every duplicate key resolved (DuplicatesLast: the last value at
// the first key's place; every other byte as it came), dup reporting
// whether there was one; under DuplicatesRefuse it returns the first
// duplicate as a *BodyError instead. Keys compare as Python's do: after
// unescaping, a \u surrogate pair joined, a lone surrogate kept. The body
// is read once into a tree of spans (a part with nothing rewritten in it
// is one span) and written once: linear in its size at any depth (a
// 16 MiB body nested 290 deep with a duplicate at each level: 65-85 ms; one
// object of 2.8 million repeats of a key: as long again as fastjson's own
// parse of it, about 1-2 s on a loaded 2-core machine).
func resolveDuplicates(body []byte, mode DuplicateKeys) (out []byte, dup bool, err error) {
	r := resolver{b: body, refuse: mode == DuplicatesRefuse}
	n, _, err := r.value(0, nil)
	if err != nil || !r.dup {
		return nil, false, err
	}
	return r.write(make([]byte, 0, len(body)), &n), true, nil
}

type resolver struct {
	b      []byte
	refuse bool
	dup    bool
}

// node is a value resolved: the body's bytes [start, end) as they are, or
// (kind object or array) its parts when something in it was rewritten:
// an array's parts are elements or runs of them written as they came, an
// object's are its members' values, keys[i] the quoted key of parts[i].
type node struct {
	start, end int
	kind       byte // 0: as it came, '{' or '['
	keys       [][2]int
	parts      []node
}

func (r *resolver) write(out []byte, n *node) []byte {
	if n.kind == 0 {
		return append(out, r.b[n.start:n.end]...)
	}
	out = append(out, n.kind)
	for i := range n.parts {
		if i > 0 {
			out = append(out, ',')
		}
		if n.kind == '{' {
			out = append(append(out, r.b[n.keys[i][0]:n.keys[i][1]]...), ':')
		}
		out = r.write(out, &n.parts[i])
	}
	if n.kind == '{' {
		return append(out, '}')
	}
	return append(out, ']')
}

// pathElem is one step of a path: a key, or an index when key is nil.
type pathElem struct {
	key   *string
	index int
}

// jsonPath writes a path as JSONPath: $.messages[1].role, $["a b"].
func jsonPath(p []pathElem) string {
	var sb strings.Builder
	sb.WriteByte('$')
	for _, e := range p {
		switch {
		case e.key == nil:
			sb.WriteString("[" + strconv.Itoa(e.index) + "]")
		case identifier(*e.key):
			sb.WriteString("." + *e.key)
		default:
			sb.WriteString("[" + quoteKey(*e.key) + "]")
		}
	}
	return sb.String()
}

// quoteKey quotes a key for a message, clipped: a client's key may be
// megabytes long.
func quoteKey(k string) string {
	if len(k) > 64 {
		return strconv.Quote(k[:64]) + "…"
	}
	return strconv.Quote(k)
}

func identifier(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i, c := range []byte(s) {
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// step is path one step down, kept only when refusing: nothing else
// names a path.
func (r *resolver) step(path []pathElem, e pathElem) []pathElem {
	if !r.refuse {
		return nil
	}
	return append(path, e)
}

func (r *resolver) ws(i int) int {
	for i < len(r.b) && (r.b[i] == ' ' || r.b[i] == '\t' || r.b[i] == '\n' || r.b[i] == '\r') {
		i++
	}
	return i
}

// value resolves the value at b[i:] and returns the index after it.
func (r *resolver) value(i int, path []pathElem) (node, int, error) {
	i = r.ws(i)
	switch r.b[i] {
	case '{':
		return r.object(i, path)
	case '[':
		return r.array(i, path)
	case '"':
		end := r.stringEnd(i)
		return node{start: i, end: end}, end, nil
	}
	start := i
	for i < len(r.b) && !strings.ContainsRune(" \t\r\n,]}", rune(r.b[i])) {
		i++
	}
	return node{start: start, end: i}, i, nil
}

func (r *resolver) array(i int, path []pathElem) (node, int, error) {
	start := i
	var parts []node
	run := node{start: -1} // elements as they came, not yet in parts
	i = r.ws(i + 1)
	for n := 0; r.b[i] != ']'; n++ {
		e, next, err := r.value(i, r.step(path, pathElem{index: n}))
		if err != nil {
			return node{}, 0, err
		}
		switch {
		case e.kind != 0:
			if run.start >= 0 {
				parts, run.start = append(parts, run), -1
			}
			parts = append(parts, e)
		case run.start < 0:
			run = e
		default:
			run.end = e.end // the bytes between are a comma and spaces
		}
		if i = r.ws(next); r.b[i] == ',' {
			i = r.ws(i + 1)
		}
	}
	if parts == nil {
		return node{start: start, end: i + 1}, i + 1, nil
	}
	if run.start >= 0 {
		parts = append(parts, run)
	}
	return node{kind: '[', parts: parts}, i + 1, nil
}

// member is one key of an object being resolved, with its last value.
type member struct {
	key  string
	span [2]int // the key as first written, quoted
	val  node
}

func (r *resolver) object(i int, path []pathElem) (node, int, error) {
	start := i
	var members []member
	var index map[string]int
	rewritten := false
	i = r.ws(i + 1)
	for r.b[i] != '}' {
		kend := r.stringEnd(i)
		key := pyKey(r.b[i+1 : kend-1])
		first, seen := -1, false
		if index != nil {
			first, seen = index[key]
		} else {
			for j := range members {
				if members[j].key == key {
					first, seen = j, true
					break
				}
			}
		}
		if seen && r.refuse {
			return node{}, 0, &BodyError{ReasonDuplicateKey, fmt.Sprintf("duplicate key %s (at %s): a key may appear once in an object", quoteKey(key), jsonPath(append(path, pathElem{key: &key})))}
		}
		v, next, err := r.value(r.ws(r.ws(kend)+1), r.step(path, pathElem{key: &key}))
		if err != nil {
			return node{}, 0, err
		}
		rewritten = rewritten || v.kind != 0
		switch {
		case seen: // Python's dict: the key keeps its place, the value is the last
			r.dup, rewritten = true, true
			members[first].val = v
		default:
			if index == nil && len(members) >= 16 {
				index = make(map[string]int, 2*len(members))
				for j, p := range members {
					index[p.key] = j
				}
			}
			if index != nil {
				index[key] = len(members)
			}
			members = append(members, member{key: key, span: [2]int{i, kend}, val: v})
		}
		if i = r.ws(next); r.b[i] == ',' {
			i = r.ws(i + 1)
		}
	}
	if !rewritten {
		return node{start: start, end: i + 1}, i + 1, nil
	}
	// Each key once, at its first place (spelt as first written), with its
	// last value.
	n := node{kind: '{', keys: make([][2]int, len(members)), parts: make([]node, len(members))}
	for j, m := range members {
		n.keys[j], n.parts[j] = m.span, m.val
	}
	return n, i + 1, nil
}

// stringEnd is the index after the string that starts at b[i] ('"').
func (r *resolver) stringEnd(i int) int {
	for j := i + 1; j < len(r.b); j++ {
		switch r.b[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
	return len(r.b)
}

// pyKey is a key's text as Python's json reads it (its string's code
// points, as WTF-8 so that a lone surrogate is kept distinct): escapes
// decoded, a \u high surrogate followed by a \u low one joined
// (json.scanner's py_scanstring), any other surrogate kept alone, raw
// bytes as they are (Python decodes the body with surrogatepass).
func pyKey(s []byte) string {
	if !strings.Contains(string(s), `\`) {
		return string(s)
	}
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' || i+1 >= len(s) {
			out = append(out, s[i])
			continue
		}
		i++
		switch c := s[i]; c {
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			u := hex4(s[i+1:])
			i += 4
			if u >= 0xd800 && u < 0xdc00 && i+6 < len(s) && s[i+1] == '\\' && s[i+2] == 'u' {
				if lo := hex4(s[i+3:]); lo >= 0xdc00 && lo < 0xe000 {
					out = utf8.AppendRune(out, 0x10000+(u-0xd800)<<10+(lo-0xdc00))
					i += 6
					continue
				}
			}
			out = appendWTF8(out, u)
		default: // " \ /
			out = append(out, c)
		}
	}
	return string(out)
}

func hex4(s []byte) rune {
	if len(s) < 4 {
		return -1
	}
	n, err := strconv.ParseUint(string(s[:4]), 16, 16)
	if err != nil {
		return -1
	}
	return rune(n)
}

// appendWTF8 appends a code point below 0x10000, a surrogate included.
func appendWTF8(b []byte, r rune) []byte {
	if r < 0xd800 || r >= 0xe000 {
		return utf8.AppendRune(b, r)
	}
	return append(b, 0xe0|byte(r>>12), 0x80|byte(r>>6)&0x3f, 0x80|byte(r)&0x3f)
}
