package kvevents

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func ptr[T any](v T) *T { return &v }

func sampleEvents() []RouterEvent {
	return []RouterEvent{
		{WorkerID: "w0", DPRank: 1, EventID: 1, Event: Event{Stored: &Stored{
			Blocks: []Block{{EngineHash: 10, TokenIDs: []uint32{1, 2, 3, 4}}, {EngineHash: 11, TokenIDs: []uint32{5, 6, 7, 8}}},
		}}},
		{WorkerID: "w0", EventID: 2, Event: Event{Stored: &Stored{
			ParentHash: ptr[uint64](11), LoRAName: "x",
			Blocks: []Block{{EngineHash: 1<<63 + 5, TokenIDs: []uint32{4294967295, 0, 0, 1}}},
		}}},
		{WorkerID: "w1", EventID: 3, Event: Event{Removed: &Removed{EngineHashes: []uint64{10, 11}}}},
		{WorkerID: "w1", EventID: 4, Event: Event{Cleared: true}},
	}
}

func TestEncodingsRoundTrip(t *testing.T) {
	for _, e := range sampleEvents() {
		j, err := EncodeJSON(e)
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeJSON(j)
		if err != nil {
			t.Fatalf("DecodeJSON(%s): %v", j, err)
		}
		if diff := cmp.Diff(e, got); diff != "" {
			t.Errorf("json round trip (-want +got):\n%s", diff)
		}
		m, err := EncodeMsgpack(e)
		if err != nil {
			t.Fatal(err)
		}
		got, err = DecodeMsgpack(m)
		if err != nil {
			t.Fatalf("DecodeMsgpack: %v", err)
		}
		if diff := cmp.Diff(e, got); diff != "" {
			t.Errorf("msgpack round trip (-want +got):\n%s", diff)
		}
	}
}

func TestValidateRejects(t *testing.T) {
	tests := []struct {
		name string
		in   string
	}{
		{"not json", `{"worker_id":`},
		{"no worker", `{"event":{"cleared":true}}`},
		{"no variant", `{"worker_id":"w","event":{}}`},
		{"two variants", `{"worker_id":"w","event":{"cleared":true,"removed":{"engine_hashes":[1]}}}`},
		{"stored without blocks", `{"worker_id":"w","event":{"stored":{"blocks":[]}}}`},
		{"block without tokens", `{"worker_id":"w","event":{"stored":{"blocks":[{"engine_hash":1}]}}}`},
		{"negative hash", `{"worker_id":"w","event":{"removed":{"engine_hashes":[-1]}}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := DecodeJSON([]byte(tt.in)); !errors.Is(err, ErrInvalidEvent) {
				t.Errorf("DecodeJSON(%s) error = %v, want ErrInvalidEvent", tt.in, err)
			}
		})
	}
}

func FuzzDecode(f *testing.F) {
	for _, e := range sampleEvents() {
		j, _ := EncodeJSON(e)
		m, _ := EncodeMsgpack(e)
		f.Add(j)
		f.Add(m)
	}
	f.Add([]byte{0xc1})
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, dec := range []func([]byte) (RouterEvent, error){DecodeJSON, DecodeMsgpack} {
			e, err := dec(b)
			if err != nil {
				continue
			}
			if err := e.Validate(); err != nil {
				t.Fatalf("decoder returned an invalid event: %v", err)
			}
		}
	})
}

// TestDecodeMsgpackHugeLength: a header claiming 2^32-1 array elements in a
// few bytes is refused before msgpack allocates for it.
func TestDecodeMsgpackHugeLength(t *testing.T) {
	for _, b := range [][]byte{
		{0xdd, 0xff, 0xff, 0xff, 0xff},      // array32 of 4G elements
		{0xdf, 0xff, 0xff, 0xff, 0xff},      // map32
		{0xdb, 0xff, 0xff, 0xff, 0xff, 'a'}, // str32
		{0x84, 0xa9, 'w', 'o', 'r', 'k', 'e', 'r', '_', 'i', 'd', 0xdd, 0x7f, 0xff, 0xff, 0xff},
	} {
		if _, err := DecodeMsgpack(b); !errors.Is(err, ErrInvalidEvent) {
			t.Errorf("DecodeMsgpack(% x) = %v, want ErrInvalidEvent", b, err)
		}
	}
}

// TestDecodeDeepNesting: msgpack nested past MaxMsgpackDepth is refused
// before decoding (a deep nest in an unknown field would overflow the
// decoder's stack, a fatal error).
func TestDecodeDeepNesting(t *testing.T) {
	deep := func(n int) []byte {
		b := []byte{0x82, 0xa9, 'w', 'o', 'r', 'k', 'e', 'r', '_', 'i', 'd', 0xa1, 'w', 0xa1, 'x'}
		for i := 0; i < n; i++ {
			b = append(b, 0x91) // fixarray of one
		}
		return append(b, 0xc0)
	}
	if _, err := DecodeMsgpack(deep(100000)); !errors.Is(err, ErrInvalidEvent) {
		t.Errorf("100000-deep nest: got %v, want ErrInvalidEvent", err)
	}
	if err := CheckMsgpack(deep(10)); err != nil {
		t.Errorf("10-deep nest refused: %v", err)
	}
	if _, err := DecodeEnginePayload(deep(100000), 16); !errors.Is(err, ErrMalformed) {
		t.Errorf("engine payload 100000 deep: got %v, want ErrMalformed", err)
	}
}
