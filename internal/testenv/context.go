package testenv

import (
	"context"
	"testing"
	"time"
)

// ContextTimeout bounds the context Context returns.
const ContextTimeout = 30 * time.Second

// Context returns a context for one test: it ends after ContextTimeout or
// when the test ends, whichever comes first (every test context has a
// timeout, STYLE.md).
func Context(t testing.TB) context.Context { return ContextWithTimeout(t, ContextTimeout) }

// ContextWithTimeout is Context with its own timeout.
func ContextWithTimeout(t testing.TB, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
