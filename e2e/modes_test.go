package e2e

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvgate/kvgate/envoy/extprocclient"
	"github.com/kvgate/kvgate/internal/testenv"
)

// TestExtprocModesWithRealRouters drives the ext_proc server with the
// Envoy-faithful client in each supported mode against the real global
// router, local routers and workers: the routing headers and envoy.lb
// metadata name a real worker, the response streams back unchanged, and the
// local routers' loads return to zero.
func TestExtprocModesWithRealRouters(t *testing.T) {
	t.Parallel()
	s := startSystem(t)
	conn, err := grpc.NewClient(s.ExtprocAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := httpClient(t)
	fds, buf, str := extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED, extprocfilterv3.ProcessingMode_BUFFERED, extprocfilterv3.ProcessingMode_STREAMED
	for _, m := range []struct {
		req, resp extprocfilterv3.ProcessingMode_BodySendMode
	}{{fds, fds}, {fds, str}, {buf, str}, {buf, fds}} {
		t.Run(fmt.Sprintf("req=%s/resp=%s", m.req, m.resp), func(t *testing.T) {
			pm := &extprocfilterv3.ProcessingMode{RequestBodyMode: m.req, ResponseBodyMode: m.resp}
			if m.req == fds {
				pm.RequestTrailerMode = extprocfilterv3.ProcessingMode_SEND
			}
			if m.resp == fds {
				pm.ResponseTrailerMode = extprocfilterv3.ProcessingMode_SEND
			}
			c, err := extprocclient.New(conn, extprocclient.Config{ProcessingMode: pm, ReceivingNamespaces: []string{"envoy.lb"}, MessageTimeout: 10 * time.Second}, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			body := []byte(chatBody("mock-llama", longPrompt("modes "+m.req.String(), 0), true, 6))
			var upstreamBody []byte
			res, err := c.Process(testenv.ContextWithTimeout(t, testTimeout), extprocclient.Request{
				Message: extprocclient.Message{
					Headers: extprocclient.Headers{{Key: ":method", Value: "POST"}, {Key: ":path", Value: "/v1/chat/completions"},
						{Key: ":authority", Value: "kvgate"}, {Key: ":scheme", Value: "http"}, {Key: "content-type", Value: "application/json"}},
					Body: [][]byte{body[:100], body[100:101], body[101:]},
				},
				Upstream: func(ctx context.Context, req *extprocclient.Message) (*extprocclient.Message, error) {
					list, _ := req.Headers.Get("x-gateway-destination-endpoint")
					dest, _, _ := strings.Cut(list, ",") // the primary
					r, err := http.NewRequestWithContext(ctx, "POST", "http://"+dest+"/v1/chat/completions", strings.NewReader(string(req.BodyBytes())))
					if err != nil {
						return nil, err
					}
					r.Header.Set("content-type", "application/json")
					resp, err := hc.Do(r)
					if err != nil {
						return nil, err
					}
					defer resp.Body.Close()
					out := &extprocclient.Message{Headers: extprocclient.Headers{{Key: ":status", Value: fmt.Sprint(resp.StatusCode)}, {Key: "content-type", Value: resp.Header.Get("content-type")}}}
					chunk := make([]byte, 512)
					for {
						n, err := resp.Body.Read(chunk)
						if n > 0 {
							out.Body = append(out.Body, append([]byte(nil), chunk[:n]...))
							upstreamBody = append(upstreamBody, chunk[:n]...)
						}
						if err == io.EOF {
							return out, nil
						}
						if err != nil {
							return nil, err
						}
					}
				},
			})
			if err != nil {
				t.Fatal(err)
			}
			if lr := res.Info.LocalReply; lr != nil {
				t.Fatalf("local reply %d %s", lr.Status, lr.Body)
			}
			if got := string(res.Upstream.BodyBytes()); got != string(body) {
				t.Errorf("upstream body differs from the request's")
			}
			// The header and envoy.lb carry the same list (the
			// endpoint-picker protocol): the primary, then the fallbacks.
			list, _ := res.Upstream.Headers.Get("x-gateway-destination-endpoint")
			dest, _, _ := strings.Cut(list, ",")
			if _, err := netip.ParseAddrPort(dest); err != nil {
				t.Errorf("header x-gateway-destination-endpoint %q: want ip:port first (%v)", list, err)
			}
			lb := res.Info.DynamicMetadata["envoy.lb"].GetFields()["x-gateway-destination-endpoint"].GetStringValue()
			if lb != list {
				t.Errorf("envoy.lb %q, header %q: want the same list", lb, list)
			}
			pool, _ := res.Upstream.Headers.Get("x-kvgate-pool")
			worker, _ := res.Upstream.Headers.Get("x-kvgate-worker-id")
			p := s.Pool(pool)
			if p == nil {
				t.Fatalf("x-kvgate-pool %q", pool)
			}
			found := false
			for _, w := range p.Workers {
				found = found || (w.ID == worker && dest == w.Addr)
			}
			if !found {
				t.Errorf("destination %q, worker %q: not a worker of %s", dest, worker, pool)
			}
			if got := string(res.Downstream.BodyBytes()); got != string(upstreamBody) || !strings.Contains(got, "[DONE]") {
				t.Errorf("downstream body %q, want the worker's SSE stream %q", got, upstreamBody)
			}
			waitIdle(t, s)
		})
	}
}
