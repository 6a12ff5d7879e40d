package tokenizer

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strings"
	"unicode/utf8"

	"github.com/valyala/fastjson"
)

// Inference paths whose bodies ParseBody reads. Another path accepts
// whichever of messages, prompt or input its body has.
const (
	PathCompletions = "/v1/completions"
	PathChat        = "/v1/chat/completions"
	PathResponses   = "/v1/responses"
	PathMessages    = "/v1/messages" // Anthropic
)

// Placeholders a media part becomes in the rendered text, unless the
// model's Config says otherwise.
const (
	DefaultImagePlaceholder = "<image>"
	DefaultAudioPlaceholder = "<audio>"
)

// Reasons of a BodyError.
const (
	ReasonBadJSON      = "bad_json"
	ReasonMissingField = "missing_field"
	ReasonBadField     = "bad_field"
	// ReasonDuplicateKey (dupkeys.go): a key named twice in one object.
)

// BodyError is a request body ParseBody refuses: Reason is one of the
// Reason* constants, Msg names the field and what is wrong with it.
type BodyError struct {
	Reason string
	Msg    string
}

func (e *BodyError) Error() string { return e.Msg }

// Body is a parsed inference request body: the model and exactly one of
// Prompt, PromptTokens or Chat.
type Body struct {
	Model        string
	Stream       bool
	Prompt       string
	PromptTokens []uint32
	Chat         *ChatRequest
	// CacheSalt is the request's cache_salt ("" for none): vLLM salts the
	// request's prefix-cache blocks with it, so they are shared only with
	// requests of the same salt. Read from completions, chat completions
	// and Responses bodies, the forms whose vLLM request models accept it
	// (vllm/entrypoints/openai/protocol.py: CompletionRequest,
	// ChatCompletionRequest, ResponsesRequest); Anthropic bodies have no
	// such field in vLLM and theirs is ignored.
	CacheSalt string
	// ExtraKey is SGLang's extra_key, which SGLang appends to cache_salt
	// to key its cache ("" for none or a value SGLang ignores: "" or []);
	// a value of another type is kept as its JSON. Read where cache_salt
	// is.
	ExtraKey string
}

// parsers parse request bodies; fastjson validates and parses an 8 KB
// body several times faster than encoding/json, which matters on a path
// whose floor is tokenizing.
var parsers fastjson.ParserPool

// bodyParser collects what parsing finds beside the messages.
type bodyParser struct {
	mm []string
}

// ParseBody decodes an inference request body once: OpenAI completions
// (prompt as a string, token ids, or a one-element list of either), chat
// completions (the whole request that shapes the prompt: every message
// field, tools, tool_choice, chat_template_kwargs, add_generation_prompt,
// continue_final_message), the Responses API (input, instructions, tools)
// and Anthropic messages (system, messages with content blocks, tools).
// The latter two become a ChatRequest in the chat completions form, as
// the engines that serve them render them through the chat template.
// cache_salt is read into Body.CacheSalt (completions, chat completions,
// Responses) and media parts' content hashes into ChatRequest.MMHashes.
// Errors are *BodyError. Strings are made valid UTF-8 as encoding/json
// would. A body that names a key twice in one object is refused
// (DuplicatesRefuse; ParseBodyWith reads it as the engine does instead).
// Nothing is allocated by a size the client states.
func ParseBody(path string, body []byte) (*Body, error) {
	return parseBody(path, body, true, DuplicatesRefuse)
}

// BodyOptions are ParseBodyWith's choices; the zero value is ParseBody's.
type BodyOptions struct {
	// Duplicates says how a key named twice in one object is read.
	Duplicates DuplicateKeys
	// NoModel accepts a body without a model (Body.Model is then "").
	NoModel bool
}

// ParseBodyWith is ParseBody with options.
func ParseBodyWith(path string, body []byte, o BodyOptions) (*Body, error) {
	return parseBody(path, body, !o.NoModel, o.Duplicates)
}

// ParseBodyNoModel is ParseBody for a body that may leave out the model
// (Body.Model is then "").
func ParseBodyNoModel(path string, body []byte) (*Body, error) {
	return parseBody(path, body, false, DuplicatesRefuse)
}

// ParseChat is ParseBody for a body that must be a chat (chat
// completions, Responses or Anthropic by path) and may leave out the
// model: the chat request alone, read as an engine reads it (of a key
// named twice the last counts, DuplicatesLast), for the mocker.
func ParseChat(path string, body []byte) (*ChatRequest, error) {
	if path != PathResponses && path != PathMessages {
		path = PathChat
	}
	b, err := parseBody(path, body, false, DuplicatesLast)
	if err != nil {
		return nil, err
	}
	return b.Chat, nil
}

