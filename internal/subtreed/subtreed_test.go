package subtreed_test

import (
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/subtreed"
)

func TestConfigFlags(t *testing.T) {
	for _, tt := range []struct {
		c    subtreed.Config
		want string
	}{
		{subtreed.Config{Pool: "p"}, "-subtree-pool: needs -subtree-listen"},
		{subtreed.Config{Listen: "nope"}, "-subtree-listen"},
		{subtreed.Config{Listen: ":99999"}, "bad port"},
		{subtreed.Config{Listen: ":9300", Pool: "a/b"}, "-subtree-pool"},
		{subtreed.Config{Listen: ":9300", MaxDepth: -1}, "-subtree-max-depth"},
		{subtreed.Config{AnonymousCommitExpiry: time.Second}, "-anonymous-commit-expiry: needs -subtree-listen"},
	} {
		if err := tt.c.Validate(); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%+v: %v, want %q", tt.c, err, tt.want)
		}
	}
	if got := (subtreed.Config{Listen: ":9300"}).ListenAddr(); got != "127.0.0.1:9300" {
		t.Errorf("a port alone listens on %q, want loopback", got)
	}
}
