package sim

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"time"
)

// AgenticConfig shapes a generated agentic trace (GenerateAgentic): agent
// sessions that share long tool preambles, talk over several turns whose
// context grows by each turn's output and new input, and sometimes fan out
// into bursts of parallel sub-agents. Zero fields take the defaults named
// on each; ParseAgentic reads one from "agentic:key=value,...".
type AgenticConfig struct {
	// Sessions is the number of agent sessions (200).
	Sessions int
	// SessionRate is the mean session starts per second, Poisson (1).
	SessionRate float64
	// Preambles is the number of distinct tool preambles (system prompt and
	// tool schemas); each session draws one, the first most often (Zipf,
	// s = 1.2) (4).
	Preambles int
	// PreambleBlocks is each preamble's length in trace blocks (16: 8,192
	// tokens of 512-token blocks).
	PreambleBlocks int
	// MinTurns and MaxTurns bound a session's turns, uniform (2, 12).
	MinTurns, MaxTurns int
	// MinInputBlocks and MaxInputBlocks bound each turn's new input (the
	// user's message or the tool's result), uniform, in blocks (1, 4).
	MinInputBlocks, MaxInputBlocks int
	// MinOutput and MaxOutput bound each turn's output tokens, uniform
	// (50, 400). The output joins the next turn's context.
	MinOutput, MaxOutput int
	// ThinkTime is the mean gap between a session's turns (tool execution
	// and the model's own time), exponential (5 s).
	ThinkTime time.Duration
	// BurstProb is the chance that a session fans out, on one of its turns,
	// into BurstSize parallel sub-agents (0.2).
	BurstProb float64
	// BurstSize is the sub-agents of a burst (8). Each sends the session's
	// context plus its own task (one block) within BurstSpread (50 ms), and
	// runs its own SubTurns turns (2).
	BurstSize   int
	BurstSpread time.Duration
	SubTurns    int
	// Seed drives every draw: the same config and seed give the same trace.
	Seed uint64
}

// DefaultAgentic returns the defaults.
func DefaultAgentic() AgenticConfig {
	return AgenticConfig{
		Sessions: 200, SessionRate: 1, Preambles: 4, PreambleBlocks: 16,
		MinTurns: 2, MaxTurns: 12, MinInputBlocks: 1, MaxInputBlocks: 4,
		MinOutput: 50, MaxOutput: 400, ThinkTime: 5 * time.Second,
		BurstProb: 0.2, BurstSize: 8, BurstSpread: 50 * time.Millisecond, SubTurns: 2,
		Seed: 1,
	}
}

// agenticKeys are ParseAgentic's keys, in the order docs/replay.md lists
// them.
var agenticKeys = []string{"sessions", "session_rate", "preambles", "preamble_blocks", "min_turns", "max_turns",
	"min_input_blocks", "max_input_blocks", "min_output", "max_output", "think_time", "burst_prob", "burst_size",
	"burst_spread", "sub_turns", "seed"}

// ParseAgentic parses "agentic" or "agentic:key=value,..." (keys as in
// agenticKeys: sessions, session_rate, preambles, preamble_blocks,
// min_turns, max_turns, min_input_blocks, max_input_blocks, min_output,
// max_output, think_time, burst_prob, burst_size, burst_spread, sub_turns,
// seed) over DefaultAgentic, and validates the result. Errors name the key.
func ParseAgentic(spec string) (AgenticConfig, error) {
	c := DefaultAgentic()
	name, args, _ := strings.Cut(strings.TrimSpace(spec), ":")
	if name != "agentic" {
		return c, fmt.Errorf("%w: unknown generator %q (want agentic or agentic:key=value,...)", ErrConfig, name)
	}
	if strings.TrimSpace(args) == "" {
		return c, c.Validate()
	}
	for _, kv := range strings.Split(args, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok {
			return c, fmt.Errorf("%w: agentic: %q is not key=value", ErrConfig, kv)
		}
		var err error
		switch k {
		case "sessions":
			c.Sessions, err = strconv.Atoi(v)
		case "session_rate":
			c.SessionRate, err = strconv.ParseFloat(v, 64)
		case "preambles":
			c.Preambles, err = strconv.Atoi(v)
		case "preamble_blocks":
			c.PreambleBlocks, err = strconv.Atoi(v)
		case "min_turns":
			c.MinTurns, err = strconv.Atoi(v)
		case "max_turns":
			c.MaxTurns, err = strconv.Atoi(v)
		case "min_input_blocks":
			c.MinInputBlocks, err = strconv.Atoi(v)
		case "max_input_blocks":
			c.MaxInputBlocks, err = strconv.Atoi(v)
		case "min_output":
			c.MinOutput, err = strconv.Atoi(v)
		case "max_output":
			c.MaxOutput, err = strconv.Atoi(v)
		case "think_time":
			c.ThinkTime, err = time.ParseDuration(v)
		case "burst_prob":
			c.BurstProb, err = strconv.ParseFloat(v, 64)
		case "burst_size":
			c.BurstSize, err = strconv.Atoi(v)
		case "burst_spread":
			c.BurstSpread, err = time.ParseDuration(v)
		case "sub_turns":
			c.SubTurns, err = strconv.Atoi(v)
		case "seed":
			c.Seed, err = strconv.ParseUint(v, 10, 64)
		default:
			return c, fmt.Errorf("%w: agentic: unknown key %q (want one of %s)", ErrConfig, k, strings.Join(agenticKeys, ", "))
		}
		if err != nil {
			return c, fmt.Errorf("%w: agentic: %s=%q: not a valid value", ErrConfig, k, v)
		}
	}
	return c, c.Validate()
}

