package tokenizer

import (
	"errors"
	"math"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/nikolalohinski/gonja/v2/builtins"
	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/valyala/fastjson"
)

// What the Jinja renderer hands a chat template, and how it prints JSON:
// as transformers' apply_chat_template (which vLLM calls) does.
//
//   - messages are the conversation as vLLM's chat_utils leaves it: role
//     and content (a string; null content becomes ""), name, an assistant's
//     tool_calls with their arguments parsed to objects and its reasoning
//     as both reasoning and reasoning_content, a tool message's
//     tool_call_id;
//   - tools (None without), add_generation_prompt, the special tokens, then
//     chat_template_kwargs over them;
//   - JSON objects keep the client's key order (Python dicts do), so
//     `tool | tojson` prints what the engine prints;
//   - tojson is json.dumps(x, ensure_ascii=False, indent=None,
//     separators=None, sort_keys=False), the filter transformers installs:
//     ", " and ": " separators (",", ": " with an indent), non-ASCII
//     unescaped, "<>&'" unescaped, floats as Python prints them.

// chatFilters are gonja's filters with tojson replaced.
var chatFilters = func() *exec.FilterSet {
	fs := exec.NewFilterSet(map[string]exec.FilterFunction{}).Update(builtins.Filters)
	if err := fs.Replace("tojson", filterPyJSON); err != nil {
		panic(err)
	}
	return fs
}()

// bigInt is a JSON integer beyond int64, printed by tojson as written
// (Python's int is unbounded).
type bigInt string

// chatTests are gonja's tests with "true" and "false" as Jinja's: the
// value is the boolean (gonja tests truthiness, so `enable_thinking is
// false` would hold for 0, "" or None).
var chatTests = func() *exec.TestSet {
	ts := exec.NewTestSet(map[string]exec.TestFunction{}).Update(builtins.Tests)
	for name, want := range map[string]bool{"true": true, "false": false} {
		want := want
		if err := ts.Replace(name, func(_ *exec.Context, in *exec.Value, _ *exec.VarArgs) (bool, error) {
			b, ok := in.Interface().(bool)
			return ok && b == want, nil
		}); err != nil {
			panic(err)
		}
	}
	return ts
}()

// jsonValue turns raw JSON into a template value: objects become ordered
// exec.Dict values, arrays []any, integers int64, other numbers float64.
func jsonValue(data []byte) any {
	if len(data) == 0 {
		return nil
	}
	var p fastjson.Parser
	v, err := p.ParseBytes(data)
	if err != nil {
		return string(data)
	}
	return fromFastJSON(v)
}

func fromFastJSON(v *fastjson.Value) any {
	switch v.Type() {
	case fastjson.TypeObject:
		o, _ := v.Object()
		d := exec.Dict{Pairs: make([]*exec.Pair, 0, o.Len())}
		var seen map[string]int
		o.Visit(func(k []byte, val *fastjson.Value) {
			key := sanitizeUTF8(string(k))
			x := exec.AsValue(fromFastJSON(val))
			// Of duplicate keys, Python's json.loads (the engine's) keeps
			// the first one's place and the last one's value.
			if i, dup := seen[key]; dup {
				d.Pairs[i].Value = x
				return
			}
			if o.Len() > 1 {
				if seen == nil {
					seen = make(map[string]int, o.Len())
				}
				seen[key] = len(d.Pairs)
			}
			d.Pairs = append(d.Pairs, &exec.Pair{Key: exec.AsValue(key), Value: x})
		})
		return d
	case fastjson.TypeArray:
		arr, _ := v.Array()
		out := make([]any, len(arr))
		for i, x := range arr {
			out[i] = fromFastJSON(x)
		}
		return out
	case fastjson.TypeString:
		return str(v)
	case fastjson.TypeNumber:
		lit := string(v.MarshalTo(nil))
		if !strings.ContainsAny(lit, ".eE") {
			if n, err := strconv.ParseInt(lit, 10, 64); err == nil {
				return n
			}
			return bigInt(strings.TrimPrefix(lit, "-0")) // Python's int has no bound
		}
		f, _ := v.Float64()
		return f
	case fastjson.TypeTrue:
		return true
	case fastjson.TypeFalse:
		return false
	}
	return nil
}

