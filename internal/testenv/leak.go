package testenv

import "go.uber.org/goleak"

// IgnoreLeaks lists goroutines that may outlive a test for reasons outside
// kvgate's control, for goleak.VerifyTestMain(m, testenv.IgnoreLeaks()...).
// Keep it short: every entry hides a class of leaks.
func IgnoreLeaks() []goleak.Option {
	return nil
}
