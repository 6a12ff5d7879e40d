package kvevents

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

type engineManifest struct {
	BlockSize int               `json:"block_size"`
	LoRANames map[string]string `json:"lora_names"`
	Cases     []string          `json:"cases"`
	Malformed []string          `json:"malformed"`
}

type engineWant struct {
	TS              float64            `json:"ts"`
	DPRank          uint32             `json:"dp_rank"`
	Events          []Event            `json:"events"`
	LocalHashes     [][]string         `json:"local_hashes"`
	Skipped         map[SkipReason]int `json:"skipped"`
	SkippedBlocks   int                `json:"skipped_blocks"`
	EngineBlockSize int                `json:"engine_block_size"`
}

func readManifest(t testing.TB) engineManifest {
	t.Helper()
	raw, err := os.ReadFile("testdata/engine_manifest.json")
	if err != nil {
		t.Fatal(err)
	}
	var m engineManifest
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func fixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name+".msgpack"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestEngineGolden decodes payloads built from vLLM's and SGLang's own
// struct definitions (testdata/vllm_gen.py, python3-msgpack) and compares
// with what the script says kvgate must see, including the block keys
// (computed there with python3-xxhash) of every stored block: base,
// adapter, salted and multimodal blocks.
func TestEngineGolden(t *testing.T) {
	m := readManifest(t)
	if len(m.Cases) == 0 {
		t.Fatal("no fixtures")
	}
	for _, name := range m.Cases {
		t.Run(name, func(t *testing.T) {
			raw, err := os.ReadFile(filepath.Join("testdata", name+".json"))
			if err != nil {
				t.Fatal(err)
			}
			var want engineWant
			if err := json.Unmarshal(raw, &want); err != nil {
				t.Fatal(err)
			}
			dec, err := NewVLLMDecoder(EngineDecoderConfig{BlockSize: m.BlockSize, LoRANames: m.LoRANames})
			if err != nil {
				t.Fatal(err)
			}
			got, err := dec.Decode(EngineFrames("kv-events", 41, fixture(t, name)))
			if err != nil {
				t.Fatal(err)
			}
			if got.Seq != 41 || got.Topic != "kv-events" {
				t.Errorf("seq %d topic %q, want 41 kv-events", got.Seq, got.Topic)
			}
			gotW := engineWant{TS: got.TS, DPRank: got.DPRank, Events: got.Events, Skipped: got.Skipped,
				SkippedBlocks: got.SkippedBlocks, EngineBlockSize: got.EngineBlockSize}
			for _, ev := range got.Events {
				if ev.Stored == nil {
					gotW.LocalHashes = append(gotW.LocalHashes, nil)
					continue
				}
				seed := ChainSeed(ev.Stored.LoRAName, ev.Stored.CacheSalt)
				hs := []string{}
				for _, b := range ev.Stored.Blocks {
					if len(b.TokenIDs) > 0 {
						hs = append(hs, strconv.FormatUint(b.Hash(seed), 10))
					}
				}
				gotW.LocalHashes = append(gotW.LocalHashes, hs)
			}
			if gotW.Skipped == nil {
				gotW.Skipped = map[SkipReason]int{}
			}
			if diff := cmp.Diff(want, gotW, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("decoded (-want +got):\n%s", diff)
			}
		})
	}
}

func TestEngineMalformed(t *testing.T) {
	m := readManifest(t)
	good := fixture(t, m.Cases[0])
	seq := make([]byte, 8)
	tests := []struct {
		name   string
		frames [][]byte
	}{
		{"two frames", [][]byte{[]byte("t"), good}},
		{"four frames", [][]byte{[]byte("t"), seq, good, good}},
		{"short sequence", [][]byte{[]byte("t"), seq[:4], good}},
	}
	for _, name := range m.Malformed {
		tests = append(tests, struct {
			name   string
			frames [][]byte
		}{name, [][]byte{nil, seq, fixture(t, name)}})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := DecodeEngineFrames(tt.frames, m.BlockSize); !errors.Is(err, ErrMalformed) {
				t.Errorf("error = %v, want ErrMalformed", err)
			}
		})
	}
}

