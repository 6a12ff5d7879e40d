package tokenizer

import (
	"errors"
	"fmt"

	"github.com/valyala/fastjson"
)

// The Responses API and Anthropic messages, turned into the chat
// completions form that the engines serving them render through the chat
// template (vLLM's serving_responses and Anthropic front ends).

// responses reads a Responses API body: instructions become the system
// message, input a string (one user message) or a list of items: messages
// (content as text or parts), function_call items (an assistant turn's
// tool call), function_call_output items (a tool message); reasoning and
// other items carry no prompt text and are skipped. Function tools become
// chat completions tools.
func (p *bodyParser) responses(o *fastjson.Object) (*ChatRequest, error) {
	c := &ChatRequest{AddGenerationPrompt: true}
	instr, err := optString(o, "instructions")
	if err != nil {
		return nil, err
	}
	if instr != "" {
		c.Messages = append(c.Messages, Message{Role: "system", Content: instr})
	}
	input := o.Get("input")
	switch input.Type() {
	case fastjson.TypeString:
		c.Messages = append(c.Messages, Message{Role: "user", Content: str(input)})
	case fastjson.TypeArray:
		items, _ := input.Array()
		if len(items) == 0 {
			return nil, errors.New("input: must not be empty")
		}
		for i, it := range items {
			if err := p.responsesItem(it, c); err != nil {
				return nil, fmt.Errorf("input[%d]%v", i, err)
			}
		}
	default:
		return nil, errors.New("input: must be a string or a list of items")
	}
	if len(c.Messages) == 0 {
		return nil, errors.New("input: no message in it")
	}
	if err := readTools(o, c, "parameters", true); err != nil {
		return nil, err
	}
	return c, nil
}

// readTools sets c.Tools from o's "tools", a list of tool objects whose
// JSON schema stands under schemaKey ("parameters" in the Responses API,
// "input_schema" in Anthropic's); with functionsOnly, tools whose type is
// not "function" (built-in tools: web_search, ...) render nothing. It sets
// c.ToolChoice from "tool_choice", as given.
func readTools(o *fastjson.Object, c *ChatRequest, schemaKey string, functionsOnly bool) error {
	if v := present(o.Get("tools")); v != nil {
		tools, err := v.Array()
		if err != nil {
			return errors.New("tools: must be a list")
		}
		var out []byte
		for i, t := range tools {
			to, err := t.Object()
			if err != nil {
				return fmt.Errorf("tools[%d]: must be an object", i)
			}
			if functionsOnly && string(to.Get("type").GetStringBytes()) != "function" {
				continue
			}
			out = appendTool(out, to, schemaKey)
		}
		c.Tools = closeList(out)
	}
	if v := present(o.Get("tool_choice")); v != nil {
		c.ToolChoice = raw(v)
	}
	return nil
}

func (p *bodyParser) responsesItem(v *fastjson.Value, c *ChatRequest) error {
	o, err := v.Object()
	if err != nil {
		return errors.New(": must be an object")
	}
	typ, err := optString(o, "type")
	if err != nil {
		return errors.New("." + err.Error())
	}
	switch typ {
	case "", "message":
		var m Message
		if err := p.parseMessage(v, &m); err != nil {
			return err
		}
		if m.Role == "" {
			return errors.New(".role: missing")
		}
		c.Messages = append(c.Messages, m)
	case "function_call":
		name, err := optString(o, "name")
		if err != nil {
			return errors.New("." + err.Error())
		}
		id, err := optString(o, "call_id")
		if err != nil {
			return errors.New("." + err.Error())
		}
		call := ToolCall{ID: id, Type: "function", Function: FunctionCall{Name: name, Arguments: arguments(present(o.Get("arguments")))}}
		// Consecutive calls belong to one assistant turn.
		if n := len(c.Messages); n > 0 && c.Messages[n-1].Role == "assistant" && len(c.Messages[n-1].ToolCalls) > 0 {
			c.Messages[n-1].ToolCalls = append(c.Messages[n-1].ToolCalls, call)
		} else {
			c.Messages = append(c.Messages, Message{Role: "assistant", NullContent: true, ToolCalls: []ToolCall{call}})
		}
	case "function_call_output":
		id, err := optString(o, "call_id")
		if err != nil {
			return errors.New("." + err.Error())
		}
		out := present(o.Get("output"))
		text, err := p.content(out)
		if err != nil {
			return fmt.Errorf(".output: %v", err)
		}
		c.Messages = append(c.Messages, Message{Role: "tool", ToolCallID: id, Content: text})
	}
	return nil
}

