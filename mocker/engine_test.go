package mocker

import (
	"errors"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/kvgate/kvgate/kvevents"
)

var t0 = time.Unix(1_700_000_000, 0)

func prompt(seed uint32, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = seed*100003 + uint32(i)
	}
	return out
}

// run drives eng until idle, applying its events to blocks, and returns the
// completions by id.
func run(t *testing.T, eng *Engine, now time.Time, blocks map[uint64]struct{}) map[string]Completion {
	t.Helper()
	done := map[string]Completion{}
	res := eng.Step(now)
	for i := 0; ; i++ {
		applyEvents(t, blocks, res.Events)
		for _, c := range res.Completed {
			done[c.RequestID] = c
		}
		if res.Next.IsZero() {
			return done
		}
		if i > 1_000_000 {
			t.Fatal("engine never went idle")
		}
		res = eng.Step(res.Next)
	}
}

func applyEvents(t *testing.T, blocks map[uint64]struct{}, events []kvevents.Event) {
	t.Helper()
	for _, ev := range events {
		switch {
		case ev.Stored != nil:
			if p := ev.Stored.ParentHash; p != nil {
				if _, ok := blocks[*p]; !ok {
					t.Errorf("stored chain under unknown parent %x", *p)
				}
			}
			for _, b := range ev.Stored.Blocks {
				if _, dup := blocks[b.EngineHash]; dup {
					t.Errorf("block %x stored twice", b.EngineHash)
				}
				blocks[b.EngineHash] = struct{}{}
			}
		case ev.Removed != nil:
			for _, h := range ev.Removed.EngineHashes {
				if _, ok := blocks[h]; !ok {
					t.Errorf("removed unknown block %x", h)
				}
				delete(blocks, h)
			}
		case ev.Cleared:
			clear(blocks)
		}
	}
}

