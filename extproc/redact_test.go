package extproc

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/globalrouter"
)

// TestErrorBodiesCarryNoAddresses: a Decide error that names internal
// endpoints reaches the client with its reason and without the addresses.
func TestErrorBodiesCarryNoAddresses(t *testing.T) {
	var s Server
	for _, err := range []error{
		fmt.Errorf("%w: pool \"pool-a\": router pool-a-router (127.0.0.1:41234): rpc error: code = Unavailable desc = connection error: desc = \"transport: Error while dialing: dial tcp 127.0.0.1:41234: connect: connection refused\"", globalrouter.ErrNoPool),
		fmt.Errorf("%w: x-kvgate-worker-id: \"w1\" is unreachable: dial tcp [fd00::12]:8000: i/o timeout", globalrouter.ErrNoPool),
		fmt.Errorf("%w: etcd http://10.0.3.4:2379 unavailable; worker at worker-3.pods.local:8001 gone", globalrouter.ErrSaturated),
		fmt.Errorf("%w: x-kvgate-pool: pool \"p\" at 192.168.1.20 refused", globalrouter.ErrPinRefused),
	} {
		e := s.errorFor(err)
		for _, addr := range []string{"127.0.0.1", "41234", "fd00::12", "10.0.3.4", "2379", "worker-3.pods.local", "192.168.1.20"} {
			if strings.Contains(e.msg, addr) {
				t.Errorf("client message %q names %s", e.msg, addr)
			}
		}
		if !strings.Contains(e.msg, "[address]") {
			t.Errorf("client message %q: want the addresses replaced by [address]", e.msg)
		}
	}
	if got := redactAddresses(`x-kvgate-dp-rank: "5" is not a rank; model "m" has 3 pools`); strings.Contains(got, "[address]") {
		t.Errorf("redacted a message without an address: %q", got)
	}
}
