package tokenizer

import (
	"bytes"
	"encoding/json"
	"strings"
)

// Message is one chat message as an OpenAI chat completion request sends
// it, whole: every field a chat template may read. The body parsers
// (ParseBody) fill it from the OpenAI, Responses and Anthropic forms.
type Message struct {
	Role string `json:"role"`
	// Content is the message's text. A content given as a list of parts
	// is flattened as vLLM does for string-format templates: text parts
	// joined with "\n", each image or audio part replaced by a placeholder
	// (DefaultImagePlaceholder, DefaultAudioPlaceholder) in front of the
	// text.
	Content string `json:"content"`
	// NullContent: content was null or absent (an assistant turn that
	// only calls tools). Templates see None rather than "".
	NullContent bool `json:"-"`
	// Name is the participant's name (optional).
	Name string `json:"name,omitempty"`
	// ToolCalls are an assistant turn's calls, arguments parsed to
	// objects as vLLM does before rendering.
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
	// ToolCallID is the call a tool message answers.
	ToolCallID string `json:"tool_call_id,omitempty"`
	// ReasoningContent is an assistant turn's reasoning (Qwen3, DeepSeek).
	ReasoningContent string `json:"reasoning_content,omitempty"`
}

// ToolCall is one call of an assistant turn.
type ToolCall struct {
	ID       string       `json:"id,omitempty"`
	Type     string       `json:"type"`
	Function FunctionCall `json:"function"`
}

// FunctionCall is a tool call's function: its name and arguments. The
// arguments are a JSON value, an object when the client sent a JSON
// object or a string holding one, as vLLM parses them; a string that is
// not JSON stays a JSON string.
type FunctionCall struct {
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments"`
}

// ChatRequest is everything of a chat request that decides its prompt:
// what the engine passes to the chat template (vLLM's
// apply_chat_template) or to its /tokenize endpoint.
type ChatRequest struct {
	Messages []Message
	// Tools is the request's tools array (raw JSON; nil: none), in the
	// chat completions form ({"type":"function","function":{...}}).
	Tools json.RawMessage
	// ToolChoice is the request's tool_choice (raw JSON; nil: none).
	ToolChoice json.RawMessage
	// TemplateKwargs is chat_template_kwargs (a raw JSON object; nil:
	// none), e.g. {"enable_thinking": false}. Its keys become template
	// variables.
	TemplateKwargs json.RawMessage
	// AddGenerationPrompt ends the text with the assistant turn's header
	// (the OpenAI server's default: true).
	AddGenerationPrompt bool
	// ContinueFinalMessage leaves the final (assistant) message open so
	// the model continues it.
	ContinueFinalMessage bool
	// MMHashes are the content hashes of the request's image and audio
	// parts, in the order their placeholders appear in the messages: the
	// part's uuid when the client gave one (vLLM then keys the item by
	// it), else the SHA-256 (hex) of the part's URL or data as sent. They
	// distinguish different media behind the same placeholder tokens;
	// EncodeChatMedia places them in the ids, and callers hashing blocks
	// put them into the block keys (vLLM's extra_keys). Nil when the
	// request has no media.
	MMHashes []string
}

// NewChat is a ChatRequest of plain messages with the generation prompt,
// as the OpenAI server renders a request that sets nothing else.
func NewChat(messages ...Message) *ChatRequest {
	return &ChatRequest{Messages: messages, AddGenerationPrompt: true}
}

// MarshalJSON writes the message as the OpenAI API does (content null
// when NullContent), for the remote backend's /tokenize.
func (m Message) MarshalJSON() ([]byte, error) {
	type plainMessage Message
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // raw JSON (arguments) stays as the client wrote it
	if err := enc.Encode(plainMessage(m)); err != nil {
		return nil, err
	}
	b := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	if !m.NullContent {
		return b, nil
	}
	return bytes.Replace(b, []byte(`"content":""`), []byte(`"content":null`), 1), nil
}

// UnmarshalJSON reads an OpenAI chat message (content as a string, null
// or parts; tool call arguments as strings or objects) with the rules of
// ParseBody and the default placeholders.
func (m *Message) UnmarshalJSON(data []byte) error {
	var p bodyParser
	msgs, err := p.parseMessagesJSON(append(append([]byte{'['}, data...), ']'))
	if err != nil {
		return err
	}
	*m = msgs[0]
	return nil
}

// joinParts joins text parts as vLLM does.
func joinParts(parts []string) string { return strings.Join(parts, "\n") }
