package kvevents

import (
	"encoding/json"
	"os"
	"strconv"
	"testing"

	"github.com/zeebo/xxh3"
)

// TestXXH3AgainstReference checks the specialised paths against vectors of
// python3-xxhash (testdata/gen_xxh3_vectors.py) for every length 0..256
// and several seeds, and against github.com/zeebo/xxh3.
func TestXXH3AgainstReference(t *testing.T) {
	raw, err := os.ReadFile("testdata/xxh3_vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var vs []struct {
		Len  int    `json:"len"`
		Seed string `json:"seed"`
		Hash string `json:"hash"`
	}
	if err := json.Unmarshal(raw, &vs); err != nil {
		t.Fatal(err)
	}
	if len(vs) < 257 {
		t.Fatalf("only %d vectors", len(vs))
	}
	data := make([]byte, 256)
	for i := range data {
		data[i] = byte(i*131 + 7)
	}
	for _, v := range vs {
		seed, _ := strconv.ParseUint(v.Seed, 10, 64)
		want, _ := strconv.ParseUint(v.Hash, 10, 64)
		p := data[:v.Len]
		if got := hashBytes(p, seed); got != want {
			t.Errorf("hashBytes(len %d, seed %d) = %d, want %d", v.Len, seed, got, want)
		}
		if got := xxh3.HashSeed(p, seed); got != want {
			t.Errorf("zeebo HashSeed(len %d, seed %d) = %d, want %d", v.Len, seed, got, want)
		}
		if v.Len == 16 {
			if got := hash16(le64(p, 0), le64(p, 8), seed); got != want {
				t.Errorf("hash16(seed %d) = %d, want %d", seed, got, want)
			}
		}
	}
}

func BenchmarkHash16(b *testing.B) {
	var s uint64
	for b.Loop() {
		s = hash16(s, 42, Seed)
	}
	_ = s
}

func BenchmarkBlockHash16Tokens(b *testing.B) {
	toks := make([]uint32, 16)
	var s uint64
	for b.Loop() {
		s += BlockHash(toks, Seed)
	}
	_ = s
}
