package globalrouter

import (
	"io"
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// BenchmarkUnreadHeaders: what noteUnreadHeaders adds to a decision, all
// four headers unread by the configuration (the most it checks), against
// parseHeaders of the same request (which every decision runs) as the
// floor: carrying none of them, and carrying all four (counted; logged
// once, then not).
func BenchmarkUnreadHeaders(b *testing.B) {
	r := &Router{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	st := &state{}
	for _, name := range []string{HeaderPriority, HeaderTTFT, HeaderITL, HeaderSession} {
		st.unread = append(st.unread, &unreadHeader{UnreadHeader: UnreadHeader{Name: name, Why: "bench"}, count: prometheus.NewCounter(prometheus.CounterOpts{Name: "bench"})})
	}
	other := map[string]string{"content-type": "application/json", "x-request-id": "r1", ":path": "/v1/chat/completions"}
	all := map[string]string{"content-type": "application/json", HeaderPriority: "1", HeaderTTFT: "200", HeaderITL: "20", HeaderSession: "s"}
	for _, bc := range []struct {
		name string
		h    map[string]string
	}{{"none", other}, {"all four", all}} {
		b.Run(bc.name+"/floor parseHeaders", func(b *testing.B) {
			for b.Loop() {
				_, _ = parseHeaders(bc.h)
			}
		})
		b.Run(bc.name+"/noteUnreadHeaders", func(b *testing.B) {
			d := &Decision{}
			for b.Loop() {
				r.noteUnreadHeaders(st, bc.h, false, d)
			}
		})
	}
}
