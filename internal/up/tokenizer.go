package up

import (
	"strings"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/mocker"
	"github.com/kvgate/kvgate/tokenizer"
)

// sharedTokenizer makes the global router and the mock workers compute the
// same token ids for a request, which prefix matching depends on: the
// workers encode the text they render for a chat with the mocker's neutral
// template, so the router renders chats the same way (mockChat) before
// encoding with the same model.
type sharedTokenizer struct {
	m *tokenizer.Model
}

var (
	_ globalrouter.Tokenizer = sharedTokenizer{}
	_ mocker.Tokenizer       = sharedTokenizer{}
)

func (t sharedTokenizer) Encode(text string) ([]uint32, error) { return t.m.Encode(text) }

func (t sharedTokenizer) EncodeChat(messages []tokenizer.Message, addGenerationPrompt bool) ([]uint32, error) {
	return t.m.Encode(mockChat(messages, addGenerationPrompt))
}

// mockChat renders a conversation as the mocker's HTTP server does before
// tokenizing: "<|role|>\ncontent\n" per message, then "<|assistant|>\n".
// The e2e overlap test fails if the two drift apart.
func mockChat(messages []tokenizer.Message, addGenerationPrompt bool) string {
	var b strings.Builder
	for _, m := range messages {
		b.WriteString("<|")
		b.WriteString(m.Role)
		b.WriteString("|>\n")
		b.WriteString(m.Content)
		b.WriteString("\n")
	}
	if addGenerationPrompt {
		b.WriteString("<|assistant|>\n")
	}
	return b.String()
}
