package globalrouter_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/kvgate/kvgate/internal/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testenv.IgnoreLeaks()...)
}
