package extproc

import (
	"errors"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/tokenizer"
)

// bodyError is a request body the server refuses with 400; reason goes in
// x-kvgate-dropped-reason.
type bodyError struct {
	reason string
	msg    string
}

func (e *bodyError) Error() string { return e.msg }

// Dropped reasons of body errors.
const (
	reasonBadJSON      = tokenizer.ReasonBadJSON
	reasonMissingField = tokenizer.ReasonMissingField
	reasonBadField     = tokenizer.ReasonBadField
	reasonDuplicateKey = tokenizer.ReasonDuplicateKey
)

// chatPath and completionsPath say which field a path requires; other
// configured inference paths accept either (see tokenizer.ParseBody).
const (
	completionsPath = tokenizer.PathCompletions
	chatPath        = tokenizer.PathChat
)

// parsedBody is what parseBody reads beside what goes into the Request.
type parsedBody struct {
	stream bool
}

// parseBody decodes an inference request body once (tokenizer.ParseBody:
// completions, chat completions with everything that shapes the prompt,
// the Responses API, Anthropic messages) and fills req's Model, CacheSalt
// and exactly one of Prompt, PromptTokens or Chat; every other field is left
// alone (the body is re-emitted as it came). A key named twice in one object
// is read as dups says (Config.DuplicateKeys). Errors are *bodyError.
func parseBody(path string, body []byte, req *globalrouter.Request, dups tokenizer.DuplicateKeys) (parsedBody, error) {
	b, err := tokenizer.ParseBodyWith(path, body, tokenizer.BodyOptions{Duplicates: dups})
	if err != nil {
		var be *tokenizer.BodyError
		if errors.As(err, &be) {
			return parsedBody{}, &bodyError{be.Reason, be.Msg}
		}
		return parsedBody{}, &bodyError{reasonBadJSON, err.Error()}
	}
	req.Model, req.Prompt, req.PromptTokens, req.Chat, req.CacheSalt, req.ExtraKey = b.Model, b.Prompt, b.PromptTokens, b.Chat, b.CacheSalt, b.ExtraKey
	return parsedBody{stream: b.Stream}, nil
}
