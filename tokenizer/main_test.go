package tokenizer

import (
	"io"
	"log/slog"
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// Load logs a line per model; keep test output readable.
	slog.SetDefault(slog.New(slog.NewTextHandler(io.Discard, nil)))
	if os.Getenv("KVGATE_TOKENIZER_NOLEAK") == "" {
		goleak.VerifyTestMain(m)
		return
	}
	os.Exit(m.Run())
}
