package e2e

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/internal/up"
)

// TestGatewayEdges: kvgate up's gateway answers 431 with a body to request
// headers past 60 KiB (it answered 500 with an empty body: issue 27), lets
// a request just under them through, and answers 408 to a slowloris client
// once -gateway-body-timeout passes.
func TestGatewayEdges(t *testing.T) {
	t.Parallel()
	s := startSystem(t, func(c *up.Config) { c.GatewayBodyTimeout = 200 * time.Millisecond })
	ctx := testenv.Context(t)
	c := httpClient(t)
	body := `{"model":"mock-llama","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`
	for _, tc := range []struct {
		size, want int
	}{{50 << 10, 200}, {60 << 10, 431}, {64 << 10, 431}} {
		resp := postChat(t, ctx, c, s.GatewayURL(), body, "x-big", strings.Repeat("a", tc.size))
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.want || (tc.want == 431 && len(b) == 0) {
			t.Errorf("headers of %d bytes: %d %q, want %d with a body", tc.size, resp.StatusCode, b, tc.want)
		}
	}
	conn, err := net.Dial("tcp", strings.TrimPrefix(s.GatewayURL(), "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n{\"model\":"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestTimeout {
		t.Errorf("slow body: %d, want 408", resp.StatusCode)
	}
}
