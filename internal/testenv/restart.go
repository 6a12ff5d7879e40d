package testenv

import (
	"context"
	"testing"

	"github.com/kvgate/kvgate/internal/embedded"
)

// StartRestartableEtcd starts an embedded etcd in the test's temporary
// directory that the test can Stop and Restart on the same port and data
// (embedded.Etcd); it is closed when the test ends.
func StartRestartableEtcd(t testing.TB) *embedded.Etcd {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), StartTimeout)
	defer cancel()
	e, err := embedded.StartEtcd(ctx, "127.0.0.1", t.TempDir())
	if err != nil {
		t.Fatalf("start embedded etcd: %v", err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// StartRestartableNATS starts an embedded NATS server that the test can
// Stop and Restart on the same port (embedded.NATS); it is shut down when
// the test ends.
func StartRestartableNATS(t testing.TB) *embedded.NATS {
	t.Helper()
	n, err := embedded.StartNATS("127.0.0.1")
	if err != nil {
		t.Fatalf("start embedded nats: %v", err)
	}
	t.Cleanup(n.Close)
	return n
}