func dict(pairs ...any) exec.Dict {
	d := exec.Dict{Pairs: make([]*exec.Pair, 0, len(pairs)/2)}
	for i := 0; i+1 < len(pairs); i += 2 {
		d.Pairs = append(d.Pairs, &exec.Pair{Key: exec.AsValue(pairs[i]), Value: exec.AsValue(pairs[i+1])})
	}
	return d
}

// templateMessages is the conversation as vLLM passes it to the template.
func templateMessages(messages []Message) []any {
	out := make([]any, len(messages))
	for i, m := range messages {
		pairs := []any{"role", m.Role, "content", m.Content}
		if m.Role == "assistant" {
			if len(m.ToolCalls) > 0 {
				calls := make([]any, len(m.ToolCalls))
				for j, c := range m.ToolCalls {
					var cp []any
					if c.ID != "" {
						cp = append(cp, "id", c.ID)
					}
					args := jsonValue(c.Function.Arguments)
					if args == nil {
						args = exec.Dict{}
					}
					cp = append(cp, "type", c.Type, "function", dict("name", c.Function.Name, "arguments", args))
					calls[j] = dict(cp...)
				}
				pairs = append(pairs, "tool_calls", calls)
			}
			if m.ReasoningContent != "" {
				pairs = append(pairs, "reasoning", m.ReasoningContent, "reasoning_content", m.ReasoningContent)
			}
		}
		if m.Role == "tool" && m.ToolCallID != "" {
			pairs = append(pairs, "tool_call_id", m.ToolCallID)
		}
		if m.Name != "" {
			pairs = append(pairs, "name", m.Name)
		}
		out[i] = dict(pairs...)
	}
	return out
}

// templateData is the context of one render.
func (c *chatTemplate) templateData(req *ChatRequest) map[string]any {
	data := make(map[string]any, len(c.vars)+4)
	for k, v := range c.vars {
		data[k] = v
	}
	if kw, ok := jsonValue(req.TemplateKwargs).(exec.Dict); ok {
		for _, p := range kw.Pairs {
			data[p.Key.String()] = p.Value.Interface()
		}
	}
	data["messages"] = templateMessages(req.Messages)
	data["add_generation_prompt"] = req.AddGenerationPrompt && !req.ContinueFinalMessage
	data["tools"] = nil
	if t := jsonValue(req.Tools); t != nil {
		data["tools"] = t
	}
	return data
}

// continueFinal cuts a rendered chat right after the final message's
// (stripped) content, as transformers does for continue_final_message.
func continueFinal(rendered string, messages []Message) (string, error) {
	if len(messages) == 0 {
		return rendered, nil
	}
	final := strings.TrimSpace(messages[len(messages)-1].Content)
	i := strings.LastIndex(rendered, final)
	if i < 0 {
		return "", errors.New("tokenizer: continue_final_message is set but the final message does not appear in the rendered chat")
	}
	return rendered[:i+len(final)], nil
}

// filterPyJSON is tojson as transformers defines it (json.dumps).
func filterPyJSON(_ *exec.Evaluator, in *exec.Value, params *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	o := pyJSONOpts{itemSep: ", ", keySep: ": ", indent: -1}
	if v, ok := params.KwArgs["indent"]; ok && !v.IsNil() {
		switch {
		case v.IsInteger():
			o.indent = v.Integer()
		case v.IsString():
			o.indentStr, o.indent = v.String(), 0
		default:
			return exec.AsValue(errors.New("tojson: indent must be an integer or a string"))
		}
		o.itemSep = ","
	}
	if len(params.Args) > 0 && params.Args[0].IsInteger() { // tojson(2)
		o.indent, o.itemSep = params.Args[0].Integer(), ","
	}
	if v, ok := params.KwArgs["separators"]; ok && !v.IsNil() {
		if !v.IsList() || v.Len() != 2 {
			return exec.AsValue(errors.New("tojson: separators must be a pair of strings"))
		}
		a, _ := v.GetItem(0)
		b, _ := v.GetItem(1)
		o.itemSep, o.keySep = a.String(), b.String()
	}
	if v, ok := params.KwArgs["sort_keys"]; ok {
		o.sortKeys = v.IsTrue()
	}
	if v, ok := params.KwArgs["ensure_ascii"]; ok {
		o.ascii = v.IsTrue()
	}
	var b strings.Builder
	if err := o.write(&b, in.Interface(), 0); err != nil {
		return exec.AsValue(err)
	}
	return exec.AsSafeValue(b.String())
}

