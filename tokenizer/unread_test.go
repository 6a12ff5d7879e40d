package tokenizer_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/tokenizer"
)

// TestLoadRefusesFieldsTheBackendDoesNotRead: a field another backend
// reads (encoding, path, url, timeout) is refused, naming the field and
// its reader, rather than passed over.
func TestLoadRefusesFieldsTheBackendDoesNotRead(t *testing.T) {
	for _, tt := range []struct {
		cfg  tokenizer.Config
		want string
	}{
		{tokenizer.Config{Model: "m", Backend: tokenizer.BackendHuggingFace, Encoding: "o200k_base", Path: "x"}, "encoding is read by the openai backend only, not huggingface"},
		{tokenizer.Config{Model: "m", Backend: tokenizer.BackendOpenAI, Path: "x"}, "path is read by the huggingface backend only, not openai"},
		{tokenizer.Config{Model: "m", Backend: tokenizer.BackendEstimate, URL: "http://e"}, "url is read by the remote backend only, not estimate"},
		{tokenizer.Config{Model: "m", Backend: tokenizer.BackendOpenAI, Timeout: time.Second}, "timeout is read by the remote backend only, not openai"},
	} {
		_, err := tokenizer.Load(tt.cfg)
		if !errors.Is(err, tokenizer.ErrConfig) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%+v: %v, want ErrConfig containing %q", tt.cfg, err, tt.want)
		}
	}
	if _, err := tokenizer.Load(tokenizer.Config{Model: "m", Backend: tokenizer.BackendRemote, URL: "http://e", Timeout: time.Second}); err != nil {
		t.Errorf("remote with url and timeout: %v", err)
	}
}
