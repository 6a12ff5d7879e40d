package extproc_test

import (
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvgate/kvgate/extproc"
	"github.com/kvgate/kvgate/internal/testenv"
)

// A request body or trailers before the request headers (which Envoy never
// sends) end the stream with FailedPrecondition, not a panic: no body mode
// is chosen for a request whose headers were not seen.
func TestBodyBeforeHeaders(t *testing.T) {
	conn, _ := startServer(t, extproc.Config{}, &deciderDouble{})
	for _, first := range []*extprocv3.ProcessingRequest{
		{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte("{}"), EndOfStream: true}}},
		{Request: &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{}}},
	} {
		st, err := extprocv3.NewExternalProcessorClient(conn).Process(testenv.Context(t))
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Send(first); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Recv(); status.Code(err) != codes.FailedPrecondition {
			t.Errorf("%T first: Recv error %v, want FailedPrecondition", first.Request, err)
		}
	}
}