type pyJSONOpts struct {
	itemSep, keySep string
	indent          int // -1: none
	indentStr       string
	sortKeys, ascii bool
}

func (o *pyJSONOpts) newline(b *strings.Builder, depth int) {
	if o.indent < 0 {
		return
	}
	b.WriteByte('\n')
	unit := o.indentStr
	if unit == "" {
		unit = strings.Repeat(" ", o.indent)
	}
	for range depth {
		b.WriteString(unit)
	}
}

// maxJSONDepth bounds recursion over template values.
const maxJSONDepth = 512

func (o *pyJSONOpts) write(b *strings.Builder, v any, depth int) error {
	if depth > maxJSONDepth {
		return errors.New("tojson: value nested too deeply")
	}
	switch x := v.(type) {
	case nil:
		b.WriteString("null")
		return nil
	case *exec.Value:
		return o.write(b, x.Interface(), depth)
	case string:
		pyQuote(b, x, o.ascii)
		return nil
	case bool:
		if x {
			b.WriteString("true")
		} else {
			b.WriteString("false")
		}
		return nil
	case float64:
		b.WriteString(pyFloat(x))
		return nil
	case float32:
		b.WriteString(pyFloat(float64(x)))
		return nil
	case bigInt:
		b.WriteString(string(x))
		return nil
	case exec.Dict:
		return o.writePairs(b, x.Pairs, depth)
	case *exec.Dict:
		return o.writePairs(b, x.Pairs, depth)
	case error:
		return x
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		b.WriteString(strconv.FormatInt(rv.Int(), 10))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		b.WriteString(strconv.FormatUint(rv.Uint(), 10))
	case reflect.Slice, reflect.Array:
		if rv.Len() == 0 {
			b.WriteString("[]")
			return nil
		}
		b.WriteByte('[')
		for i := range rv.Len() {
			if i > 0 {
				b.WriteString(o.itemSep)
			}
			o.newline(b, depth+1)
			if err := o.write(b, rv.Index(i).Interface(), depth+1); err != nil {
				return err
			}
		}
		o.newline(b, depth)
		b.WriteByte(']')
	case reflect.Map:
		pairs := make([]*exec.Pair, 0, rv.Len())
		for _, k := range rv.MapKeys() {
			pairs = append(pairs, &exec.Pair{Key: exec.AsValue(k.Interface()), Value: exec.AsValue(rv.MapIndex(k).Interface())})
		}
		sort.Slice(pairs, func(i, j int) bool { return pairs[i].Key.String() < pairs[j].Key.String() })
		return o.writePairs(b, pairs, depth)
	default:
		pyQuote(b, exec.AsValue(v).String(), o.ascii)
	}
	return nil
}

func (o *pyJSONOpts) writePairs(b *strings.Builder, pairs []*exec.Pair, depth int) error {
	if len(pairs) == 0 {
		b.WriteString("{}")
		return nil
	}
	if o.sortKeys {
		pairs = append([]*exec.Pair(nil), pairs...)
		sort.SliceStable(pairs, func(i, j int) bool { return pairs[i].Key.String() < pairs[j].Key.String() })
	}
	b.WriteByte('{')
	for i, p := range pairs {
		if i > 0 {
			b.WriteString(o.itemSep)
		}
		o.newline(b, depth+1)
		pyQuote(b, p.Key.String(), o.ascii)
		b.WriteString(o.keySep)
		if err := o.write(b, p.Value.Interface(), depth+1); err != nil {
			return err
		}
	}
	o.newline(b, depth)
	b.WriteByte('}')
	return nil
}

