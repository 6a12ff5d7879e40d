package extproc

import (
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/structpb"
)

// FuzzSubsetOf: whatever the data plane sends as the subset hint (a list
// of values of any kind, or a string), subsetOf never panics, keeps at
// most maxSubsetEntries entries, none empty, none with a comma or
// surrounding space; servedOf likewise returns a trimmed value.
func FuzzSubsetOf(f *testing.F) {
	f.Add("10.0.0.1:8000,10.0.0.2:8000", uint8(0), 2)
	f.Add(" , ,", uint8(1), 0)
	f.Add("[::1]:80", uint8(2), 5000)
	f.Fuzz(func(t *testing.T, s string, kind uint8, n int) {
		n = max(0, min(n, 3*maxSubsetEntries))
		var v *structpb.Value
		switch kind % 3 {
		case 0:
			v = structpb.NewStringValue(s)
		case 1:
			vals := make([]*structpb.Value, 0, n)
			for i := range n {
				if i%3 == 2 {
					vals = append(vals, structpb.NewNumberValue(float64(i)))
				} else {
					vals = append(vals, structpb.NewStringValue(s))
				}
			}
			v = structpb.NewListValue(&structpb.ListValue{Values: vals})
		default:
			v = structpb.NewBoolValue(true)
		}
		md := &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
			SubsetNamespace:   {Fields: map[string]*structpb.Value{SubsetKey: v}},
			MetadataNamespace: {Fields: map[string]*structpb.Value{ServedKey: structpb.NewStringValue(s)}},
		}}
		sub := subsetOf(md)
		if sub == nil {
			t.Fatal("key present, subset nil")
		}
		if len(sub.Addresses) > maxSubsetEntries {
			t.Fatalf("%d entries kept, bound %d", len(sub.Addresses), maxSubsetEntries)
		}
		for _, a := range sub.Addresses {
			if a == "" || strings.Contains(a, ",") || strings.TrimSpace(a) != a {
				t.Fatalf("entry %q", a)
			}
		}
		if got := servedOf(md); got != strings.TrimSpace(got) {
			t.Fatalf("served %q not trimmed", got)
		}
	})
}
