package up

import (
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
