package extproc_test

import (
	"context"
	"fmt"
	"testing"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/google/go-cmp/cmp"

	"github.com/kvgate/kvgate/envoy/extprocclient"
	"github.com/kvgate/kvgate/extproc"
	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/testenv"
)

// TestLifecycle drives the response by hand and checks each lease call
// happens at its moment: prefill complete once the first chunk is through,
// free at the end, on an error status, or when the stream ends early.
func TestLifecycle(t *testing.T) {
	for _, m := range allModes {
		t.Run(m.name, func(t *testing.T) {
			for _, tc := range []struct {
				name      string
				status    string
				end       string // "eos", "trailers", "cancel", "empty-eos"
				wantFirst []string
				wantEnd   []string
			}{
				{"end of stream", "200", "eos", []string{"prefill"}, []string{"prefill", "free"}},
				{"trailers", "200", "trailers", []string{"prefill"}, []string{"prefill", "free"}},
				{"client gone", "200", "cancel", []string{"prefill"}, []string{"prefill", "free"}},
				{"error status", "503", "eos", []string{"free"}, []string{"free"}},
			} {
				t.Run(tc.name, func(t *testing.T) {
					if tc.end == "trailers" && m.resp != extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
						t.Skip("response trailers are only sent with trailer mode SEND, set here for FDS")
					}
					d := &deciderDouble{}
					conn, reg := startServer(t, extproc.Config{}, d)
					c := envoyClient(t, conn, m)
					ctx := testenv.Context(t)
					s := c.Open(ctx, nil)
					defer s.Close()
					mustOK(t, s.SendRequestHeaders(ctx, post("/v1/completions"), false))
					mustOK(t, s.SendRequestData(ctx, []byte(`{"model":"m1","prompt":"hi","stream":true}`), true))
					drain(t, ctx, s.ReadUpstream)
					lease := d.lease(t, 0)
					if got := lease.calls(); len(got) != 0 {
						t.Fatalf("lease calls before the response %v, want none", got)
					}
					mustOK(t, s.SendResponseHeaders(ctx, extprocclient.Headers{{Key: ":status", Value: tc.status}, {Key: "content-type", Value: "text/event-stream"}}, false))
					mustOK(t, s.SendResponseData(ctx, []byte(sseChunks[0]), false))
					readUntilData(t, ctx, s)
					// The chunk is passed on before the router is told, so
					// the call may land just after the client has the chunk.
					testenv.Eventually(t, testCtxTimeout, func() (string, bool) {
						if diff := cmp.Diff(tc.wantFirst, lease.calls()); diff != "" {
							return testenv.Errorf("lease calls after the first chunk (-want +got):\n%s", diff)
						}
						return "", true
					})
					mustOK(t, s.SendResponseData(ctx, []byte(sseChunks[1]), false))
					switch tc.end {
					case "eos":
						mustOK(t, s.SendResponseData(ctx, []byte(sseChunks[2]), true))
						drain(t, ctx, s.ReadDownstream)
					case "trailers":
						mustOK(t, s.SendResponseData(ctx, []byte(sseChunks[2]), false))
						mustOK(t, s.SendResponseTrailers(ctx, extprocclient.Headers{{Key: "grpc-status", Value: "0"}}))
						drain(t, ctx, s.ReadDownstream)
					case "cancel":
						s.Close()
					}
					testenv.Eventually(t, testCtxTimeout, func() (string, bool) {
						got := lease.calls()
						return fmt.Sprintf("lease calls %v, want %v", got, tc.wantEnd), cmp.Equal(got, tc.wantEnd)
					})
					s.Close()
					wantCode := tc.status
					if tc.end == "cancel" {
						// The response headers went through: the status is known.
						wantCode = "200"
					}
					testenv.Eventually(t, testCtxTimeout, func() (string, bool) {
						got := counterValue(t, reg, "kvgate_extproc_requests_total", wantCode)
						return fmt.Sprintf("requests_total{code=%s} = %v, want 1", wantCode, got), got == 1
					})
					if tc.end == "eos" && tc.status == "200" {
						for kind, want := range map[string]float64{"prompt": 12, "completion": 2} {
							if got := counterValue(t, reg, "kvgate_extproc_tokens_total", kind); got != want {
								t.Errorf("tokens_total{kind=%s} = %v, want %v", kind, got, want)
							}
						}
					}
				})
			}
		})
	}
}