// anthropic reads an Anthropic messages body.
func (p *bodyParser) anthropic(o *fastjson.Object) (*ChatRequest, error) {
	c := &ChatRequest{AddGenerationPrompt: true}
	if sys := present(o.Get("system")); sys != nil {
		text, err := p.anthropicText(sys)
		if err != nil {
			return nil, fmt.Errorf("system: %v", err)
		}
		c.Messages = append(c.Messages, Message{Role: "system", Content: text})
	}
	arr, err := o.Get("messages").Array()
	if err != nil {
		return nil, errors.New("messages: must be a list of messages")
	}
	if len(arr) == 0 {
		return nil, errors.New("messages: must not be empty")
	}
	for i, mv := range arr {
		if err := p.anthropicMessage(mv, c); err != nil {
			return nil, fmt.Errorf("messages[%d]%v", i, err)
		}
	}
	if len(c.Messages) == 0 {
		return nil, errors.New("messages: no content in them")
	}
	if err := readTools(o, c, "input_schema", false); err != nil {
		return nil, err
	}
	return c, nil
}

// anthropicText reads a string or a list of text blocks.
func (p *bodyParser) anthropicText(v *fastjson.Value) (string, error) {
	if v.Type() == fastjson.TypeString {
		return str(v), nil
	}
	return p.content(v)
}

// anthropicMessage appends one Anthropic message: its text and images as
// one message, its tool_use blocks as the assistant's tool calls, each
// tool_result block as a tool message ahead of the user's remaining text.
func (p *bodyParser) anthropicMessage(v *fastjson.Value, c *ChatRequest) error {
	o, err := v.Object()
	if err != nil {
		return errors.New(": must be an object")
	}
	role, err := optString(o, "role")
	if err != nil {
		return errors.New("." + err.Error())
	}
	cv := present(o.Get("content"))
	if cv == nil {
		return errors.New(".content: missing")
	}
	if cv.Type() == fastjson.TypeString {
		c.Messages = append(c.Messages, Message{Role: role, Content: str(cv)})
		return nil
	}
	blocks, err := cv.Array()
	if err != nil {
		return errors.New(".content: must be a string or a list of blocks")
	}
	m := Message{Role: role}
	var texts, media, hashes []string
	for j, b := range blocks {
		bo, err := b.Object()
		if err != nil {
			return fmt.Errorf(".content[%d]: must be an object", j)
		}
		switch typ := string(bo.Get("type").GetStringBytes()); typ {
		case "text":
			t := bo.Get("text")
			if t == nil || t.Type() != fastjson.TypeString {
				return fmt.Errorf(".content[%d].text: must be a string", j)
			}
			texts = append(texts, str(t))
		case "image", "document":
			media = append(media, DefaultImagePlaceholder)
			// After the tool results' media: their messages come first.
			hashes = append(hashes, mediaHash(b))
		case "thinking":
			if t := bo.Get("thinking"); t != nil && t.Type() == fastjson.TypeString {
				m.ReasoningContent = str(t)
			}
		case "tool_use":
			id, _ := optString(bo, "id")
			name, err := optString(bo, "name")
			if err != nil {
				return fmt.Errorf(".content[%d].%v", j, err)
			}
			m.ToolCalls = append(m.ToolCalls, ToolCall{ID: id, Type: "function", Function: FunctionCall{Name: name, Arguments: arguments(present(bo.Get("input")))}})
		case "tool_result":
			id, _ := optString(bo, "tool_use_id")
			var text string
			if rc := present(bo.Get("content")); rc != nil {
				if text, err = p.anthropicText(rc); err != nil {
					return fmt.Errorf(".content[%d].content: %v", j, err)
				}
			}
			c.Messages = append(c.Messages, Message{Role: "tool", ToolCallID: id, Content: text})
		}
	}
	p.mm = append(p.mm, hashes...)
	if len(texts)+len(media) == 0 && len(m.ToolCalls) == 0 && m.ReasoningContent == "" {
		return nil // only tool results
	}
	m.Content = joinParts(append(media, texts...))
	m.NullContent = len(texts)+len(media) == 0
	c.Messages = append(c.Messages, m)
	return nil
}

// appendTool appends a flat tool ({name, description, <schema>}) in the
// chat completions form to a JSON list being built.
func appendTool(out []byte, t *fastjson.Object, schemaKey string) []byte {
	if len(out) == 0 {
		out = append(out, '[')
	} else {
		out = append(out, ',')
	}
	out = append(out, `{"type":"function","function":{"name":`...)
	out = append(out, raw(orEmpty(t.Get("name")))...)
	if d := present(t.Get("description")); d != nil {
		out = append(out, `,"description":`...)
		out = append(out, raw(d)...)
	}
	if s := present(t.Get(schemaKey)); s != nil {
		out = append(out, `,"parameters":`...)
		out = append(out, raw(s)...)
	}
	return append(out, "}}"...)
}

var emptyString = fastjson.MustParse(`""`)

func orEmpty(v *fastjson.Value) *fastjson.Value {
	if v == nil || v.Type() != fastjson.TypeString {
		return emptyString
	}
	return v
}

func closeList(out []byte) []byte {
	if len(out) == 0 {
		return nil
	}
	return append(out, ']')
}
