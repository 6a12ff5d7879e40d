package server

import (
	"encoding/binary"
	"errors"
	"testing"
)

func TestUnpackHashes(t *testing.T) {
	b := binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, 1), 1<<63|7)
	got, err := unpackHashes(b)
	if err != nil || len(got) != 2 || got[0] != 1 || got[1] != 1<<63|7 {
		t.Fatalf("unpackHashes = %v, %v; want [1 %d]", got, err, uint64(1<<63|7))
	}
	if _, err := unpackHashes(b[:9]); !errors.Is(err, errInvalidArgument) {
		t.Errorf("9 bytes: err = %v, want invalid argument", err)
	}
}

// FuzzUnpackHashes: any bytes decode or fail cleanly, and what decodes
// re-encodes to the same bytes.
func FuzzUnpackHashes(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8})
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		hs, err := unpackHashes(b)
		if err != nil {
			if len(b)%8 == 0 {
				t.Fatalf("%d bytes refused: %v", len(b), err)
			}
			return
		}
		var out []byte
		for _, h := range hs {
			out = binary.LittleEndian.AppendUint64(out, h)
		}
		if string(out) != string(b) {
			t.Fatalf("round trip changed the bytes")
		}
	})
}
