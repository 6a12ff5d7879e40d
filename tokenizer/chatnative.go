package tokenizer

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"

	"github.com/valyala/fastjson"
)

// Native renderers of well-known chat templates. Rendering through the
// Jinja engine (gonja) costs most of a chat's tokenizing time and most of
// its allocations: every "+" builds a new string, every lookup wraps a
// value. A template whose source is, byte for byte, one of those below is
// rendered by plain Go instead. The template is recognised by the SHA-256
// of its source, so an edited template (an operator's override, a model
// revision) goes through gonja as before. chatnative_test.go proves each
// renderer byte-identical to gonja over many generated requests (tools,
// tool calls, reasoning, chat_template_kwargs included); a renderer
// declines (ok false) whatever it does not mirror exactly (a kwarg named
// like a template variable, an empty conversation for Qwen3), and gonja
// renders that.

// nativeRender renders a request as the template would, or reports false.
// continue_final_message is applied by the caller, to either renderer's
// output.
type nativeRender func(req *ChatRequest) (string, bool)

// reservedKwargs are chat_template_kwargs that would stand in for a
// variable the templates read; a request with one goes through gonja.
var reservedKwargs = []string{"messages", "tools", "add_generation_prompt", "bos_token", "eos_token", "unk_token", "pad_token", "documents", "namespace", "raise_exception", "strftime_now"}

// kwargsNative reports whether a request's chat_template_kwargs leave the
// native renderers' variables alone, and the enable_thinking it sets
// (Qwen3 reads it: only a JSON false counts, as "is false" in Jinja).
func kwargsNative(req *ChatRequest) (ok, thinkingOff bool) {
	if len(req.TemplateKwargs) == 0 {
		return true, false
	}
	var p fastjson.Parser
	v, err := p.ParseBytes(req.TemplateKwargs)
	if err != nil || v.Type() != fastjson.TypeObject {
		return false, false
	}
	o, _ := v.Object()
	ok = true
	o.Visit(func(k []byte, val *fastjson.Value) {
		if slices.Contains(reservedKwargs, string(k)) {
			ok = false
		}
		if string(k) == "enable_thinking" {
			thinkingOff = val.Type() == fastjson.TypeFalse // the last of duplicates, as Python
		}
	})
	return ok, thinkingOff
}

// Sources recognised, by SHA-256 of the template text.
const (
	// sha256ChatML is templates/chatml.jinja (the OpenAI encodings').
	sha256ChatML = "26334ac15ba40cf100c88540c98122c14710e60f488df3de63e5f061dd9bca57"
	// sha256Llama3 is Meta-Llama-3-*-Instruct's tokenizer_config.json
	// chat_template (testdata/llama3_chat_template.jinja).
	sha256Llama3 = "4f46ecd43418f216df8c26936c60e5d04bcc81db47db5d86fbe889f64212dd4c"
	// sha256Qwen3 is Qwen3's tokenizer_config.json chat_template (as in
	// the reference data's qwen3 model).
	sha256Qwen3 = "87a2728cb8dc9fe424d624542f6060ec05a1d285ebbec578bb078900e33396b5"
)

// nativeChat returns the native renderer of source with the special-token
// variables vars, or nil when source is not one it knows.
func nativeChat(source string, vars map[string]any) nativeRender {
	sum := sha256.Sum256([]byte(source))
	switch hex.EncodeToString(sum[:]) {
	case sha256ChatML:
		return func(req *ChatRequest) (string, bool) {
			if ok, _ := kwargsNative(req); !ok {
				return "", false
			}
			return renderChatML(req.Messages, req.AddGenerationPrompt && !req.ContinueFinalMessage)
		}
	case sha256Llama3:
		bos, ok := vars["bos_token"].(string)
		if !ok {
			return nil // gonja renders the undefined variable its own way
		}
		return func(req *ChatRequest) (string, bool) {
			if ok, _ := kwargsNative(req); !ok {
				return "", false
			}
			return renderLlama3(bos, req.Messages, req.AddGenerationPrompt && !req.ContinueFinalMessage)
		}
	case sha256Qwen3:
		return renderQwen3
	}
	return nil
}

func contentBytes(messages []Message) int {
	n := 0
	for _, m := range messages {
		n += len(m.Role) + len(m.Content) + 32
	}
	return n + 64
}

// renderChatML mirrors templates/chatml.jinja:
//
//	<|im_start|>{role}\n{content}<|im_end|>\n ... [<|im_start|>assistant\n]
func renderChatML(messages []Message, addGenerationPrompt bool) (string, bool) {
	var b strings.Builder
	b.Grow(contentBytes(messages))
	for _, m := range messages {
		b.WriteString("<|im_start|>")
		b.WriteString(m.Role)
		b.WriteByte('\n')
		b.WriteString(m.Content)
		b.WriteString("<|im_end|>\n")
	}
	if addGenerationPrompt {
		b.WriteString("<|im_start|>assistant\n")
	}
	return b.String(), true
}

