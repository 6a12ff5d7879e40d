package server

// SetCommitHook sets commitHook for a test (before it opens a stream) and
// unsets it when the test ends.
func SetCommitHook(t interface{ Cleanup(func()) }, hook func(requestID string)) {
	commitHook = hook
	t.Cleanup(func() { commitHook = nil })
}