func parseBody(path string, body []byte, needModel bool, dups DuplicateKeys) (*Body, error) {
	if err := fastjson.ValidateBytes(body); err != nil {
		return nil, &BodyError{ReasonBadJSON, "request body is not valid JSON: " + err.Error()}
	}
	p := parsers.Get()
	defer parsers.Put(p)
	v, err := p.ParseBytes(body)
	if err != nil {
		return nil, &BodyError{ReasonBadJSON, "request body is not valid JSON: " + err.Error()}
	}
	// fastjson's Get takes a key's first occurrence, Python's json (the
	// engine) its last: a body where they differ is refused or read anew
	// with one value per key, before anything is read from it.
	if mayHaveDuplicates(v) {
		resolved, dup, err := resolveDuplicates(body, dups)
		if err != nil {
			return nil, err
		}
		if dup {
			if v, err = p.ParseBytes(resolved); err != nil {
				return nil, &BodyError{ReasonBadJSON, "request body is not valid JSON: " + err.Error()}
			}
		}
	}
	o, err := v.Object()
	if err != nil {
		return nil, &BodyError{ReasonBadJSON, "request body must be a JSON object"}
	}
	b := &Body{}
	switch s := o.Get("stream"); {
	case s == nil || s.Type() == fastjson.TypeNull || s.Type() == fastjson.TypeFalse:
	case s.Type() == fastjson.TypeTrue:
		b.Stream = true
	default:
		return nil, &BodyError{ReasonBadField, "stream must be a boolean"}
	}
	model := present(o.Get("model"))
	switch {
	case model == nil && !needModel:
	case model == nil:
		return nil, &BodyError{ReasonMissingField, "missing required field: model"}
	case model.Type() != fastjson.TypeString:
		return nil, &BodyError{ReasonBadField, "model must be a string"}
	default:
		if b.Model = str(model); b.Model == "" && needModel {
			return nil, &BodyError{ReasonMissingField, "missing required field: model"}
		}
	}
	prompt, messages, input := present(o.Get("prompt")), present(o.Get("messages")), present(o.Get("input"))
	var bp bodyParser
	switch {
	case path == PathMessages:
		if messages == nil {
			return nil, &BodyError{ReasonMissingField, "missing required field: messages"}
		}
		if b.Chat, err = bp.anthropic(o); err != nil {
			return nil, &BodyError{ReasonBadField, err.Error()}
		}
	case path == PathResponses || (path != PathChat && path != PathCompletions && messages == nil && prompt == nil && input != nil):
		if input == nil {
			return nil, &BodyError{ReasonMissingField, "missing required field: input"}
		}
		if b.Chat, err = bp.responses(o); err != nil {
			return nil, &BodyError{ReasonBadField, err.Error()}
		}
	case path == PathChat || (path != PathCompletions && messages != nil):
		if messages == nil {
			return nil, &BodyError{ReasonMissingField, "missing required field: messages"}
		}
		if b.Chat, err = bp.chat(o); err != nil {
			return nil, &BodyError{ReasonBadField, err.Error()}
		}
	case path == PathCompletions || prompt != nil:
		if prompt == nil {
			return nil, &BodyError{ReasonMissingField, "missing required field: prompt"}
		}
		if err := parsePrompt(prompt, b); err != nil {
			return nil, &BodyError{ReasonBadField, "prompt: " + err.Error()}
		}
	default:
		return nil, &BodyError{ReasonMissingField, "missing required field: prompt or messages"}
	}
	if b.Chat != nil {
		b.Chat.MMHashes = bp.mm
	}
	if path != PathMessages {
		if b.CacheSalt, err = cacheSalt(o); err != nil {
			return nil, err
		}
		b.ExtraKey = extraKey(o)
	}
	return b, nil
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

// optString reads an optional string field of o.
func optString(o *fastjson.Object, key string) (string, error) {
	v := present(o.Get(key))
	if v == nil {
		return "", nil
	}
	if v.Type() != fastjson.TypeString {
		return "", fmt.Errorf("%s: must be a string", key)
	}
	return str(v), nil
}

// optBool reads an optional boolean field of o.
func optBool(o *fastjson.Object, key string, def bool) (bool, error) {
	switch v := present(o.Get(key)); {
	case v == nil:
		return def, nil
	case v.Type() == fastjson.TypeTrue:
		return true, nil
	case v.Type() == fastjson.TypeFalse:
		return false, nil
	default:
		return false, fmt.Errorf("%s: must be a boolean", key)
	}
}

// raw copies a JSON value out of the parser. fastjson re-escapes a string
// it has decoded and may then write invalid JSON (\x87 for a byte that is
// not UTF-8); such a value is written anew, strings made valid UTF-8.
func raw(v *fastjson.Value) []byte {
	b := v.MarshalTo(nil)
	if utf8.Valid(b) && fastjson.ValidateBytes(b) == nil {
		return b
	}
	var sb strings.Builder
	o := pyJSONOpts{itemSep: ",", keySep: ":", indent: -1}
	if o.writeRaw(&sb, v, 0) != nil {
		return []byte("null")
	}
	return []byte(sb.String())
}

// options reads the chat completions fields beside messages that shape
// the prompt.
func (p *bodyParser) options(o *fastjson.Object, c *ChatRequest) error {
	if v := present(o.Get("tools")); v != nil {
		if v.Type() != fastjson.TypeArray {
			return errors.New("tools: must be a list")
		}
		if tools, _ := v.Array(); len(tools) > 0 {
			for i, t := range tools {
				if t.Type() != fastjson.TypeObject {
					return fmt.Errorf("tools[%d]: must be an object", i)
				}
			}
			c.Tools = raw(v)
		}
	}
	if v := present(o.Get("tool_choice")); v != nil {
		c.ToolChoice = raw(v)
	}
	if v := present(o.Get("chat_template_kwargs")); v != nil {
		if v.Type() != fastjson.TypeObject {
			return errors.New("chat_template_kwargs: must be an object")
		}
		if obj, _ := v.Object(); obj.Len() > 0 {
			c.TemplateKwargs = raw(v)
		}
	}
	var err error
	if c.ContinueFinalMessage, err = optBool(o, "continue_final_message", false); err != nil {
		return err
	}
	// vLLM: add_generation_prompt defaults to true, and continuing the
	// final message implies not adding one unless asked.
	if c.AddGenerationPrompt, err = optBool(o, "add_generation_prompt", !c.ContinueFinalMessage); err != nil {
		return err
	}
	if c.AddGenerationPrompt && c.ContinueFinalMessage {
		return errors.New("add_generation_prompt and continue_final_message cannot both be true")
	}
	return nil
}

// chat reads a chat completions body.
func (p *bodyParser) chat(o *fastjson.Object) (*ChatRequest, error) {
	c := &ChatRequest{}
	msgs, err := p.parseMessages(o.Get("messages"))
	if err != nil {
		return nil, fmt.Errorf("messages%v", err)
	}
	c.Messages = msgs
	if err := p.options(o, c); err != nil {
		return nil, err
	}
	return c, nil
}

func (p *bodyParser) parseMessagesJSON(data []byte) ([]Message, error) {
	var jp fastjson.Parser
	v, err := jp.ParseBytes(data)
	if err != nil {
		return nil, err
	}
	// As encoding/json (and Python) would: of a key named twice, the last.
	if fastjson.ValidateBytes(data) == nil && mayHaveDuplicates(v) {
		if resolved, dup, err := resolveDuplicates(data, DuplicatesLast); err == nil && dup {
			if v, err = jp.ParseBytes(resolved); err != nil {
				return nil, err
			}
		}
	}
	msgs, err := p.parseMessages(v)
	if err != nil {
		return nil, fmt.Errorf("message%v", err)
	}
	return msgs, nil
}

func (p *bodyParser) parseMessages(v *fastjson.Value) ([]Message, error) {
	arr, err := v.Array()
	if err != nil {
		return nil, errors.New(": must be a list of messages")
	}
	if len(arr) == 0 {
		return nil, errors.New(": must not be empty")
	}
	out := make([]Message, len(arr))
	for i, m := range arr {
		if err := p.parseMessage(m, &out[i]); err != nil {
			return nil, fmt.Errorf("[%d]%v", i, err)
		}
	}
	return out, nil
}

func (p *bodyParser) parseMessage(v *fastjson.Value, m *Message) error {
	o, err := v.Object()
	if err != nil {
		return errors.New(": must be an object")
	}
	for _, f := range [...]struct {
		key string
		dst *string
	}{{"role", &m.Role}, {"name", &m.Name}, {"tool_call_id", &m.ToolCallID}, {"reasoning_content", &m.ReasoningContent}} {
		if *f.dst, err = optString(o, f.key); err != nil {
			return errors.New("." + err.Error())
		}
	}
	if m.ReasoningContent == "" {
		// vLLM accepts "reasoning" as well.
		if m.ReasoningContent, err = optString(o, "reasoning"); err != nil {
			return errors.New("." + err.Error())
		}
	}
	c := present(o.Get("content"))
	m.NullContent = c == nil
	if m.Content, err = p.content(c); err != nil {
		return fmt.Errorf(".content: %v", err)
	}
	if tc := present(o.Get("tool_calls")); tc != nil {
		calls, err := tc.Array()
		if err != nil {
			return errors.New(".tool_calls: must be a list")
		}
		for j, call := range calls {
			c, err := toolCall(call)
			if err != nil {
				return fmt.Errorf(".tool_calls[%d]%v", j, err)
			}
			m.ToolCalls = append(m.ToolCalls, c)
		}
	}
	return nil
}

// toolCall reads {"id","type","function":{"name","arguments"}}.
func toolCall(v *fastjson.Value) (ToolCall, error) {
	o, err := v.Object()
	if err != nil {
		return ToolCall{}, errors.New(": must be an object")
	}
	var c ToolCall
	if c.ID, err = optString(o, "id"); err != nil {
		return c, errors.New("." + err.Error())
	}
	if c.Type, err = optString(o, "type"); err != nil {
		return c, errors.New("." + err.Error())
	}
	if c.Type == "" {
		c.Type = "function"
	}
	fv := present(o.Get("function"))
	if fv == nil {
		return c, errors.New(".function: missing")
	}
	fo, err := fv.Object()
	if err != nil {
		return c, errors.New(".function: must be an object")
	}
	if c.Function.Name, err = optString(fo, "name"); err != nil {
		return c, errors.New(".function." + err.Error())
	}
	c.Function.Arguments = arguments(present(fo.Get("arguments")))
	return c, nil
}

// arguments turns a tool call's arguments into the JSON value templates
// see: vLLM json.loads a string that holds JSON (an object); any other
// string stays a string; absent is an empty object.
func arguments(v *fastjson.Value) []byte {
	if v == nil {
		return []byte("{}")
	}
	if v.Type() == fastjson.TypeString {
		s := v.GetStringBytes()
		var jp fastjson.Parser
		// ParseBytes alone accepts some invalid JSON (a bare "."):
		// validate first, as the body was.
		if fastjson.ValidateBytes(s) == nil {
			if parsed, err := jp.ParseBytes(s); err == nil && parsed.Type() == fastjson.TypeObject {
				return raw(parsed)
			}
		}
	}
	return raw(v)
}

// content flattens a message's content: a string, null, or a list of
// parts, text parts joined with "\n" and each media part's placeholder in
// front of the text, as vLLM does for templates that take strings.
func (p *bodyParser) content(v *fastjson.Value) (string, error) {
	if v == nil {
		return "", nil
	}
	switch v.Type() {
	case fastjson.TypeString:
		return str(v), nil
	case fastjson.TypeArray:
	default:
		return "", errors.New("must be a string or a list of content parts")
	}
	parts, _ := v.Array()
	var texts, media []string
	for i, part := range parts {
		if part.Type() == fastjson.TypeString { // some clients send bare strings
			texts = append(texts, str(part))
			continue
		}
		po, err := part.Object()
		if err != nil {
			return "", fmt.Errorf("part %d: must be an object", i)
		}
		typ := string(po.Get("type").GetStringBytes())
		switch typ {
		case "text", "input_text", "output_text":
			t := po.Get("text")
			if t == nil || t.Type() != fastjson.TypeString {
				return "", fmt.Errorf("part %d: text must be a string", i)
			}
			texts = append(texts, str(t))
		case "image_url", "input_image", "image", "image_pil", "image_embeds":
			media = append(media, DefaultImagePlaceholder)
			p.mm = append(p.mm, mediaHash(part))
		case "input_audio", "audio_url", "audio":
			media = append(media, DefaultAudioPlaceholder)
			p.mm = append(p.mm, mediaHash(part))
		case "refusal":
			if t := po.Get("refusal"); t != nil && t.Type() == fastjson.TypeString {
				texts = append(texts, str(t))
			}
		}
	}
	return joinParts(append(media, texts...)), nil
}

// mediaHash is a media part's content hash: its uuid when the client
// names the item (vLLM keys a multimodal item by the uuid its content part
// carries, multi_modal_uuids, instead of hashing the media), otherwise the
// SHA-256 (hex) of the part's JSON (its URL or data).
func mediaHash(part *fastjson.Value) string {
	if u := part.Get("uuid"); u != nil && u.Type() == fastjson.TypeString && len(u.GetStringBytes()) > 0 {
		return str(u)
	}
	sum := sha256.Sum256(part.MarshalTo(nil))
	return hex.EncodeToString(sum[:])
}

// parsePrompt accepts the OpenAI prompt forms that describe one request:
// a string, a list of token ids, or a one-element list of either.
func parsePrompt(v *fastjson.Value, b *Body) error {
	switch v.Type() {
	case fastjson.TypeString:
		s := str(v)
		if s == "" {
			return errors.New("must not be empty")
		}
		b.Prompt = s
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
		return parsePrompt(items[0], b)
	}
	toks := make([]uint32, len(items))
	for i, it := range items {
		n, err := it.Uint64()
		if it.Type() != fastjson.TypeNumber || err != nil || n > math.MaxUint32 {
			return fmt.Errorf("[%d]: want a token id (0..%d), got %s", i, uint32(math.MaxUint32), clip([]byte(it.String()), 32))
		}
		toks[i] = uint32(n)
	}
	b.PromptTokens = toks
	return nil
}

func clip(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}
