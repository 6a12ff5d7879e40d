package extprocclient

import (
	"testing"

	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
)

func metadata(t *testing.T, m map[string]map[string]any) map[string]*structpb.Struct {
	t.Helper()
	out := map[string]*structpb.Struct{}
	for ns, fields := range m {
		st, err := structpb.NewStruct(fields)
		if err != nil {
			t.Fatal(err)
		}
		out[ns] = st
	}
	return out
}

func grpcCode(err error) string { return status.Code(err).String() }
