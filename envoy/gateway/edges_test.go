package gateway

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestSlowBody: a slowloris client (headers, a little of the body, then
// nothing) gets 408 once the body timeout passes, and the gateway ends the
// exchange; the goleak check of TestMain proves nothing was left behind.
func TestSlowBody(t *testing.T) {
	good, _ := startUpstream(t)
	url, _ := startGateway(t, true, func(c *Config) { c.BodyTimeout = 100 * time.Millisecond })
	conn, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = io.WriteString(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\nx-test-pick: "+good+"\r\n\r\n{\"model\":")
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(string(body), "timeout") {
		t.Errorf("slow body got %d %q, want 408 saying timeout", resp.StatusCode, body)
	}
}

// TestOversizedHeaders: request headers past 60 KiB get 431 with a body
// (Envoy's max_request_headers_kb answer), just under them go through.
func TestOversizedHeaders(t *testing.T) {
	good, _ := startUpstream(t)
	url, client := startGateway(t, true)
	for _, tc := range []struct {
		size int
		want int
	}{{DefaultMaxRequestHeadersBytes - 1024, 200}, {DefaultMaxRequestHeadersBytes + 1, 431}, {200 << 10, 431}} {
		req, _ := http.NewRequest("POST", url+"/v1/completions", bytes.NewReader([]byte(`{}`)))
		req.Header.Set("x-test-pick", good)
		req.Header.Set("x-big", strings.Repeat("a", tc.size))
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.want || (tc.want == 431 && !strings.Contains(string(body), "too large")) {
			t.Errorf("headers of %d bytes: %d %q, want %d", tc.size, resp.StatusCode, body, tc.want)
		}
	}
}

// TestWarningsRateLimited: one warning per cause per second, and none for
// a client that left.
func TestWarningsRateLimited(t *testing.T) {
	var buf bytes.Buffer
	g := &Gateway{log: slog.New(slog.NewTextHandler(&buf, nil))}
	ctx := t.Context()
	for range 100 {
		g.warn(ctx, "upstream failed", "k", "v")
		g.warn(ctx, "upstream reset mid-response")
	}
	gone, cancel := context.WithCancel(ctx)
	cancel()
	for range 10 {
		g.warn(gone, "client cancelled")
	}
	if n := strings.Count(buf.String(), "level=WARN"); n != 2 {
		t.Errorf("%d warnings for 2 causes × 100, want 2:\n%s", n, buf.String())
	}
}