// pyQuote writes s as Python's json.dumps does.
func pyQuote(b *strings.Builder, s string, ascii bool) {
	const hex = "0123456789abcdef"
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"':
			b.WriteString(`\"`)
		case r == '\\':
			b.WriteString(`\\`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\b':
			b.WriteString(`\b`)
		case r == '\f':
			b.WriteString(`\f`)
		case r < 0x20 || (ascii && r > 0x7e):
			write := func(u rune) {
				b.WriteString(`\u`)
				b.WriteByte(hex[u>>12&0xf])
				b.WriteByte(hex[u>>8&0xf])
				b.WriteByte(hex[u>>4&0xf])
				b.WriteByte(hex[u&0xf])
			}
			if r > 0xffff {
				r1, r2 := utf16.EncodeRune(r)
				write(r1)
				write(r2)
			} else {
				write(r)
			}
		case r == utf8.RuneError:
			b.WriteRune(r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
}

// pyFloat prints a float as Python's repr (json.dumps uses float.__repr__).
func pyFloat(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	abs := math.Abs(f)
	if abs != 0 && (abs < 1e-4 || abs >= 1e16) {
		s := strconv.FormatFloat(f, 'e', -1, 64)
		return s // Go and Python agree: 1e+16, 1.5e-05
	}
	s := strconv.FormatFloat(f, 'f', -1, 64)
	if !strings.Contains(s, ".") {
		s += ".0"
	}
	return s
}

// writeRaw writes a JSON value as json.dumps writes what json.loads read
// from it, straight from the parsed JSON (the native renderers' tojson):
// objects in key order (of duplicates, the first one's place and the last
// one's value), integers as written, floats as Python prints them.
func (o *pyJSONOpts) writeRaw(b *strings.Builder, v *fastjson.Value, depth int) error {
	if depth > maxJSONDepth {
		return errors.New("tojson: value nested too deeply")
	}
	switch v.Type() {
	case fastjson.TypeObject:
		obj, _ := v.Object()
		if obj.Len() == 0 {
			b.WriteString("{}")
			return nil
		}
		type kv struct {
			k []byte
			v *fastjson.Value
		}
		var buf [16]kv
		pairs := buf[:0]
		obj.Visit(func(k []byte, val *fastjson.Value) {
			for i := range pairs {
				if string(pairs[i].k) == string(k) {
					pairs[i].v = val
					return
				}
			}
			pairs = append(pairs, kv{k, val})
		})
		if o.sortKeys {
			sort.SliceStable(pairs, func(i, j int) bool { return string(pairs[i].k) < string(pairs[j].k) })
		}
		b.WriteByte('{')
		for i, p := range pairs {
			if i > 0 {
				b.WriteString(o.itemSep)
			}
			o.newline(b, depth+1)
			pyQuote(b, sanitizeUTF8(string(p.k)), o.ascii)
			b.WriteString(o.keySep)
			if err := o.writeRaw(b, p.v, depth+1); err != nil {
				return err
			}
		}
		o.newline(b, depth)
		b.WriteByte('}')
	case fastjson.TypeArray:
		arr, _ := v.Array()
		if len(arr) == 0 {
			b.WriteString("[]")
			return nil
		}
		b.WriteByte('[')
		for i, x := range arr {
			if i > 0 {
				b.WriteString(o.itemSep)
			}
			o.newline(b, depth+1)
			if err := o.writeRaw(b, x, depth+1); err != nil {
				return err
			}
		}
		o.newline(b, depth)
		b.WriteByte(']')
	case fastjson.TypeString:
		pyQuote(b, str(v), o.ascii)
	case fastjson.TypeNumber:
		return o.write(b, fromFastJSON(v), depth)
	case fastjson.TypeTrue:
		b.WriteString("true")
	case fastjson.TypeFalse:
		b.WriteString("false")
	default:
		b.WriteString("null")
	}
	return nil
}
