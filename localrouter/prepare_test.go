package localrouter

import (
	"slices"
	"testing"

	"github.com/kvgate/kvgate/kvevents"
)

// TestPrepareReusesSharedPrefix: prepare reuses the sequence hashes of
// the blocks a request shares with the last one prepared on the scratch,
// and the result is always the chain kvevents computes from scratch —
// through longer, shorter, equal, unrelated and token requests, and
// after errors.
func TestPrepareReusesSharedPrefix(t *testing.T) {
	cfg := DefaultConfig()
	cfg.BlockSize = 4
	r, err := New(cfg, Options{SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	base := []uint64{11, 12, 13, 14, 15, 16}
	tokens := make([]uint32, 4*5)
	for i := range tokens {
		tokens[i] = uint32(i)
	}
	steps := []struct {
		name string
		req  Request
		err  bool
	}{
		{"first", Request{LocalHashes: base, BlockSize: 4}, false},
		{"longer", Request{LocalHashes: append(slices.Clone(base), 17, 18), BlockSize: 4}, false},
		{"shorter", Request{LocalHashes: base[:3], BlockSize: 4}, false},
		{"parts at 2", Request{LocalHashes: []uint64{11, 12, 99, 14}, BlockSize: 4}, false},
		{"equal", Request{LocalHashes: []uint64{11, 12, 99, 14}, BlockSize: 4}, false},
		{"first differs", Request{LocalHashes: []uint64{12, 12, 99, 14}, BlockSize: 4}, false},
		{"wrong block size", Request{LocalHashes: base, BlockSize: 8}, true},
		{"after an error", Request{LocalHashes: base, BlockSize: 4}, false},
		{"tokens", Request{Tokens: tokens}, false},
		{"hashes after tokens", Request{LocalHashes: base, BlockSize: 4}, false},
		{"empty", Request{}, true},
		{"after empty", Request{LocalHashes: base[:2], BlockSize: 4}, false},
	}
	s := new(scratch)
	for _, st := range steps {
		_, err := r.prepare(&st.req, s)
		if (err != nil) != st.err {
			t.Fatalf("%s: err %v", st.name, err)
		}
		if err != nil {
			continue
		}
		want := st.req.LocalHashes
		if want == nil {
			want, _ = kvevents.AppendRequestHashes(nil, st.req.Tokens, 4, "", "", nil)
		}
		if !slices.Equal(s.local, want) {
			t.Fatalf("%s: local %v, want %v", st.name, s.local, want)
		}
		if got, want := s.seq, kvevents.SequenceHashes(want); !slices.Equal(got, want) {
			t.Fatalf("%s: seq %v, want %v", st.name, got, want)
		}
	}
}
