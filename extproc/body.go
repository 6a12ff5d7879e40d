package extproc

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"unicode/utf8"

	"github.com/valyala/fastjson"

	"github.com/kvgate/kvgate/globalrouter"
)

// bodyError is a request body the server refuses with 400; reason goes in
// x-kvgate-dropped-reason.
type bodyError struct {
	reason string
	msg    string
}

func (e *bodyError) Error() string { return e.msg }

// Dropped reasons of body errors.
const (
	reasonBadJSON      = "bad_json"
	reasonMissingField = "missing_field"
	reasonBadField     = "bad_field"
)

// parsers parse request bodies; fastjson validates and parses an 8 KB
// body several times faster than encoding/json, which matters on a path
// whose floor is tokenizing.
var parsers fastjson.ParserPool

// chatPath and completionsPath say which field a path requires; other
// configured inference paths accept either.
const (
	completionsPath = "/v1/completions"
	chatPath        = "/v1/chat/completions"
)

// parsedBody is what parseBody reads beside what goes into the Request.
type parsedBody struct {
	stream bool
}

// parseBody decodes an OpenAI completions or chat completions body once
// and fills req's Model and exactly one of Prompt, PromptTokens or
// Messages; every other field is left alone (the body is re-emitted as it
// came). Errors are *bodyError. Strings are made valid UTF-8 as
// encoding/json would; of duplicate keys the first counts.
func parseBody(path string, body []byte, req *globalrouter.Request) (parsedBody, error) {
	if err := fastjson.ValidateBytes(body); err != nil {
		return parsedBody{}, &bodyError{reasonBadJSON, "request body is not valid JSON: " + err.Error()}
	}
	p := parsers.Get()
	defer parsers.Put(p)
	v, err := p.ParseBytes(body)
	if err != nil {
		return parsedBody{}, &bodyError{reasonBadJSON, "request body is not valid JSON: " + err.Error()}
	}
	o, err := v.Object()
	if err != nil {
		return parsedBody{}, &bodyError{reasonBadJSON, "request body must be a JSON object"}
	}
	var pb parsedBody
	switch s := o.Get("stream"); {
	case s == nil || s.Type() == fastjson.TypeNull || s.Type() == fastjson.TypeFalse:
	case s.Type() == fastjson.TypeTrue:
		pb.stream = true
	default:
		return parsedBody{}, &bodyError{reasonBadField, "stream must be a boolean"}
	}
	model := o.Get("model")
	if model == nil || model.Type() == fastjson.TypeNull {
		return parsedBody{}, &bodyError{reasonMissingField, "missing required field: model"}
	}
	if model.Type() != fastjson.TypeString {
		return parsedBody{}, &bodyError{reasonBadField, "model must be a string"}
	}
	if req.Model = str(model); req.Model == "" {
		return parsedBody{}, &bodyError{reasonMissingField, "missing required field: model"}
	}
	prompt, messages := present(o.Get("prompt")), present(o.Get("messages"))
	switch {
	case path == chatPath || (path != completionsPath && messages != nil):
		if messages == nil {
			return parsedBody{}, &bodyError{reasonMissingField, "missing required field: messages"}
		}
		if err := parseMessages(messages, req); err != nil {
			return parsedBody{}, &bodyError{reasonBadField, "messages" + err.Error()}
		}
	case path == completionsPath || prompt != nil:
		if prompt == nil {
			return parsedBody{}, &bodyError{reasonMissingField, "missing required field: prompt"}
		}
		if err := parsePrompt(prompt, req); err != nil {
			return parsedBody{}, &bodyError{reasonBadField, "prompt: " + err.Error()}
		}
	default:
		return parsedBody{}, &bodyError{reasonMissingField, "missing required field: prompt or messages"}
	}
	return pb, nil
}

// present is v, or nil for an absent or null field.
func present(v *fastjson.Value) *fastjson.Value {
	if v == nil || v.Type() == fastjson.TypeNull {
		return nil
	}
	return v
}

// str copies a string value out of the parser's memory, valid UTF-8.
func str(v *fastjson.Value) string {
	b := v.GetStringBytes()
	if utf8.Valid(b) {
		return string(b)
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}

func parseMessages(v *fastjson.Value, req *globalrouter.Request) error {
	arr, err := v.Array()
	if err != nil {
		return errors.New(" must be a list of messages")
	}
	if len(arr) == 0 {
		return errors.New(" must not be empty")
	}
	req.Messages = make([]globalrouter.Message, len(arr))
	for i, m := range arr {
		if m.Type() != fastjson.TypeObject {
			return fmt.Errorf("[%d]: must be an object", i)
		}
		if r := present(m.Get("role")); r != nil {
			if r.Type() != fastjson.TypeString {
				return fmt.Errorf("[%d].role: must be a string", i)
			}
			req.Messages[i].Role = str(r)
		}
		text, err := contentText(present(m.Get("content")))
		if err != nil {
			return fmt.Errorf("[%d].content: %v", i, err)
		}
		req.Messages[i].Content = text
	}
	return nil
}

// parsePrompt accepts the OpenAI prompt forms that describe one request:
// a string, a list of token ids, or a one-element list of either.
func parsePrompt(v *fastjson.Value, req *globalrouter.Request) error {
	switch v.Type() {
	case fastjson.TypeString:
		s := str(v)
		if s == "" {
			return errors.New("must not be empty")
		}
		req.Prompt = s
		return nil
	case fastjson.TypeArray:
	default:
		return errors.New("must be a string, a list of token ids, or a one-element list of either")
	}
	items, _ := v.Array()
	if len(items) == 0 {
		return errors.New("must not be empty")
	}
	if t := items[0].Type(); t == fastjson.TypeString || t == fastjson.TypeArray {
		if len(items) != 1 {
			return fmt.Errorf("a batch of %d prompts cannot be routed as one request; send one prompt per request", len(items))
		}
		return parsePrompt(items[0], req)
	}
	toks := make([]uint32, len(items))
	for i, it := range items {
		n, err := it.Uint64()
		if it.Type() != fastjson.TypeNumber || err != nil || n > math.MaxUint32 {
			return fmt.Errorf("[%d]: want a token id (0..%d), got %s", i, uint32(math.MaxUint32), clip([]byte(it.String()), 32))
		}
		toks[i] = uint32(n)
	}
	req.PromptTokens = toks
	return nil
}

// contentText flattens a chat message's content: a string, null, or a list
// of parts whose text parts are joined (images and other parts carry no
// prefix the router can use).
func contentText(v *fastjson.Value) (string, error) {
	if v == nil {
		return "", nil
	}
	switch v.Type() {
	case fastjson.TypeString:
		return str(v), nil
	case fastjson.TypeArray:
		parts, _ := v.Array()
		var sb strings.Builder
		for i, p := range parts {
			if p.Type() != fastjson.TypeObject {
				return "", fmt.Errorf("part %d: must be an object", i)
			}
			if t := p.Get("type"); t == nil || (string(t.GetStringBytes()) != "text" && string(t.GetStringBytes()) != "input_text") {
				continue
			}
			text := p.Get("text")
			if text == nil || text.Type() != fastjson.TypeString {
				return "", fmt.Errorf("part %d: text must be a string", i)
			}
			sb.WriteString(str(text))
		}
		return sb.String(), nil
	default:
		return "", errors.New("must be a string or a list of content parts")
	}
}

func clip(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}
