package tokenizer

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// Native renderers of well-known chat templates. Rendering through the
// Jinja engine (gonja) costs most of a chat's tokenizing time and most of
// its allocations: every "+" builds a new string, every lookup wraps a
// value. A template whose source is, byte for byte, one of those below is
// rendered by plain Go instead. The template is recognised by the SHA-256
// of its source, so an edited template (an operator's override, a model
// revision) goes through gonja as before. chatnative_test.go proves each
// renderer byte-identical to gonja over many generated conversations; a
// renderer declines (ok false) whatever it does not mirror exactly, and
// gonja renders that.

// nativeRender renders messages as the template would, or reports false.
type nativeRender func(messages []Message, addGenerationPrompt bool) (string, bool)

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
		return renderChatML
	case sha256Llama3:
		bos, ok := vars["bos_token"].(string)
		if !ok {
			return nil // gonja renders the undefined variable its own way
		}
		return func(m []Message, gen bool) (string, bool) { return renderLlama3(bos, m, gen) }
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

// renderQwen3 mirrors Qwen3's template for messages without tools, tool
// calls or reasoning_content (Message has none), and without
// enable_thinking (never set): system first, user turns, assistant turns
// with their <think> part kept only after the last user query, tool
// results grouped into one user turn.
func renderQwen3(messages []Message, addGenerationPrompt bool) (string, bool) {
	if len(messages) == 0 {
		return "", false // messages[0] on an empty list: gonja's business
	}
	var b strings.Builder
	b.Grow(contentBytes(messages))
	if messages[0].Role == "system" {
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
			if strings.Contains(m.Content, "</think>") {
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
	if addGenerationPrompt {
		b.WriteString("<|im_start|>assistant\n")
	}
	return b.String(), true
}
