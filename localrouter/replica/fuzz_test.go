package replica

import (
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// FuzzDecodeMessage: any bytes off NATS decode to a valid message or an
// error, never a panic or a huge allocation, and what decodes re-encodes to
// the same message.
func FuzzDecodeMessage(f *testing.F) {
	for _, m := range []Message{
		{RouterID: "r1", Op: OpAdd, RequestID: "q", WorkerID: "w", DPRank: 1, LocalHashes: []uint64{1, 2, 3}, ISL: 48, OverlapBlocks: 1, Record: true},
		{RouterID: "r2", Op: OpPrefillComplete, RequestID: "q"},
		{RouterID: "r2", Op: OpFree, RequestID: "q"},
	} {
		b, err := msgpack.Marshal(&m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0x81, 0xac, 'l', 'o', 'c', 'a', 'l', '_', 'h', 'a', 's', 'h', 'e', 's', 0xdd, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeMessage(b)
		if err != nil {
			return
		}
		again, err := msgpack.Marshal(&m)
		if err != nil {
			t.Fatalf("decoded message does not encode: %v", err)
		}
		m2, err := DecodeMessage(again)
		if err != nil {
			t.Fatalf("re-encoded message does not decode: %v", err)
		}
		if m2.Op != m.Op || m2.RequestID != m.RequestID || len(m2.LocalHashes) != len(m.LocalHashes) {
			t.Fatalf("round trip changed the message: %+v → %+v", m, m2)
		}
	})
}