func TestSubmitRejects(t *testing.T) {
	eng, err := NewEngine(Config{BlockSize: 4, NumBlocks: 8})
	if err != nil {
		t.Fatal(err)
	}
	if err := eng.Submit(t0, Request{ID: "ok", Tokens: prompt(1, 4), MaxTokens: 1}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		req  Request
		want error
	}{
		{"no id", Request{Tokens: prompt(1, 4), MaxTokens: 1}, ErrBadRequest},
		{"no prompt", Request{ID: "a", MaxTokens: 1}, ErrBadRequest},
		{"zero max tokens", Request{ID: "a", Tokens: prompt(1, 4)}, ErrBadRequest},
		{"duplicate", Request{ID: "ok", Tokens: prompt(1, 4), MaxTokens: 1}, ErrBadRequest},
		{"too long", Request{ID: "a", Tokens: prompt(1, 30), MaxTokens: 3}, ErrTooLong},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := eng.Submit(t0, tt.req); !errors.Is(err, tt.want) {
				t.Errorf("Submit error = %v, want %v", err, tt.want)
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []Config{
		{Role: "boss"},
		{BlockSize: -1},
		{BlockSize: 64, MaxNumBatchedTokens: 32},
		{Speedup: -1},
	} {
		if _, err := NewEngine(c); !errors.Is(err, ErrConfig) {
			t.Errorf("NewEngine(%+v) error = %v, want ErrConfig", c, err)
		}
	}
}

func TestSingleRequestTiming(t *testing.T) {
	eng, _ := NewEngine(Config{BlockSize: 16, NumBlocks: 64})
	if err := eng.Submit(t0, Request{ID: "r", Tokens: prompt(1, 100), MaxTokens: 3}); err != nil {
		t.Fatal(err)
	}
	res := eng.Step(t0)
	wantFirst := t0.Add(DefaultTiming{}.IterationTime(Batch{PrefillTokens: 100}))
	if !res.Next.Equal(wantFirst) {
		t.Fatalf("Next = %v, want %v", res.Next.Sub(t0), wantFirst.Sub(t0))
	}
	blocks := map[uint64]struct{}{}
	applyEvents(t, blocks, res.Events)
	done := run(t, eng, res.Next, blocks)
	c := done["r"]
	if c.TTFT() != wantFirst.Sub(t0) {
		t.Errorf("TTFT = %v, want %v", c.TTFT(), wantFirst.Sub(t0))
	}
	if c.OutputTokens != 3 || c.PromptTokens != 100 || c.Reason != FinishLength {
		t.Errorf("completion = %+v", c)
	}
	if !c.Finished.After(c.FirstToken) {
		t.Errorf("finished %v not after first token %v", c.Finished, c.FirstToken)
	}
	if diff := cmp.Diff(eng.CachedBlocks(), blocks); diff != "" {
		t.Errorf("event-built set vs cache (-cache +events):\n%s", diff)
	}
	// 100 prompt + 3 output tokens → 6 full blocks (the last output token is
	// never computed).
	if got := len(blocks); got != 6 {
		t.Errorf("cached blocks = %d, want 6", got)
	}
	if st := eng.Stats(); st.Running != 0 || st.Waiting != 0 || st.UsedBlocks != 0 {
		t.Errorf("stats after idle = %+v", st)
	}
}

func TestTTFTOrdering(t *testing.T) {
	ttft := func(t *testing.T, warm []uint32, p []uint32) time.Duration {
		eng, _ := NewEngine(Config{BlockSize: 16, NumBlocks: 1024})
		blocks := map[uint64]struct{}{}
		now := t0
		if warm != nil {
			if err := eng.Submit(now, Request{ID: "warm", Tokens: warm, MaxTokens: 1}); err != nil {
				t.Fatal(err)
			}
			run(t, eng, now, blocks)
			now = now.Add(time.Minute)
		}
		if err := eng.Submit(now, Request{ID: "r", Tokens: p, MaxTokens: 2}); err != nil {
			t.Fatal(err)
		}
		return run(t, eng, now, blocks)["r"].TTFT()
	}
	long := prompt(7, 2048)
	short := ttft(t, nil, prompt(7, 256))
	cold := ttft(t, nil, long)
	hit := ttft(t, long[:1024], long)
	if !(short < cold) {
		t.Errorf("TTFT of 256 uncached tokens %v, want below 2048 uncached %v", short, cold)
	}
	if !(hit < cold) {
		t.Errorf("TTFT with a 1024-token prefix hit %v, want below cold %v", hit, cold)
	}
}

func TestEvictionKeepsEventsExact(t *testing.T) {
	// A small cache, shared prefixes and enough load to evict and preempt.
	eng, _ := NewEngine(Config{BlockSize: 4, NumBlocks: 40, MaxNumBatchedTokens: 64, MaxNumSeqs: 8})
	blocks := map[uint64]struct{}{}
	now := t0
	sys := prompt(99, 24)
	for i := range 60 {
		p := append(append([]uint32{}, sys[:4*(i%6)]...), prompt(uint32(i), 12+i%9)...)
		if err := eng.Submit(now, Request{ID: string(rune('A'+i%26)) + string(rune('a'+i/26)), Tokens: p, MaxTokens: 20 + i%30}); err != nil {
			t.Fatal(err)
		}
		if i%7 == 0 {
			run(t, eng, now, blocks)
		} else {
			applyEvents(t, blocks, eng.Step(now).Events)
		}
		now = now.Add(3 * time.Millisecond)
	}
	done := run(t, eng, now, blocks)
	st := eng.Stats()
	if st.Preemptions == 0 {
		t.Errorf("no preemption: test load too light (%+v)", st)
	}
	t.Logf("stats: %+v", st)
	if len(done) == 0 {
		t.Error("nothing completed")
	}
	if diff := cmp.Diff(eng.CachedBlocks(), blocks); diff != "" {
		t.Errorf("event-built set vs cache (-cache +events):\n%s", diff)
	}
	if !maps.Equal(eng.CachedBlocks(), blocks) {
		t.Error("sets differ")
	}
}

func TestSchedulerShapes(t *testing.T) {
	tm := DefaultTiming{}
	tests := []struct {
		name     string
		cfg      Config
		prompts  []int
		wantTTFT []time.Duration
	}{
		{
			name:    "chunked prefill",
			cfg:     Config{BlockSize: 16, NumBlocks: 1024, MaxNumBatchedTokens: 1024},
			prompts: []int{3000},
			wantTTFT: []time.Duration{
				tm.IterationTime(Batch{PrefillTokens: 1024}) + tm.IterationTime(Batch{PrefillTokens: 1024}) + tm.IterationTime(Batch{PrefillTokens: 952}),
			},
		},
		{
			name:    "batched prefill shares an iteration",
			cfg:     Config{BlockSize: 16, NumBlocks: 1024},
			prompts: []int{100, 200},
			wantTTFT: []time.Duration{
				tm.IterationTime(Batch{PrefillTokens: 300}),
				tm.IterationTime(Batch{PrefillTokens: 300}),
			},
		},
		{
			name:    "sequence limit queues the third",
			cfg:     Config{BlockSize: 16, NumBlocks: 1024, MaxNumSeqs: 2},
			prompts: []int{100, 100, 100},
			wantTTFT: []time.Duration{
				tm.IterationTime(Batch{PrefillTokens: 200}),
				tm.IterationTime(Batch{PrefillTokens: 200}),
				// max tokens 1: the first two finish at their first token,
				// then the third runs alone.
				tm.IterationTime(Batch{PrefillTokens: 200}) + tm.IterationTime(Batch{PrefillTokens: 100}),
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			eng, err := NewEngine(tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			for i, n := range tt.prompts {
				if err := eng.Submit(t0, Request{ID: fmt.Sprint(i), Tokens: prompt(uint32(i+10), n), MaxTokens: 1}); err != nil {
					t.Fatal(err)
				}
			}
			done := run(t, eng, t0, map[uint64]struct{}{})
			var got []time.Duration
			for i := range tt.prompts {
				got = append(got, done[fmt.Sprint(i)].TTFT())
			}
			if diff := cmp.Diff(tt.wantTTFT, got); diff != "" {
				t.Errorf("TTFTs (-want +got):\n%s", diff)
			}
		})
	}
}