// renderLlama3 mirrors Llama-3 Instruct's template: bos_token first, each
// message's content trimmed (gonja's trim filter is strings.TrimSpace).
func renderLlama3(bos string, messages []Message, addGenerationPrompt bool) (string, bool) {
	var b strings.Builder
	b.Grow(len(bos) + contentBytes(messages))
	for i, m := range messages {
		if i == 0 {
			b.WriteString(bos)
		}
		b.WriteString("<|start_header_id|>")
		b.WriteString(m.Role)
		b.WriteString("<|end_header_id|>\n\n")
		b.WriteString(strings.TrimSpace(m.Content))
		b.WriteString("<|eot_id|>")
	}
	if addGenerationPrompt {
		b.WriteString("<|start_header_id|>assistant<|end_header_id|>\n\n")
	}
	return b.String(), true
}

// renderQwen3 mirrors Qwen3's template over the whole request: the tools
// block of the system turn (each tool through tojson), user turns,
// assistant turns with their reasoning (reasoning_content, or the
// <think> part of the content) kept only after the last user query and
// their tool calls, tool results grouped into one user turn, and the
// generation prompt with an empty think block under enable_thinking false.
func renderQwen3(req *ChatRequest) (string, bool) {
	messages := req.Messages
	kwOK, thinkingOff := kwargsNative(req)
	if len(messages) == 0 || !kwOK {
		return "", false // messages[0] on an empty list: gonja's business
	}
	var tools []*fastjson.Value
	var p fastjson.Parser
	if len(req.Tools) > 0 {
		v, err := p.ParseBytes(req.Tools)
		if err != nil || v.Type() != fastjson.TypeArray {
			return "", false
		}
		tools, _ = v.Array()
	}
	var b strings.Builder
	b.Grow(contentBytes(messages) + len(req.Tools) + 512*min(len(tools), 1))
	if len(tools) > 0 {
		b.WriteString("<|im_start|>system\n")
		if messages[0].Role == "system" {
			b.WriteString(messages[0].Content)
			b.WriteString("\n\n")
		}
		b.WriteString("# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>")
		o := pyJSONOpts{itemSep: ", ", keySep: ": ", indent: -1}
		for _, t := range tools {
			b.WriteByte('\n')
			if o.writeRaw(&b, t, 0) != nil {
				return "", false
			}
		}
		b.WriteString("\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n")
	} else if messages[0].Role == "system" {
		b.WriteString("<|im_start|>system\n")
		b.WriteString(messages[0].Content)
		b.WriteString("<|im_end|>\n")
	}
	lastQuery := len(messages) - 1
	for i := len(messages) - 1; i >= 0; i-- {
		m := messages[i]
		if m.Role == "user" && !(strings.HasPrefix(m.Content, "<tool_response>") && strings.HasSuffix(m.Content, "</tool_response>")) {
			lastQuery = i
			break
		}
	}
	for i, m := range messages {
		first, last := i == 0, i == len(messages)-1
		switch {
		case m.Role == "user" || (m.Role == "system" && !first):
			b.WriteString("<|im_start|>")
			b.WriteString(m.Role)
			b.WriteByte('\n')
			b.WriteString(m.Content)
			b.WriteString("<|im_end|>\n")
		case m.Role == "assistant":
			content, reasoning := m.Content, ""
			if m.ReasoningContent != "" {
				reasoning = m.ReasoningContent
			} else if strings.Contains(m.Content, "</think>") {
				parts := strings.Split(m.Content, "</think>")
				content = strings.TrimLeft(parts[len(parts)-1], "\n")
				think := strings.Split(strings.TrimRight(parts[0], "\n"), "<think>")
				reasoning = strings.TrimLeft(think[len(think)-1], "\n")
			}
			b.WriteString("<|im_start|>assistant\n")
			if i > lastQuery && (last || reasoning != "") {
				b.WriteString("<think>\n")
				b.WriteString(strings.Trim(reasoning, "\n"))
				b.WriteString("\n</think>\n\n")
				b.WriteString(strings.TrimLeft(content, "\n"))
			} else {
				b.WriteString(content)
			}
			for j, c := range m.ToolCalls {
				if j > 0 || content != "" {
					b.WriteByte('\n')
				}
				b.WriteString("<tool_call>\n{\"name\": \"")
				b.WriteString(c.Function.Name)
				b.WriteString("\", \"arguments\": ")
				if len(c.Function.Arguments) == 0 {
					b.WriteString("{}") // as templateMessages gives it
				} else if args, err := p.ParseBytes(c.Function.Arguments); err != nil {
					return "", false
				} else if args.Type() == fastjson.TypeString {
					b.WriteString(str(args))
				} else {
					o := pyJSONOpts{itemSep: ", ", keySep: ": ", indent: -1}
					if o.writeRaw(&b, args, 0) != nil {
						return "", false
					}
				}
				b.WriteString("}\n</tool_call>")
			}
			b.WriteString("<|im_end|>\n")
		case m.Role == "tool":
			if first || messages[i-1].Role != "tool" {
				b.WriteString("<|im_start|>user")
			}
			b.WriteString("\n<tool_response>\n")
			b.WriteString(m.Content)
			b.WriteString("\n</tool_response>")
			if last || messages[i+1].Role != "tool" {
				b.WriteString("<|im_end|>\n")
			}
		}
	}
	if req.AddGenerationPrompt && !req.ContinueFinalMessage {
		b.WriteString("<|im_start|>assistant\n")
		if thinkingOff {
			b.WriteString("<think>\n\n</think>\n\n")
		}
	}
	return b.String(), true
}