// Bounds of AgenticConfig, so a generated trace stays small enough to
// replay: a generator's numbers come from a command line.
const (
	maxAgenticSessions = 1_000_000
	maxAgenticBlocks   = 1024 // per preamble, per turn's input
	maxAgenticTurns    = 1000
	maxAgenticOutput   = 1 << 20
	maxAgenticBurst    = 1024
	maxAgenticRequests = 10_000_000
	maxAgenticHashIDs  = 100_000_000
)

// Validate reports the first field out of range.
func (c AgenticConfig) Validate() error {
	bad := func(key string, v any, want string) error {
		return fmt.Errorf("%w: agentic: %s=%v: %s", ErrConfig, key, v, want)
	}
	between := func(key string, v, lo, hi int) error {
		if v < lo || v > hi {
			return bad(key, v, fmt.Sprintf("want %d..%d", lo, hi))
		}
		return nil
	}
	for _, chk := range []error{
		between("sessions", c.Sessions, 1, maxAgenticSessions),
		between("preambles", c.Preambles, 1, maxAgenticSessions),
		between("preamble_blocks", c.PreambleBlocks, 0, maxAgenticBlocks),
		between("min_turns", c.MinTurns, 1, maxAgenticTurns),
		between("max_turns", c.MaxTurns, c.MinTurns, maxAgenticTurns),
		between("min_input_blocks", c.MinInputBlocks, 1, maxAgenticBlocks),
		between("max_input_blocks", c.MaxInputBlocks, c.MinInputBlocks, maxAgenticBlocks),
		between("min_output", c.MinOutput, 1, maxAgenticOutput),
		between("max_output", c.MaxOutput, c.MinOutput, maxAgenticOutput),
		between("burst_size", c.BurstSize, 0, maxAgenticBurst),
		between("sub_turns", c.SubTurns, 0, maxAgenticTurns),
	} {
		if chk != nil {
			return chk
		}
	}
	switch {
	case !(c.SessionRate > 0) || math.IsInf(c.SessionRate, 0):
		return bad("session_rate", c.SessionRate, "want a positive number")
	case c.ThinkTime < 0:
		return bad("think_time", c.ThinkTime, "want ≥ 0")
	case c.BurstSpread < 0:
		return bad("burst_spread", c.BurstSpread, "want ≥ 0")
	case !(c.BurstProb >= 0 && c.BurstProb <= 1):
		return bad("burst_prob", c.BurstProb, "want 0..1")
	}
	// The worst cases of requests and of hash ids held, bounded before
	// anything is allocated.
	perSession := float64(c.MaxTurns) + float64(c.BurstSize)*float64(max(c.SubTurns, 1))
	requests := float64(c.Sessions) * perSession
	if requests > maxAgenticRequests {
		return fmt.Errorf("%w: agentic: up to %.0f requests (sessions × (max_turns + burst_size × sub_turns)); the most is %d", ErrConfig, requests, maxAgenticRequests)
	}
	perTurn := float64(c.MaxInputBlocks) + math.Ceil(float64(c.MaxOutput)/DefaultTraceBlockSize)
	context := float64(c.PreambleBlocks) + float64(c.MaxTurns+max(c.SubTurns, 1))*perTurn
	if requests*context > maxAgenticHashIDs {
		return fmt.Errorf("%w: agentic: up to %.0f hash ids in all (requests × the longest context); the most is %d: fewer sessions, turns or blocks", ErrConfig, requests*context, maxAgenticHashIDs)
	}
	return nil
}

