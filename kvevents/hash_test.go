package kvevents

import (
	"encoding/json"
	"errors"
	"os"
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestHashVectors checks kvgate's hashing against vectors made by an
// independent XXH3 (python3-xxhash; see testdata/gen_vectors.py).
func TestHashVectors(t *testing.T) {
	raw, err := os.ReadFile("testdata/hash_vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Cases []struct {
			Name      string           `json:"name"`
			Tokens    []uint32         `json:"tokens"`
			BlockSize int              `json:"block_size"`
			LoRA      string           `json:"lora"`
			Salt      string           `json:"salt"`
			MM        [][3]json.Number `json:"mm"`
			Local     []string         `json:"local"`
			Sequence  []string         `json:"sequence"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(raw, &file); err != nil {
		t.Fatal(err)
	}
	if len(file.Cases) == 0 {
		t.Fatal("no vectors")
	}
	parse := func(ss []string) []uint64 {
		out := make([]uint64, 0, len(ss))
		for _, s := range ss {
			v, err := strconv.ParseUint(s, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, v)
		}
		return out
	}
	for _, c := range file.Cases {
		t.Run(c.Name, func(t *testing.T) {
			var mm []MMSpan
			for _, x := range c.MM {
				h, _ := strconv.ParseUint(x[0].String(), 10, 64)
				off, _ := x[1].Int64()
				n, _ := x[2].Int64()
				mm = append(mm, MMSpan{Hash: h, Offset: int(off), Length: int(n)})
			}
			local, err := RequestHashes(c.Tokens, c.BlockSize, c.LoRA, c.Salt, mm)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(parse(c.Local), local); diff != "" {
				t.Errorf("local hashes (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(parse(c.Sequence), SequenceHashes(local)); diff != "" {
				t.Errorf("sequence hashes (-want +got):\n%s", diff)
			}
		})
	}
}

func TestLocalHashesBadBlockSize(t *testing.T) {
	for _, bs := range []int{0, -16} {
		if _, err := LocalHashes([]uint32{1, 2, 3}, bs, ""); !errors.Is(err, ErrBlockSize) {
			t.Errorf("LocalHashes(block size %d) error = %v, want ErrBlockSize", bs, err)
		}
	}
}

func TestLoRASeparatesBlocks(t *testing.T) {
	toks := []uint32{1, 2, 3, 4}
	base, _ := LocalHashes(toks, 4, "")
	a, _ := LocalHashes(toks, 4, "a")
	b, _ := LocalHashes(toks, 4, "b")
	if base[0] == a[0] || a[0] == b[0] {
		t.Errorf("adapters share hashes: base %x a %x b %x", base[0], a[0], b[0])
	}
}

func BenchmarkLocalHashes512x16(b *testing.B) {
	toks := make([]uint32, 512*16)
	for i := range toks {
		toks[i] = uint32(i * 31)
	}
	dst := make([]uint64, 0, 512)
	b.ReportAllocs()
	b.SetBytes(int64(len(toks) * 4))
	for b.Loop() {
		dst, _ = AppendLocalHashes(dst[:0], toks, 16, "")
	}
}

func BenchmarkSequenceHashes512(b *testing.B) {
	local := make([]uint64, 512)
	for i := range local {
		local[i] = uint64(i) * 0x9e3779b97f4a7c15
	}
	dst := make([]uint64, 0, 512)
	b.ReportAllocs()
	for b.Loop() {
		dst = AppendSequenceHashes(dst[:0], local)
	}
}
