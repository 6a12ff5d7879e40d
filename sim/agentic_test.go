package sim

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func TestGenerateAgenticDeterministic(t *testing.T) {
	c := DefaultAgentic()
	c.Sessions = 40
	a, err := GenerateAgentic(c)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := GenerateAgentic(c)
	if diff := cmp.Diff(a, b, cmpopts.EquateEmpty()); diff != "" {
		t.Fatalf("same config and seed, different traces (-first +second):\n%s", diff)
	}
	c.Seed++
	d, _ := GenerateAgentic(c)
	if cmp.Equal(a, d, cmpopts.EquateEmpty()) {
		t.Fatal("another seed gave the same trace")
	}
}

// TestGenerateAgenticShape checks what the generator promises: arrivals in
// order, Mooncake-valid lengths, preambles shared across sessions, contexts
// that grow turn by turn, and bursts of requests sharing a context.
func TestGenerateAgenticShape(t *testing.T) {
	c := DefaultAgentic()
	c.Sessions, c.Preambles, c.PreambleBlocks, c.BurstProb = 60, 3, 8, 0.5
	tr, err := GenerateAgentic(c)
	if err != nil {
		t.Fatal(err)
	}
	if tr.BlockSize != DefaultTraceBlockSize {
		t.Fatalf("block size: got %d, want %d", tr.BlockSize, DefaultTraceBlockSize)
	}
	heads := map[uint64]int{}
	for i, r := range tr.Requests {
		if i > 0 && r.Arrival < tr.Requests[i-1].Arrival {
			t.Fatalf("request %d arrives before request %d", i, i-1)
		}
		if r.Line != i+1 {
			t.Fatalf("request %d: line %d, want %d", i, r.Line, i+1)
		}
		if want := (r.InputLength + tr.BlockSize - 1) / tr.BlockSize; len(r.HashIDs) != want || r.OutputLength < c.MinOutput || r.OutputLength > c.MaxOutput {
			t.Fatalf("request %d: %d hash ids for %d tokens (want %d), output %d", i, len(r.HashIDs), r.InputLength, want, r.OutputLength)
		}
		if len(r.HashIDs) < c.PreambleBlocks+c.MinInputBlocks {
			t.Fatalf("request %d: %d blocks, shorter than a preamble and one input", i, len(r.HashIDs))
		}
		heads[r.HashIDs[0]]++
	}
	if len(heads) > c.Preambles || len(heads) < 2 {
		t.Fatalf("distinct preambles: got %d, want 2..%d", len(heads), c.Preambles)
	}
	// A request whose context (all but its new input and partial block) is
	// a strict prefix of a later request's: a growing session.
	grows, bursts := 0, 0
	byPrefix := map[string]int{}
	for _, r := range tr.Requests {
		key := keyOf(r.HashIDs[:c.PreambleBlocks+1])
		byPrefix[key]++
	}
	for _, n := range byPrefix {
		if n >= c.BurstSize {
			bursts++
		}
	}
	for i, r := range tr.Requests {
		for _, s := range tr.Requests[i+1:] {
			if len(s.HashIDs) > len(r.HashIDs) && slices.Equal(s.HashIDs[:len(r.HashIDs)-1], r.HashIDs[:len(r.HashIDs)-1]) {
				grows++
				break
			}
		}
	}
	if grows < len(tr.Requests)/3 {
		t.Errorf("requests continued by a later turn: got %d of %d, want at least a third", grows, len(tr.Requests))
	}
	if bursts == 0 {
		t.Error("no burst: no first turn shared by burst_size requests")
	}
}

func keyOf(ids []uint64) string {
	var b strings.Builder
	for _, id := range ids {
		b.WriteString(string(rune(id % 0x10ffff)))
		b.WriteByte(',')
	}
	return b.String()
}

// TestAgenticRoundTrip writes a generated trace as Mooncake JSONL and loads
// it back unchanged.
func TestAgenticRoundTrip(t *testing.T) {
	c := DefaultAgentic()
	c.Sessions = 10
	tr, err := GenerateAgentic(c)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := tr.WriteMooncake(&buf); err != nil {
		t.Fatal(err)
	}
	back, err := LoadTrace(&buf, LoadOptions{Format: FormatMooncake, Strict: true})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(tr, back, cmpopts.EquateEmpty()); diff != "" {
		t.Fatalf("round trip (-generated +loaded):\n%s", diff)
	}
}

func TestParseAgentic(t *testing.T) {
	c, err := ParseAgentic("agentic:sessions=5,think_time=2s,burst_prob=0,seed=9")
	if err != nil {
		t.Fatal(err)
	}
	want := DefaultAgentic()
	want.Sessions, want.ThinkTime, want.BurstProb, want.Seed = 5, 2e9, 0, 9
	if diff := cmp.Diff(want, c); diff != "" {
		t.Fatalf("(-want +got):\n%s", diff)
	}
	if c, err := ParseAgentic("agentic"); err != nil || c != DefaultAgentic() {
		t.Fatalf("plain agentic: got %+v, %v; want the defaults", c, err)
	}
	for _, tc := range []struct{ spec, want string }{
		{"mooncake", `unknown generator "mooncake"`},
		{"agentic:sessions", `"sessions" is not key=value`},
		{"agentic:turns=3", `unknown key "turns"`},
		{"agentic:sessions=x", `sessions="x": not a valid value`},
		{"agentic:sessions=0", "sessions=0: want 1..1000000"},
		{"agentic:min_turns=5,max_turns=3", "max_turns=3: want 5..1000"},
		{"agentic:burst_prob=2", "burst_prob=2: want 0..1"},
		{"agentic:session_rate=0", "session_rate=0: want a positive number"},
		{"agentic:sessions=1000000,max_turns=1000", "requests"},
		{"agentic:sessions=100000,preamble_blocks=1000", "hash ids"},
	} {
		_, err := ParseAgentic(tc.spec)
		if err == nil || !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want an ErrConfig saying %q", tc.spec, err, tc.want)
		}
	}
}

// FuzzParseAgentic: any spec is parsed or refused with ErrConfig, never a
// panic, and a valid one generates (bounded by a small session count).
func FuzzParseAgentic(f *testing.F) {
	for _, s := range []string{"agentic", "agentic:sessions=3", "agentic:min_turns=1,max_turns=1,burst_size=0", "agentic:think_time=-1s", "agentic:,", "x:y=z"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		c, err := ParseAgentic(spec)
		if err != nil {
			if !errors.Is(err, ErrConfig) {
				t.Fatalf("%q: error without ErrConfig: %v", spec, err)
			}
			return
		}
		if c.Sessions > 3 || c.MaxTurns > 20 || c.BurstSize > 20 || c.SubTurns > 20 || c.PreambleBlocks > 64 || c.MaxInputBlocks > 64 {
			return // valid, but too large to generate in a fuzz loop
		}
		if _, err := GenerateAgentic(c); err != nil {
			t.Fatalf("%q: valid config refused by the generator: %v", spec, err)
		}
	})
}
