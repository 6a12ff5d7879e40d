package up

import "testing"

// kvgate up opens pins and routing headers to every caller only when its
// gateway binds loopback.
func TestLoopbackAddr(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:8080": true, "127.0.0.1:0": true, "localhost:8080": true, "[::1]:8080": true,
		":8080":        true, // a port alone is loopback (config.ListenAddr)
		"0.0.0.0:8080": false, "[::]:8080": false, "10.0.0.5:8080": false, "bad": false,
	} {
		if got := loopbackAddr(addr); got != want {
			t.Errorf("loopbackAddr(%q) = %v, want %v", addr, got, want)
		}
	}
}