// GenerateAgentic returns a generated agentic trace in the Mooncake form
// (hash ids of DefaultTraceBlockSize-token blocks), requests in arrival
// order, arrivals in whole milliseconds from the first. Equal ids are equal content: preamble p's blocks are the same in
// every session that uses it, a session's context is the same ids turn
// after turn, and a burst's sub-agents share the session's context.
func GenerateAgentic(c AgenticConfig) (*Trace, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	const bs = DefaultTraceBlockSize
	rng := rand.New(rand.NewPCG(c.Seed, 0x61676e74))
	var nextID uint64 = 1
	fresh := func(n int) []uint64 {
		out := make([]uint64, n)
		for i := range out {
			out[i] = nextID
			nextID++
		}
		return out
	}
	preambles := make([][]uint64, c.Preambles)
	for i := range preambles {
		preambles[i] = fresh(c.PreambleBlocks)
	}
	zipf := rand.NewZipf(rng, 1.2, 1, uint64(c.Preambles-1))
	uniform := func(lo, hi int) int { return lo + rng.IntN(hi-lo+1) }
	think := func() time.Duration { return time.Duration(rng.ExpFloat64() * float64(c.ThinkTime)) }
	var reqs []Request
	// emit adds one turn: ctx (the whole context, in blocks) plus the
	// tokens of its last, partial block, and returns ctx grown by the
	// turn's output.
	emit := func(at time.Duration, ctx []uint64, lastTokens int) (int, []uint64) {
		out := uniform(c.MinOutput, c.MaxOutput)
		isl := (len(ctx)-1)*bs + lastTokens
		reqs = append(reqs, Request{Arrival: at, InputLength: isl, OutputLength: out, HashIDs: append([]uint64(nil), ctx...)})
		return out, ctx
	}
	// turn appends a turn's new input to ctx and emits it; the context of
	// the next turn holds this turn's output too.
	turn := func(at time.Duration, ctx []uint64) []uint64 {
		ctx = append(ctx, fresh(uniform(c.MinInputBlocks, c.MaxInputBlocks))...)
		last := 1 + rng.IntN(bs)
		out, ctx := emit(at, ctx, last)
		return append(ctx, fresh((out+bs-1)/bs)...)
	}
	var start time.Duration
	for range c.Sessions {
		start += time.Duration(rng.ExpFloat64() / c.SessionRate * float64(time.Second))
		ctx := append([]uint64(nil), preambles[zipf.Uint64()]...)
		turns := uniform(c.MinTurns, c.MaxTurns)
		burstAt := -1
		if c.BurstSize > 0 && rng.Float64() < c.BurstProb {
			burstAt = rng.IntN(turns)
		}
		at := start
		for t := range turns {
			if t == burstAt {
				for range c.BurstSize {
					sub := append([]uint64(nil), ctx...)
					sat := at + time.Duration(rng.Float64()*float64(c.BurstSpread))
					for range max(c.SubTurns, 1) {
						sub = turn(sat, sub)
						sat += think()
					}
				}
			}
			ctx = turn(at, ctx)
			at += think()
		}
	}
	// Whole milliseconds from the first arrival, as Mooncake's timestamps,
	// so that WriteMooncake and LoadTrace give the same trace back.
	for i := range reqs {
		reqs[i].Arrival = reqs[i].Arrival.Round(time.Millisecond)
	}
	sort.SliceStable(reqs, func(i, j int) bool { return reqs[i].Arrival < reqs[j].Arrival })
	first := reqs[0].Arrival
	for i := range reqs {
		reqs[i].Line = i + 1
		reqs[i].Arrival -= first
	}
	return &Trace{Requests: reqs, BlockSize: bs}, nil
}

// WriteMooncake writes the trace's Mooncake requests as Mooncake JSONL
// (timestamp ms, input_length, output_length, hash_ids), which LoadTrace
// reads back. Raw-prompt requests are refused.
func (t *Trace) WriteMooncake(w io.Writer) error {
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	for _, r := range t.Requests {
		if r.HashIDs == nil {
			return fmt.Errorf("line %d: a raw prompt has no Mooncake form", r.Line)
		}
		line := struct {
			Timestamp    float64  `json:"timestamp"`
			InputLength  int      `json:"input_length"`
			OutputLength int      `json:"output_length"`
			HashIDs      []uint64 `json:"hash_ids"`
		}{float64(r.Arrival) / float64(time.Millisecond), r.InputLength, r.OutputLength, r.HashIDs}
		if err := enc.Encode(line); err != nil {
			return err
		}
	}
	return bw.Flush()
}
