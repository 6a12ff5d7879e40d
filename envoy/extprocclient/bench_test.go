package extprocclient

import (
	"bytes"
	"context"
	"testing"
	"time"
)

// BenchmarkProcessFullDuplex: one request (8 KiB body in two chunks) and its
// response through the shipped modes against a fake that echoes, over
// loopback gRPC: the client's share of a routing decision's latency.
func BenchmarkProcessFullDuplex(b *testing.B) {
	_, conn := startFakeB(b, passAll(fdsBoth))
	c, err := New(conn, Config{ProcessingMode: fdsBoth, ReceivingNamespaces: []string{"envoy.lb"}}, nil)
	if err != nil {
		b.Fatal(err)
	}
	body := bytes.Repeat([]byte("x"), 4096)
	req := postRequest(string(body), string(body))
	req.Upstream = upstreamOK("data: hi\n\n", "data: [DONE]\n\n")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := c.Process(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
}
