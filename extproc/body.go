package extproc

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

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

// openAIBody is the part of an OpenAI completions / chat completions body
// the router reads. Everything else is left alone (the body is re-emitted
// as it came).
type openAIBody struct {
	Model    string          `json:"model"`
	Prompt   json.RawMessage `json:"prompt"`
	Messages []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	Stream bool `json:"stream"`
}

// parsedBody is what parseBody extracts into req.
type parsedBody struct {
	stream bool
}

// chatPath and completionsPath say which field a path requires; other
// configured inference paths accept either.
const (
	completionsPath = "/v1/completions"
	chatPath        = "/v1/chat/completions"
)

// parseBody decodes an OpenAI request body once and fills req's Model and
// exactly one of Prompt, PromptTokens or Messages. Errors are *bodyError.
func parseBody(path string, body []byte, req *globalrouter.Request) (parsedBody, error) {
	var b openAIBody
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&b); err != nil {
		return parsedBody{}, &bodyError{reasonBadJSON, "request body is not valid JSON: " + jsonErr(err)}
	}
	if trailingGarbage(dec) {
		return parsedBody{}, &bodyError{reasonBadJSON, "request body is not valid JSON: data after the top-level value"}
	}
	if b.Model == "" {
		return parsedBody{}, &bodyError{reasonMissingField, "missing required field: model"}
	}
	req.Model = b.Model
	hasPrompt := len(b.Prompt) > 0 && !bytes.Equal(b.Prompt, []byte("null"))
	hasMessages := b.Messages != nil
	switch {
	case path == chatPath || (path != completionsPath && hasMessages):
		if !hasMessages {
			return parsedBody{}, &bodyError{reasonMissingField, "missing required field: messages"}
		}
		if len(b.Messages) == 0 {
			return parsedBody{}, &bodyError{reasonBadField, "messages must not be empty"}
		}
		req.Messages = make([]globalrouter.Message, len(b.Messages))
		for i, m := range b.Messages {
			text, err := contentText(m.Content)
			if err != nil {
				return parsedBody{}, &bodyError{reasonBadField, fmt.Sprintf("messages[%d].content: %v", i, err)}
			}
			req.Messages[i] = globalrouter.Message{Role: m.Role, Content: text}
		}
	case path == completionsPath || hasPrompt:
		if !hasPrompt {
			return parsedBody{}, &bodyError{reasonMissingField, "missing required field: prompt"}
		}
		if err := parsePrompt(b.Prompt, req); err != nil {
			return parsedBody{}, &bodyError{reasonBadField, "prompt: " + err.Error()}
		}
	default:
		return parsedBody{}, &bodyError{reasonMissingField, "missing required field: prompt or messages"}
	}
	return parsedBody{stream: b.Stream}, nil
}

// trailingGarbage reports whether anything but white space follows the
// first JSON value.
func trailingGarbage(dec *json.Decoder) bool {
	var extra json.RawMessage
	return dec.Decode(&extra) != io.EOF
}

// parsePrompt accepts the OpenAI prompt forms that describe one request:
// a string, a list of token ids, or a one-element list of either.
func parsePrompt(raw json.RawMessage, req *globalrouter.Request) error {
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return errors.New(jsonErr(err))
		}
		if s == "" {
			return errors.New("must not be empty")
		}
		req.Prompt = s
		return nil
	case '[':
	default:
		return errors.New("must be a string, a list of token ids, or a one-element list of either")
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return errors.New(jsonErr(err))
	}
	if len(items) == 0 {
		return errors.New("must not be empty")
	}
	if first := bytes.TrimSpace(items[0]); len(first) > 0 && (first[0] == '"' || first[0] == '[') {
		if len(items) != 1 {
			return fmt.Errorf("a batch of %d prompts cannot be routed as one request; send one prompt per request", len(items))
		}
		return parsePrompt(first, req)
	}
	toks := make([]uint32, 0, len(items))
	for i, it := range items {
		var t uint32
		if err := json.Unmarshal(it, &t); err != nil {
			return fmt.Errorf("[%d]: want a token id (0..%d), got %s", i, uint32(1<<32-1), clip(it, 32))
		}
		toks = append(toks, t)
	}
	req.PromptTokens = toks
	return nil
}

// contentText flattens a chat message's content: a string, null, or a list
// of parts whose text parts are joined (images and other parts carry no
// prefix the router can use).
func contentText(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return "", nil
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", errors.New(jsonErr(err))
		}
		return s, nil
	case '[':
		var parts []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		if err := json.Unmarshal(raw, &parts); err != nil {
			return "", errors.New(jsonErr(err))
		}
		var sb strings.Builder
		for _, p := range parts {
			if p.Type == "text" || p.Type == "input_text" {
				sb.WriteString(p.Text)
			}
		}
		return sb.String(), nil
	default:
		return "", errors.New("must be a string or a list of content parts")
	}
}

// jsonErr shortens encoding/json's messages for a client.
func jsonErr(err error) string {
	return strings.TrimPrefix(err.Error(), "json: ")
}

func clip(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}
