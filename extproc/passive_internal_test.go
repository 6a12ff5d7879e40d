package extproc

import "testing"

// Only Envoy's local replies that blame the worker feed passive health:
// its own circuit breaker (overflow) or a local reset must not eject a
// healthy worker. Bodies as Envoy writes them (router.cc, "upstream connect
// error or disconnect/reset before headers. reset reason: ...").
func TestWorkerConnectFailure(t *testing.T) {
	for body, want := range map[string]bool{
		"upstream connect error or disconnect/reset before headers. reset reason: connection failure":                                                       true,
		"upstream connect error or disconnect/reset before headers. reset reason: connection failure, transport failure reason: delayed connect error: 111": true,
		"upstream connect error or disconnect/reset before headers. reset reason: connection timeout":                                                       true,
		"upstream connect error or disconnect/reset before headers. reset reason: connection termination":                                                   true,
		"upstream connect error or disconnect/reset before headers. reset reason: overflow":                                                                 false,
		"upstream connect error or disconnect/reset before headers. reset reason: local reset":                                                              false,
		"no healthy upstream": false,
		"":                    false,
	} {
		if got := workerConnectFailure([]byte(body)); got != want {
			t.Errorf("workerConnectFailure(%q) = %v, want %v", body, got, want)
		}
	}
}
