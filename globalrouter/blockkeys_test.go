package globalrouter_test

import (
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/kvevents"
	"github.com/kvgate/kvgate/pool"
	"github.com/kvgate/kvgate/pool/pooltest"
	"github.com/kvgate/kvgate/tokenizer"
)

// TestSaltedRequestMatchesSaltedEvents: vLLM stores a salted request's
// chain with the cache_salt in the first block's extra_keys (fixture
// vllm_extra_keys, from vLLM's own structs). A request carrying that
// cache_salt in its body matches the chain, child store included; the
// same tokens unsalted, or with another salt, match nothing, as the
// engine would miss them.
func TestSaltedRequestMatchesSaltedEvents(t *testing.T) {
	srv := pooltest.Start(t, "pool-s", 4, pooltest.Workers("s", 1)...)
	cfg := globalrouter.DefaultConfig(pool.NewConfig("pool-s", 4, []string{model}, srv.Addr))
	cfg.Probe.Timeout = 10 * time.Second
	r, _ := newRouter(t, cfg)
	raw, err := os.ReadFile("../kvevents/testdata/vllm_extra_keys.msgpack")
	if err != nil {
		t.Fatal(err)
	}
	batch, err := kvevents.DecodeEnginePayload(raw, 4)
	if err != nil {
		t.Fatal(err)
	}
	for i, ev := range batch.Events {
		if err := srv.Router.ApplyEvent(kvevents.RouterEvent{WorkerID: "s-0", EventID: uint64(i + 1), Event: ev}); err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
	}
	// The salted chain: blocks 900..903, 904..907, then 950..953.
	var prompt []uint32
	for i := range 8 {
		prompt = append(prompt, uint32(900+i))
	}
	for i := range 4 {
		prompt = append(prompt, uint32(950+i))
	}
	for _, tc := range []struct {
		salt string
		want int
	}{{"tenant-a", 3}, {"", 0}, {"tenant-b", 0}} {
		// Through the body parser, as the ext_proc server reads it.
		body, err := tokenizer.ParseBody(tokenizer.PathCompletions, completionsBody(prompt, tc.salt))
		if err != nil {
			t.Fatal(err)
		}
		d, err := r.Decide(testenv.Context(t), &globalrouter.Request{Model: model, Path: tokenizer.PathCompletions, PromptTokens: body.PromptTokens, CacheSalt: body.CacheSalt})
		if err != nil {
			t.Fatalf("Decide(salt %q): %v", tc.salt, err)
		}
		if d.Primary.OverlapBlocks != tc.want {
			t.Errorf("salt %q: %d overlap blocks, want %d", tc.salt, d.Primary.OverlapBlocks, tc.want)
		}
		free(t, d)
	}
}

func completionsBody(prompt []uint32, salt string) []byte {
	b := []byte(`{"model":"` + model + `","prompt":[`)
	for i, id := range prompt {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendUint(b, uint64(id), 10)
	}
	b = append(b, ']')
	if salt != "" {
		b = append(b, []byte(`,"cache_salt":"`+salt+`"`)...)
	}
	return append(b, '}')
}

