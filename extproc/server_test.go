package extproc_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvgate/kvgate/tokenizer"

	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/google/go-cmp/cmp"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"

	"github.com/kvgate/kvgate/api/routing"
	"github.com/kvgate/kvgate/envoy/extprocclient"
	"github.com/kvgate/kvgate/extproc"
	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/testenv"
)

var sseChunks = []string{
	"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n",
	"data: {\"choices\":[{\"delta\":{\"content\":\" there\"}}]}\n\ndata: {\"choices\":[],\"usa",
	"ge\":{\"prompt_tokens\":12,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n",
}

func TestRoutesInEveryMode(t *testing.T) {
	all := append(allModes[:len(allModes):len(allModes)],
		modes{"req=FDS/resp=BUFFERED", extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED, extprocfilterv3.ProcessingMode_BUFFERED})
	for _, m := range all {
		t.Run(m.name, func(t *testing.T) {
			d := &deciderDouble{}
			conn, _ := startServer(t, extproc.Config{}, d)
			c := envoyClient(t, conn, m)
			res, err := c.Process(testenv.Context(t), extprocclient.Request{
				Message: extprocclient.Message{
					Headers: post("/v1/chat/completions?x=1", extprocclient.HeaderField{Key: "x-request-id", Value: "req-1"}),
					Body:    [][]byte{[]byte(chatBody[:10]), []byte(chatBody[10:])},
				},
				Upstream: sseResponse(sseChunks...),
			})
			if err != nil {
				t.Fatal(err)
			}
			if res.Info.LocalReply != nil {
				t.Fatalf("local reply %d %s", res.Info.LocalReply.Status, res.Info.LocalReply.Body)
			}
			up := res.Upstream
			want := map[string]string{
				"x-gateway-destination-endpoint": wantDestination, // the same list as envoy.lb
				"x-kvgate-pool":                  "pool-a",
				"x-kvgate-worker-id":             "w1",
				"x-kvgate-dp-rank":               "2",
				"x-kvgate-overlap-blocks":        "7",
				"x-prefiller-host-port":          "",
				"x-kvgate-explain":               "",
			}
			got := map[string]string{}
			for k := range want {
				got[k] = get(up.Headers, k)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("upstream headers (-want +got):\n%s", diff)
			}
			if got, want := string(up.BodyBytes()), chatBody; got != want {
				t.Errorf("upstream body %q, want %q", got, want)
			}
			lb := res.Info.DynamicMetadata["envoy.lb"].GetFields()["x-gateway-destination-endpoint"].GetStringValue()
			if lb != wantDestination {
				t.Errorf("envoy.lb metadata %q, want %q", lb, wantDestination)
			}
			if !res.Info.RouteCacheCleared {
				t.Error("route cache not cleared")
			}
			if res.Info.SpuriousMessages != 0 || res.Info.RejectedMutations != 0 {
				t.Errorf("spurious %d, rejected mutations %d, want 0, 0", res.Info.SpuriousMessages, res.Info.RejectedMutations)
			}
			down := res.Downstream
			if got, want := string(down.BodyBytes()), strings.Join(sseChunks, ""); got != want {
				t.Errorf("downstream body %q, want %q", got, want)
			}
			if got := get(down.Headers, "x-kvgate-worker-id"); got != "w1" {
				t.Errorf("response x-kvgate-worker-id %q, want w1", got)
			}
			if got := get(down.Headers, "x-kvgate-endpoint"); got != "10.0.0.1:8000" {
				t.Errorf("response x-kvgate-endpoint %q, want 10.0.0.1:8000", got)
			}
			reqs := d.requests()
			if len(reqs) != 1 {
				t.Fatalf("%d decisions, want 1", len(reqs))
			}
			// The lifecycle id is the server's own; the client's is kept
			// for logs.
			if !strings.HasPrefix(reqs[0].ID, "kvgate-") {
				t.Errorf("request id %q, want one the server made", reqs[0].ID)
			}
			wantReq := &globalrouter.Request{
				ClientID: "req-1", Path: "/v1/chat/completions", Model: "m1", BodyBytes: len(chatBody),
				Chat: tokenizer.NewChat(tokenizer.Message{Role: "system", Content: "Be brief."}, tokenizer.Message{Role: "user", Content: "héllo 世界, \"quoted\""}),
			}
			gotReq := *reqs[0]
			gotReq.Headers, gotReq.ID = nil, ""
			if diff := cmp.Diff(wantReq, &gotReq); diff != "" {
				t.Errorf("decider request (-want +got):\n%s", diff)
			}
			if got := reqs[0].Headers["content-type"]; got != "application/json" {
				t.Errorf("request headers content-type %q, want application/json", got)
			}
			testenv.Eventually(t, testCtxTimeout, func() (string, bool) {
				got := d.lease(t, 0).calls()
				return fmt.Sprintf("lease calls %v, want [prefill free]", got), cmp.Equal(got, []string{"prefill", "free"})
			})
		})
	}
}

