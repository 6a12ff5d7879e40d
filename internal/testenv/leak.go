package testenv

import "go.uber.org/goleak"

// IgnoreLeaks lists goroutines that may outlive a test for reasons outside
// kvgate's control, for goleak.VerifyTestMain(m, testenv.IgnoreLeaks()...).
// Keep it short: every entry hides a class of leaks.
func IgnoreLeaks() []goleak.Option {
	return []goleak.Option{
		// go-zeromq/zmq4's PUB socket starts a writer that Close does not
		// stop (one per PUB socket): the engine side's ZMQ tests.
		goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"),
	}
}
