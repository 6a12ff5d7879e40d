package up

import (
	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/mocker"
	"github.com/kvgate/kvgate/tokenizer"
)

// sharedTokenizer makes the global router and the mock workers compute the
// same token ids for a request, which prefix matching depends on: the
// workers encode the text they render for a chat with the mocker's template
// (mocker.RenderChat), so the router renders chats with it too before
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
	conv := make([]mocker.ChatMessage, len(messages))
	for i, m := range messages {
		conv[i] = mocker.ChatMessage(m)
	}
	return t.m.Encode(mocker.RenderChat(conv, addGenerationPrompt))
}
