package up

import (
	"log/slog"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/mocker"
	"github.com/kvgate/kvgate/tokenizer"
)

// The global router and the mock workers share one *tokenizer.Model, so
// they compute the same token ids for a request, which prefix matching
// depends on: the workers encode chats with the model's chat template
// (mocker.ChatTokenizer) exactly as the router does.
var (
	_ globalrouter.Tokenizer = (*tokenizer.Model)(nil)
	_ mocker.ChatTokenizer   = (*tokenizer.Model)(nil)
)

// loadTokenizer loads the mock model's tokenizer: cl100k_base with Qwen3's
// chat template (tokenizer.BuiltinQwen3), a real template that renders a
// request's tools and tool calls as an engine serving a tool-capable model
// with it does, so the router's tokens for a chat with tools are the ones
// such an engine runs (ChatML's default template drops them).
func loadTokenizer(model string, log *slog.Logger) (*tokenizer.Model, error) {
	return tokenizer.Load(tokenizer.Config{Model: model, Backend: tokenizer.BackendOpenAI, Encoding: "cl100k_base",
		ChatTemplate: tokenizer.BuiltinQwen3, Logger: log})
}