func TestEngineEncodeRoundTrip(t *testing.T) {
	events := []Event{
		{Stored: &Stored{Blocks: []Block{{EngineHash: 1 << 63, TokenIDs: []uint32{1, 2}}, {EngineHash: 2, TokenIDs: []uint32{3, 4}}}}},
		{Stored: &Stored{ParentHash: ptr[uint64](2), LoRAName: "a", Blocks: []Block{{EngineHash: 3, TokenIDs: []uint32{5, 4294967295}}}}},
		{Removed: &Removed{EngineHashes: []uint64{1 << 63, 3}}},
		{Cleared: true},
	}
	p, err := EncodeEnginePayload(12.5, events, 3, 2)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeEnginePayload(p, 2)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(events, got.Events); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}
	if got.TS != 12.5 || got.DPRank != 3 {
		t.Errorf("ts %v rank %d, want 12.5 3", got.TS, got.DPRank)
	}
	if _, err := EncodeEnginePayload(0, events, 0, 4); !errors.Is(err, ErrInvalidEvent) {
		t.Errorf("encode with the wrong block size: %v, want ErrInvalidEvent", err)
	}
}

func FuzzDecodeEngineFrames(f *testing.F) {
	m := readManifest(f)
	for _, name := range append(m.Cases, m.Malformed...) {
		f.Add([]byte("kv-events"), uint64(7), fixture(f, name))
	}
	f.Fuzz(func(t *testing.T, topic []byte, seq uint64, payload []byte) {
		s := make([]byte, 8)
		binary.BigEndian.PutUint64(s, seq)
		b, err := DecodeEngineFrames([][]byte{topic, s, payload}, m.BlockSize)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v is not ErrMalformed", err)
			}
			return
		}
		for _, ev := range b.Events {
			re := RouterEvent{WorkerID: "w", Event: ev}
			if err := re.Validate(); err != nil {
				t.Fatalf("decoder produced an invalid event: %v", err)
			}
			if ev.Stored != nil {
				for _, blk := range ev.Stored.Blocks {
					if len(blk.TokenIDs) != m.BlockSize && (len(blk.TokenIDs) != 0 || ev.Stored.Medium == "") {
						t.Fatalf("block of %d tokens, want %d", len(blk.TokenIDs), m.BlockSize)
					}
				}
			}
		}
		// The encoder writes no extra_keys: compare without what they carry.
		for _, ev := range b.Events {
			if ev.Stored != nil {
				ev.Stored.CacheSalt = ""
				for i := range ev.Stored.Blocks {
					ev.Stored.Blocks[i].MMHashes = nil
				}
			}
		}
		// Whatever decodes re-encodes and decodes to the same events.
		p, err := EncodeEnginePayload(b.TS, b.Events, b.DPRank, m.BlockSize)
		if err != nil {
			t.Fatal(err)
		}
		again, err := DecodeEnginePayload(p, m.BlockSize)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(b.Events, again.Events); diff != "" {
			t.Fatalf("re-encoded events differ (-first +again):\n%s", diff)
		}
	})
}

func BenchmarkDecodeEnginePayload(b *testing.B) {
	events := make([]Event, 0, 16)
	var parent *uint64
	for i := range 16 {
		toks := make([]uint32, 16*4)
		blocks := make([]Block, 4)
		for j := range blocks {
			blocks[j] = Block{EngineHash: uint64(i*4 + j + 1), TokenIDs: toks[j*16 : (j+1)*16]}
		}
		events = append(events, Event{Stored: &Stored{ParentHash: parent, Blocks: blocks}})
		h := uint64(i*4 + 4)
		parent = &h
	}
	p, err := EncodeEnginePayload(1, events, 0, 16)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(p)))
	for b.Loop() {
		if _, err := DecodeEnginePayload(p, 16); err != nil {
			b.Fatal(err)
		}
	}
}

// FuzzVLLMDecoderStream feeds two payloads to one decoder, as a relay
// does: the state it keeps between messages (salted chains, KV cache group
// kinds) must not make it panic or emit invalid events.
func FuzzVLLMDecoderStream(f *testing.F) {
	m := readManifest(f)
	for i, name := range m.Cases {
		f.Add(fixture(f, name), fixture(f, m.Cases[(i+1)%len(m.Cases)]))
	}
	f.Fuzz(func(t *testing.T, a, b []byte) {
		dec, err := NewVLLMDecoder(EngineDecoderConfig{BlockSize: m.BlockSize, LoRANames: m.LoRANames})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range [][]byte{a, b} {
			batch, err := dec.Decode(EngineFrames("t", 1, p))
			if err != nil {
				if !errors.Is(err, ErrMalformed) {
					t.Fatalf("error %v is not ErrMalformed", err)
				}
				continue
			}
			for _, ev := range batch.Events {
				if err := (RouterEvent{WorkerID: "w", Event: ev}).Validate(); err != nil {
					t.Fatalf("decoder produced an invalid event: %v", err)
				}
			}
		}
	})
}
