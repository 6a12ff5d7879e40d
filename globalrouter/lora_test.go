package globalrouter_test

import (
	"testing"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/kvevents"
	"github.com/kvgate/kvgate/pool"
	"github.com/kvgate/kvgate/tokenizer"
)

// TestLoRAAdapterHashesWithItsSeed: a model configured as a LoRA adapter
// (lora_of) is hashed with the adapter's seed, as the engine's KV events
// are: its requests match the adapter's cached blocks, and the base
// model's requests do not.
func TestLoRAAdapterHashesWithItsSeed(t *testing.T) {
	c := newCluster(t)
	const adapter = "sql-adapter"
	c.cfg.Pools = []pool.Config{pool.NewConfig("pool-a", 16, []string{model, adapter}, c.a.Addr)}
	c.cfg.Models = append(c.cfg.Models, globalrouter.ModelConfig{Name: adapter, LoRAOf: model})
	r, _ := newRouter(t, c.cfg, globalrouter.WithTokenizer(adapter, sharedTokenizer(t)))
	msgs := chat("Write a query that lists every order of the last week, grouped by customer, with totals and a running sum.")
	toks := chatTokens(t, msgs)
	if len(toks) < 32 {
		t.Fatalf("prompt of %d tokens is too short for two blocks", len(toks))
	}
	// The engine stores the adapter's blocks with the adapter's seed.
	var blocks []kvevents.Block
	for i := 0; i+16 <= len(toks); i += 16 {
		blocks = append(blocks, kvevents.Block{EngineHash: uint64(1 + i), TokenIDs: toks[i : i+16]})
	}
	if err := c.a.Router.ApplyEvent(kvevents.RouterEvent{WorkerID: "a-1", EventID: 1, Event: kvevents.Event{Stored: &kvevents.Stored{Blocks: blocks, LoRAName: adapter}}}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		model       string
		wantOverlap bool
	}{{adapter, true}, {model, false}} {
		d, err := r.Decide(testenv.Context(t), &globalrouter.Request{Model: tc.model, Chat: tokenizer.NewChat(msgs...), Path: "/v1/chat/completions"})
		if err != nil {
			t.Fatalf("Decide(%s): %v", tc.model, err)
		}
		got := d.Primary.OverlapBlocks > 0
		if got != tc.wantOverlap || (tc.wantOverlap && d.Primary.WorkerID != "a-1") {
			t.Errorf("Decide(%s) = %s with %d overlap blocks; want overlap %v on a-1", tc.model, d.Primary.WorkerID, d.Primary.OverlapBlocks, tc.wantOverlap)
		}
		free(t, d)
	}
}