func TestPrefillerAndExplain(t *testing.T) {
	d := &deciderDouble{decide: func(req *globalrouter.Request) (*globalrouter.Decision, error) {
		dec := fixedDecision()
		dec.Prefill = &globalrouter.Endpoint{Pool: "prefill", Selection: routing.Selection{WorkerID: "p1", Address: "10.0.2.1:8000"}}
		if !req.Explain {
			dec.Explanation = ""
		}
		return dec, nil
	}}
	conn, _ := startServer(t, extproc.Config{}, d)
	c := envoyClient(t, conn, allModes[0])
	res, err := c.Process(testenv.Context(t), extprocclient.Request{Message: extprocclient.Message{
		Headers: post("/v1/completions", extprocclient.HeaderField{Key: "x-kvgate-explain", Value: "1"}),
		Body:    [][]byte{[]byte(`{"model":"m1","prompt":[1,2,3]}`)},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := get(res.Upstream.Headers, "x-prefiller-host-port"), "10.0.2.1:8000"; got != want {
		t.Errorf("x-prefiller-host-port %q, want %q", got, want)
	}
	if got, want := get(res.Upstream.Headers, "x-kvgate-explain"), "pool-a: overlap 7 blocks; pool-b: overlap 0 blocks"; got != want {
		t.Errorf("x-kvgate-explain %q, want %q", got, want)
	}
	if got := d.requests()[0]; !got.Explain || !cmp.Equal(got.PromptTokens, []uint32{1, 2, 3}) {
		t.Errorf("request Explain %v tokens %v, want true [1 2 3]", got.Explain, got.PromptTokens)
	}
}

func TestClientPrefillerHeaderRemoved(t *testing.T) {
	d := &deciderDouble{}
	conn, _ := startServer(t, extproc.Config{}, d)
	c := envoyClient(t, conn, allModes[0])
	res, err := c.Process(testenv.Context(t), extprocclient.Request{Message: extprocclient.Message{
		Headers: post("/v1/completions", extprocclient.HeaderField{Key: "x-prefiller-host-port", Value: "6.6.6.6:1"}),
		Body:    [][]byte{[]byte(`{"model":"m1","prompt":"hi"}`)},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := res.Upstream.Headers.Get("x-prefiller-host-port"); ok {
		t.Errorf("x-prefiller-host-port %q reached upstream, want removed", v)
	}
}

func TestHealth(t *testing.T) {
	conn, _ := startServer(t, extproc.Config{}, &deciderDouble{})
	for _, svc := range []string{"", "envoy.service.ext_proc.v3.ExternalProcessor"} {
		r, err := healthpb.NewHealthClient(conn).Check(testenv.Context(t), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil {
			t.Fatal(err)
		}
		if r.Status != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health %q: %v, want SERVING", svc, r.Status)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	for _, cfg := range []extproc.Config{
		{InferencePaths: []string{"v1/completions"}},
		{InferencePaths: []string{"/v1/completions?x"}},
		{MaxBodyBytes: -1},
		{RequestBodyMode: extprocfilterv3.ProcessingMode_STREAMED},
		{ResponseBodyMode: extprocfilterv3.ProcessingMode_BUFFERED_PARTIAL},
	} {
		if _, err := extproc.New(cfg, &deciderDouble{}, nil, nil); err == nil {
			t.Errorf("New(%+v) accepted, want an error", cfg)
		}
	}
	if _, err := extproc.New(extproc.Config{}, nil, nil, nil); err == nil {
		t.Error("New with a nil decider accepted")
	}
}

func TestUnsupportedRequestMode(t *testing.T) {
	conn, _ := startServer(t, extproc.Config{}, &deciderDouble{})
	c := envoyClient(t, conn, modes{"STREAMED", extprocfilterv3.ProcessingMode_STREAMED, extprocfilterv3.ProcessingMode_STREAMED})
	res, err := c.Process(testenv.Context(t), extprocclient.Request{Message: extprocclient.Message{
		Headers: post("/v1/completions"), Body: [][]byte{[]byte(`{"model":"m1","prompt":"hi"}`)},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if lr := res.Info.LocalReply; lr == nil || lr.Status != 500 || get(lr.Headers, "x-kvgate-dropped-reason") != "unsupported_processing_mode" {
		t.Fatalf("local reply %+v, want 500 unsupported_processing_mode", lr)
	}
}

const testCtxTimeout = 20 * time.Second

func mustOK(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func drain(t *testing.T, ctx context.Context, read func(context.Context) (extprocclient.Frame, error)) {
	t.Helper()
	for {
		_, err := read(ctx)
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// readUntilData reads downstream frames up to the first data frame.
func readUntilData(t *testing.T, ctx context.Context, s *extprocclient.Stream) {
	t.Helper()
	for {
		f, err := s.ReadDownstream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if f.Kind == extprocclient.FrameData {
			return
		}
	}
}

// TestDestinationHeader: the endpoint-picker protocol forbids different
// values in the header and the envoy.lb metadata: both carry the ordered
// list (primary, then fallbacks). HeaderFallbacks is a no-op kept for old
// configurations.
func TestDestinationHeader(t *testing.T) {
	for _, tc := range []struct {
		name       string
		cfg        extproc.Config
		wantHeader string
	}{
		{"default: the list", extproc.Config{}, wantDestination},
		{"HeaderFallbacks (no-op): the list", extproc.Config{HeaderFallbacks: true}, wantDestination},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, _ := startServer(t, tc.cfg, &deciderDouble{})
			for _, m := range allModes {
				c := envoyClient(t, conn, m)
				res, err := c.Process(testenv.Context(t), extprocclient.Request{Message: extprocclient.Message{
					Headers: post("/v1/completions"), Body: [][]byte{[]byte(`{"model":"m1","prompt":"hi"}`)},
				}})
				if err != nil {
					t.Fatal(err)
				}
				if got := get(res.Upstream.Headers, "x-gateway-destination-endpoint"); got != tc.wantHeader {
					t.Errorf("%s: header %q, want %q", m.name, got, tc.wantHeader)
				}
				if got := res.Info.DynamicMetadata["envoy.lb"].GetFields()["x-gateway-destination-endpoint"].GetStringValue(); got != wantDestination {
					t.Errorf("%s: envoy.lb metadata %q, want %q", m.name, got, wantDestination)
				}
			}
		})
	}
}

func TestReflection(t *testing.T) {
	conn, _ := startServer(t, extproc.Config{}, &deciderDouble{})
	stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(testenv.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	r, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	_ = stream.CloseSend()
	var names []string
	for _, s := range r.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	for _, want := range []string{"envoy.service.ext_proc.v3.ExternalProcessor", "grpc.health.v1.Health"} {
		if !slices.Contains(names, want) {
			t.Errorf("reflection lists %v, want %s among them", names, want)
		}
	}
}

// chatMessages is r's conversation (nil for a completion).
func chatMessages(r *globalrouter.Request) []tokenizer.Message {
	if r.Chat == nil {
		return nil
	}
	return r.Chat.Messages
}
