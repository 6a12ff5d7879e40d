package extproc

import (
	"strconv"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/proto"

	"github.com/kvgate/kvgate/globalrouter"
)

// routingHeadersBySetHeader is routingHeaders as it was before headerBatch:
// three allocations per header (setHeader). The reference of
// TestHeaderBatchSameWire and the floor of BenchmarkRoutingHeaders.
func routingHeadersBySetHeader(d *globalrouter.Decision, dest string, explain bool, hadPrefiller bool, trustHeader string) *extprocv3.HeaderMutation {
	hs := []*corev3.HeaderValueOption{
		setHeader(globalrouter.HeaderDestination, dest),
		setHeader(globalrouter.HeaderPool, d.Primary.Pool),
		setHeader(globalrouter.HeaderWorkerID, d.Primary.WorkerID),
		setHeader(globalrouter.HeaderDPRank, strconv.FormatUint(uint64(d.Primary.DPRank), 10)),
		setHeader(globalrouter.HeaderDataParallelRank, strconv.FormatUint(uint64(d.Primary.DPRank), 10)),
		setHeader(globalrouter.HeaderOverlapBlocks, strconv.Itoa(d.Primary.OverlapBlocks)),
	}
	m := &extprocv3.HeaderMutation{RemoveHeaders: []string{trustHeader, globalrouter.HeaderObjective}}
	if d.Prefill != nil {
		hs = append(hs, setHeader(globalrouter.HeaderPrefiller, d.Prefill.Address))
	} else if hadPrefiller {
		m.RemoveHeaders = append(m.RemoveHeaders, globalrouter.HeaderPrefiller)
	}
	if explain && d.Explanation != "" {
		hs = append(hs, setHeader(globalrouter.HeaderExplain, headerSafe(d.Explanation)))
	}
	m.SetHeaders = hs
	return m
}

func responseHeadersBySetHeader(d *globalrouter.Decision, ep globalrouter.Endpoint, explain bool) *extprocv3.HeaderMutation {
	hs := []*corev3.HeaderValueOption{
		setHeader(globalrouter.HeaderPool, ep.Pool),
		setHeader(globalrouter.HeaderWorkerID, ep.WorkerID),
		setHeader(globalrouter.HeaderDPRank, strconv.FormatUint(uint64(ep.DPRank), 10)),
		setHeader(globalrouter.HeaderOverlapBlocks, strconv.Itoa(ep.OverlapBlocks)),
		setHeader(globalrouter.HeaderEndpoint, ep.Address),
	}
	if d.Prefill != nil {
		hs = append(hs, setHeader(globalrouter.HeaderPrefiller, d.Prefill.Address))
	}
	if explain && d.Explanation != "" {
		hs = append(hs, setHeader(globalrouter.HeaderExplain, headerSafe(d.Explanation)))
	}
	return &extprocv3.HeaderMutation{SetHeaders: hs}
}

func testDecisions() []*globalrouter.Decision {
	long := ""
	for len(long) < 300 { // past headerBatch's reserve: the raw bytes grow
		long += "worker-with-a-long-name-"
	}
	ep := func(pool, id, addr string, rank uint32, overlap int) globalrouter.Endpoint {
		e := globalrouter.Endpoint{Pool: pool}
		e.WorkerID, e.Address, e.DPRank, e.OverlapBlocks = id, addr, rank, overlap
		return e
	}
	prim := ep("pool-a", "w-3", "10.0.0.3:8000", 2, 17)
	pre := ep("", "", "10.0.1.9:8000", 0, 0)
	longPre := ep("", "", long, 0, 0)
	return []*globalrouter.Decision{
		{Primary: prim},
		{Primary: globalrouter.Endpoint{}},
		{Primary: prim, Prefill: &pre, Explanation: "a → b\nµ ≤ 3"},
		{Primary: ep(long, long, long, 1<<32-1, -1), Prefill: &longPre, Explanation: long},
	}
}

// The batched headers are the same messages, byte for byte on the wire,
// as setHeader's, in every shape routingHeaders and responseHeaders
// build (prefill or not, explained or not, values past the reserve).
func TestHeaderBatchSameWire(t *testing.T) {
	opt := proto.MarshalOptions{Deterministic: true}
	for i, d := range testDecisions() {
		for _, explain := range []bool{false, true} {
			for _, had := range []bool{false, true} {
				pairs := [][2]*extprocv3.HeaderMutation{
					{routingHeaders(d, "dest:1,dest:2", explain, had, "x-trust"), routingHeadersBySetHeader(d, "dest:1,dest:2", explain, had, "x-trust")},
					{responseHeaders(d, d.Primary, explain), responseHeadersBySetHeader(d, d.Primary, explain)},
				}
				for j, p := range pairs {
					got, err1 := opt.Marshal(p[0])
					want, err2 := opt.Marshal(p[1])
					if err1 != nil || err2 != nil || string(got) != string(want) || !proto.Equal(p[0], p[1]) {
						t.Errorf("decision %d explain %v prefiller %v mutation %d: %v %v\n got %x\nwant %x", i, explain, had, j, err1, err2, got, want)
					}
				}
			}
		}
	}
}

// BenchmarkRoutingHeaders builds a routed request's header mutation and
// marshals it, as every routed request does: headerBatch against the
// per-header setHeader it replaced, in the same run.
func BenchmarkRoutingHeaders(b *testing.B) {
	d := testDecisions()[0]
	for _, c := range []struct {
		name  string
		build func(*globalrouter.Decision, string, bool, bool, string) *extprocv3.HeaderMutation
	}{{"setHeader", routingHeadersBySetHeader}, {"batch", routingHeaders}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := proto.Marshal(c.build(d, "10.0.0.3:8000,10.0.0.4:8000", false, false, "x-trust")); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// streamedBodyBySeven is streamedBody as it was before streamedReply:
// seven allocations per chunk.
func streamedBodyBySeven(request bool, b []byte, end bool) *extprocv3.ProcessingResponse {
	br := &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{
		BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
			StreamedResponse: &extprocv3.StreamedBodyResponse{Body: b, EndOfStream: end},
		}},
	}}
	if request {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: br}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: br}}
}

// The one-allocation streamed body reply is the same message, byte for
// byte, as the seven-allocation one: request and response side, empty
// and non-empty chunks, ending the stream or not.
func TestStreamedReplySameWire(t *testing.T) {
	opt := proto.MarshalOptions{Deterministic: true}
	for _, request := range []bool{false, true} {
		for _, b := range [][]byte{nil, {}, []byte("data: {\"x\":1}\n\n")} {
			for _, end := range []bool{false, true} {
				got, err1 := opt.Marshal(streamedBody(request, b, end))
				want, err2 := opt.Marshal(streamedBodyBySeven(request, b, end))
				if err1 != nil || err2 != nil || string(got) != string(want) || !proto.Equal(streamedBody(request, b, end), streamedBodyBySeven(request, b, end)) {
					t.Errorf("request %v body %q end %v: %v %v\n got %x\nwant %x", request, b, end, err1, err2, got, want)
				}
			}
		}
	}
}

// BenchmarkStreamedBody builds and marshals one streamed response chunk
// (an SSE token event), as every chunk of a streamed response does: the
// one-allocation reply against the seven-allocation one, same run.
func BenchmarkStreamedBody(b *testing.B) {
	chunk := []byte(`data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" token"}}]}` + "\n\n")
	for _, c := range []struct {
		name  string
		build func(bool, []byte, bool) *extprocv3.ProcessingResponse
	}{{"seven", streamedBodyBySeven}, {"one", streamedBody}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := proto.Marshal(c.build(false, chunk, false)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