// TestFreedWhenStreamEndsBeforeResponse: Envoy gives up after the decision
// (client gone, upstream never answered): the request is freed and counted
// as 499.
func TestFreedWhenStreamEndsBeforeResponse(t *testing.T) {
	d := &deciderDouble{}
	conn, reg := startServer(t, extproc.Config{}, d)
	c := envoyClient(t, conn, allModes[0])
	ctx := testenv.Context(t)
	s := c.Open(ctx, nil)
	mustOK(t, s.SendRequestHeaders(ctx, post("/v1/completions"), false))
	mustOK(t, s.SendRequestData(ctx, []byte(`{"model":"m1","prompt":"hi"}`), true))
	drain(t, ctx, s.ReadUpstream)
	s.Close()
	testenv.Eventually(t, testCtxTimeout, func() (string, bool) {
		got := d.lease(t, 0).calls()
		return fmt.Sprintf("lease calls %v, want [free]", got), cmp.Equal(got, []string{"free"})
	})
	testenv.Eventually(t, testCtxTimeout, func() (string, bool) {
		got := counterValue(t, reg, "kvgate_extproc_requests_total", "499")
		return fmt.Sprintf("requests_total{code=499} = %v, want 1", got), got == 1
	})
}

// blockingLease is leaseDouble whose PrefillComplete waits for release: a
// local router slow to acknowledge.
type blockingLease struct {
	*leaseDouble
	release chan struct{}
}

func (l blockingLease) PrefillComplete(ctx context.Context) error {
	select {
	case <-l.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	l.add("prefill")
	return nil
}

// TestPrefillAckDoesNotHoldTheResponse: while the local router has not
// acknowledged the request's prefill-complete, the response's next chunks
// still go through (they queued behind the acknowledgement, and with them
// the response's end and the free: issue 27, BENCHMARKS.md "Per
// request"); the free still follows the prefill-complete.
func TestPrefillAckDoesNotHoldTheResponse(t *testing.T) {
	for _, m := range allModes {
		t.Run(m.name, func(t *testing.T) {
			lease := blockingLease{&leaseDouble{}, make(chan struct{})}
			d := &deciderDouble{}
			conn, _ := startServer(t, extproc.Config{}, deciderFunc(func(ctx context.Context, req *globalrouter.Request) (*globalrouter.Decision, error) {
				dec, err := d.Decide(ctx, req)
				if err == nil {
					dec.Lease = lease
				}
				return dec, err
			}))
			c := envoyClient(t, conn, m)
			ctx := testenv.Context(t)
			s := c.Open(ctx, nil)
			defer s.Close()
			mustOK(t, s.SendRequestHeaders(ctx, post("/v1/completions"), false))
			mustOK(t, s.SendRequestData(ctx, []byte(`{"model":"m1","prompt":"hi","stream":true}`), true))
			drain(t, ctx, s.ReadUpstream)
			mustOK(t, s.SendResponseHeaders(ctx, extprocclient.Headers{{Key: ":status", Value: "200"}, {Key: "content-type", Value: "text/event-stream"}}, false))
			mustOK(t, s.SendResponseData(ctx, []byte(sseChunks[0]), false))
			readUntilData(t, ctx, s)
			// The prefill-complete is unacknowledged: the next chunk must
			// still come through.
			mustOK(t, s.SendResponseData(ctx, []byte(sseChunks[1]), false))
			readUntilData(t, ctx, s)
			if got := lease.calls(); len(got) != 0 {
				t.Fatalf("lease calls %v before the acknowledgement, want none", got)
			}
			mustOK(t, s.SendResponseData(ctx, []byte(sseChunks[2]), true))
			close(lease.release)
			drain(t, ctx, s.ReadDownstream)
			testenv.Eventually(t, testCtxTimeout, func() (string, bool) {
				got := lease.calls()
				return fmt.Sprintf("lease calls %v, want [prefill free]", got), cmp.Equal(got, []string{"prefill", "free"})
			})
		})
	}
}