// TestSaltedAndUnsaltedNeverShareBlocks: no block key of a salted request
// equals any of the same request unsalted or under another salt.
func TestSaltedAndUnsaltedNeverShareBlocks(t *testing.T) {
	ids := chatTokens(t, chat(longText(120)))
	keys := map[string][]uint64{}
	for _, salt := range []string{"", "tenant-a", "tenant-b"} {
		k, err := globalrouter.BlockKeys(ids, 16, "", salt, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(k) < 4 {
			t.Fatalf("%d blocks, want a longer prompt", len(k))
		}
		keys[salt] = k
	}
	for a, ka := range keys {
		for b, kb := range keys {
			if a == b {
				continue
			}
			for i, h := range ka {
				if slices.Contains(kb, h) {
					t.Errorf("salt %q block %d = a block of salt %q", a, i, b)
				}
			}
		}
	}
}

// imageBody is a chat that shows an image after a long system prompt and
// asks a long question about it.
func imageBody(url string) []byte {
	return []byte(`{"model":"` + model + `","messages":[
		{"role":"system","content":"` + longText(60) + `"},
		{"role":"user","content":[{"type":"image_url","image_url":{"url":"` + url + `"}},{"type":"text","text":"` + longText(40) + `"}]}]}`)
}

// TestImagesKeyTheirBlocks: two requests with the same text and different
// images (identical placeholder tokens) hash equal before the image's
// block and differently from it on, and the router routes them so: the
// worker holding the first request's blocks (stored with the image's
// item, as vLLM's extra_keys carry it) matches all of them for the same
// image, only the text before it for the other.
func TestImagesKeyTheirBlocks(t *testing.T) {
	const bs = 16
	tok := sharedTokenizer(t)
	enc := func(url string) (*tokenizer.ChatRequest, []uint32, []kvevents.MMSpan, []uint64) {
		t.Helper()
		b, err := tokenizer.ParseBody(tokenizer.PathChat, imageBody(url))
		if err != nil {
			t.Fatal(err)
		}
		ids, mm, err := globalrouter.EncodeChat(tok, b.Chat)
		if err != nil {
			t.Fatal(err)
		}
		local, err := globalrouter.BlockKeys(ids, bs, "", "", mm)
		if err != nil {
			t.Fatal(err)
		}
		return b.Chat, ids, mm, local
	}
	chatA, idsA, mmA, localA := enc("https://img.example/a.png")
	_, idsB, mmB, localB := enc("https://img.example/b.png")
	if !slices.Equal(idsA, idsB) {
		t.Fatal("the two requests' ids differ; want identical placeholder tokens")
	}
	if len(mmA) != 1 || len(mmB) != 1 || mmA[0].Hash != kvevents.MMHash(chatA.MMHashes[0]) || mmA[0].Hash == mmB[0].Hash {
		t.Fatalf("items %+v, %+v; want one each, hashed from the parts' content hashes", mmA, mmB)
	}
	first := mmA[0].Offset / bs // the image's first block
	if first < 2 || first+2 > len(localA) {
		t.Fatalf("image block %d of %d; want text blocks on both sides", first, len(localA))
	}
	seqA, seqB := kvevents.SequenceHashes(localA), kvevents.SequenceHashes(localB)
	for i := range seqA {
		if same := seqA[i] == seqB[i]; same != (i < first) {
			t.Errorf("block %d: equal = %v, want %v (image from block %d)", i, same, i < first, first)
		}
	}

	// End to end: worker a-1 holds request A's blocks.
	c := newCluster(t)
	c.cfg.Pools = []pool.Config{pool.NewConfig("pool-a", bs, []string{model}, c.a.Addr)}
	r, _ := newRouter(t, c.cfg)
	var blocks []kvevents.Block
	for i := 0; i+bs <= len(idsA); i += bs {
		blk := kvevents.Block{EngineHash: uint64(100 + i), TokenIDs: idsA[i : i+bs]}
		if s := mmA[0]; s.Offset < i+bs && s.Offset+s.Length > i {
			blk.MMHashes = []uint64{s.Hash}
		}
		blocks = append(blocks, blk)
	}
	if err := c.a.Router.ApplyEvent(kvevents.RouterEvent{WorkerID: "a-1", EventID: 1, Event: kvevents.Event{Stored: &kvevents.Stored{Blocks: blocks}}}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		url  string
		want int
	}{{"https://img.example/a.png", len(blocks)}, {"https://img.example/b.png", first}} {
		b, err := tokenizer.ParseBody(tokenizer.PathChat, imageBody(tc.url))
		if err != nil {
			t.Fatal(err)
		}
		d, err := r.Decide(testenv.Context(t), &globalrouter.Request{Model: model, Path: tokenizer.PathChat, Chat: b.Chat})
		if err != nil {
			t.Fatalf("Decide(%s): %v", tc.url, err)
		}
		if d.Primary.WorkerID != "a-1" || d.Primary.OverlapBlocks != tc.want {
			t.Errorf("Decide(%s) = %s with %d overlap blocks, want a-1 with %d", tc.url, d.Primary.WorkerID, d.Primary.OverlapBlocks, tc.want)
		}
		free(t, d)
	}
}
