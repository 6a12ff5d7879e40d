package kvevents

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// TestSGLangSaltKeysAsSaltedRequest: the stores of SGLang's salted
// fixtures (testdata/vllm_gen.py, from SGLang's BlockStoredWithMetadata and
// its later tagged-map BlockStored) key exactly the blocks a request with
// that cache_salt computes (Dynamo's compute_salt_hash seed), and the
// unsalted stores of the same tokens exactly an unsalted request's: an
// unsalted request never counts salted blocks.
func TestSGLangSaltKeysAsSaltedRequest(t *testing.T) {
	m := readManifest(t)
	tests := []struct {
		fixture        string
		salt           string
		salted, plain  []int // event indexes
		tokens0, ntoks uint32
	}{
		{"sglang_salted_array", "tenant-a", []int{0, 1}, []int{2}, 1900, 8},
		{"sglang_salted_map", "tenant-b", []int{0}, []int{1}, 2000, 8},
	}
	for _, tt := range tests {
		t.Run(tt.fixture, func(t *testing.T) {
			dec, err := NewVLLMDecoder(EngineDecoderConfig{BlockSize: m.BlockSize})
			if err != nil {
				t.Fatal(err)
			}
			b, err := dec.Decode(EngineFrames("t", 1, fixture(t, tt.fixture)))
			if err != nil {
				t.Fatal(err)
			}
			keys := func(idx []int) []uint64 {
				var out []uint64
				for _, i := range idx {
					st := b.Events[i].Stored
					seed := ChainSeed(st.LoRAName, st.CacheSalt)
					for _, blk := range st.Blocks {
						out = append(out, blk.Hash(seed))
					}
				}
				return out
			}
			toks := make([]uint32, tt.ntoks)
			for i := range toks {
				toks[i] = tt.tokens0 + uint32(i)
			}
			salted, _ := RequestHashes(toks, m.BlockSize, "", tt.salt, nil)
			plain, _ := RequestHashes(toks, m.BlockSize, "", "", nil)
			gotSalted, gotPlain := keys(tt.salted), keys(tt.plain)
			if !slices.Equal(gotSalted, salted[:len(gotSalted)]) {
				t.Errorf("salted stores key %v, a request salted %q computes %v", gotSalted, tt.salt, salted)
			}
			if !slices.Equal(gotPlain, plain[:len(gotPlain)]) {
				t.Errorf("unsalted stores key %v, an unsalted request computes %v", gotPlain, plain)
			}
			for _, h := range gotSalted {
				if slices.Contains(plain, h) {
					t.Errorf("salted block %d matches an unsalted request", h)
				}
			}
		})
	}
}

// TestSGLangMetadataBad: a salt of the wrong type is a malformed event
// (skipped and counted; the batch's other events kept), and the error
// names the field.
func TestSGLangMetadataBad(t *testing.T) {
	stored := func(tail ...any) []any {
		return append([]any{"BlockStored", []any{1}, nil, []any{1, 2, 3, 4}, 4, nil, "GPU"}, tail...)
	}
	good := stored()
	tests := []struct {
		name  string
		event any
		want  string
	}{
		{"metadata salt not a string", stored(map[string]any{"cache_salt": 5}), "metadata.cache_salt"},
		{"metadata key not a string", stored(map[any]any{7: "x"}), "metadata key"},
		{"map cache_salt not a string", map[string]any{"type": "BlockStored", "block_hashes": []any{1},
			"parent_block_hash": nil, "token_ids": []any{1, 2, 3, 4}, "block_size": 4, "cache_salt": []any{"x"}}, "cache_salt"},
		{"map metadata not a map", map[string]any{"type": "BlockStored", "block_hashes": []any{1},
			"parent_block_hash": nil, "token_ids": []any{1, 2, 3, 4}, "block_size": 4, "metadata": "x"}, "metadata"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := msgpack.Marshal([]any{1.0, []any{tt.event, good}})
			if err != nil {
				t.Fatal(err)
			}
			b, err := DecodeEnginePayload(p, 4)
			if err != nil {
				t.Fatal(err)
			}
			if b.Skipped[SkipMalformed] != 1 || len(b.Events) != 1 || b.Events[0].Stored.CacheSalt != "" {
				t.Errorf("skipped %v events %d, want the bad event skipped and the good one kept unsalted", b.Skipped, len(b.Events))
			}
			ev, err := msgpack.Marshal(tt.event)
			if err != nil {
				t.Fatal(err)
			}
			d := newVLLMDecoder(EngineDecoderConfig{BlockSize: 4})
			d.cur = msgpack.NewDecoder(bytes.NewReader(ev))
			err = d.event(&EngineBatch{})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %v, want one naming %q", err, tt.want)
			}
		})
	}
}

// TestSGLangMetadataNil: a nil metadata, a nil salt and metadata without a
// salt (session_id only) leave the store unsalted.
func TestSGLangMetadataNil(t *testing.T) {
	for _, md := range []any{nil, map[string]any{"cache_salt": nil}, map[string]any{"session_id": "s"}} {
		ev := []any{"BlockStored", []any{1}, nil, []any{1, 2, 3, 4}, 4, nil, "GPU", md}
		p, err := msgpack.Marshal([]any{1.0, []any{ev}})
		if err != nil {
			t.Fatal(err)
		}
		b, err := DecodeEnginePayload(p, 4)
		if err != nil || len(b.Events) != 1 || b.Events[0].Stored.CacheSalt != "" || b.Events[0].Stored.LoRAName != "" {
			t.Errorf("metadata %v: %v %+v, want one unsalted store", md, err, b)
		}
	}
}

// TestEncodeSaltedStoreAsVLLM: a salted store encoded as the mocker sends
// it (the salt in the first block's extra_keys, vLLM's place) decodes to
// the same salt, its chain's later store inherits it, and the blocks key
// exactly what a request with that cache_salt computes.
func TestEncodeSaltedStoreAsVLLM(t *testing.T) {
	const bs = 4
	toks := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	want, _ := RequestHashes(toks, bs, "", "tenant-x", nil)
	first := &Stored{CacheSalt: "tenant-x", Blocks: []Block{{EngineHash: 101, TokenIDs: toks[0:4]}, {EngineHash: 102, TokenIDs: toks[4:8]}}}
	p := uint64(102)
	second := &Stored{CacheSalt: "tenant-x", ParentHash: &p, Blocks: []Block{{EngineHash: 103, TokenIDs: toks[8:12]}}}
	payload, err := EncodeEnginePayload(1, []Event{{Stored: first}, {Stored: second}}, 0, bs)
	if err != nil {
		t.Fatal(err)
	}
	dec, err := NewVLLMDecoder(EngineDecoderConfig{BlockSize: bs})
	if err != nil {
		t.Fatal(err)
	}
	b, err := dec.Decode(EngineFrames("t", 0, payload))
	if err != nil {
		t.Fatal(err)
	}
	var got []uint64
	for _, ev := range b.Events {
		if ev.Stored == nil || ev.Stored.CacheSalt != "tenant-x" {
			t.Fatalf("decoded %+v, want salted stores", ev)
		}
		seed := ChainSeed("", ev.Stored.CacheSalt)
		for _, blk := range ev.Stored.Blocks {
			got = append(got, blk.Hash(seed))
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("decoded keys %v, a request salted tenant-x computes %v", got, want)
	}
}
