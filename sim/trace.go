package sim

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"time"

	"github.com/kvgate/kvgate/mocker"
)

// Trace formats LoadTrace understands.
const (
	// FormatAuto decides per line: hash_ids means Mooncake, text or
	// token_ids means a raw prompt.
	FormatAuto = "auto"
	// FormatMooncake is Mooncake's FAST'25 trace format: one JSON object
	// per line with timestamp (ms), input_length, output_length and
	// hash_ids (one id per TraceBlockSize-token prompt block; equal ids are
	// equal content).
	FormatMooncake = "mooncake"
	// FormatPrompts is a JSONL of raw prompts: timestamp (ms, optional:
	// a missing one repeats the previous line's), text or prompt (a
	// string, tokenized with the mocker's deterministic word tokenizer) or
	// token_ids, and output_length or max_tokens (default 128).
	FormatPrompts = "prompts"
)

// DefaultTraceBlockSize is the prompt block size of Mooncake traces.
const DefaultTraceBlockSize = 512

// defaultOutputLength is the output of prompt lines that do not say.
const defaultOutputLength = 128

// ErrMalformed marks a trace line that cannot be replayed. LineError wraps
// it with the line number.
var ErrMalformed = errors.New("malformed trace line")

// LineError is a malformed trace line.
type LineError struct {
	Line int
	Err  error
}

func (e *LineError) Error() string { return fmt.Sprintf("line %d: %v", e.Line, e.Err) }

// Unwrap returns the cause; errors.Is(err, ErrMalformed) holds.
func (e *LineError) Unwrap() error { return e.Err }

// Request is one trace request.
type Request struct {
	// Line is the 1-based line of the trace it came from.
	Line int
	// Arrival is the offset from the trace's start.
	Arrival      time.Duration
	InputLength  int
	OutputLength int
	// HashIDs are the prompt's block ids (Mooncake); nil for a raw prompt.
	HashIDs []uint64
	// Tokens is a raw prompt's token ids; nil for a Mooncake request.
	Tokens []uint32
}

// Trace is a loaded trace, requests in arrival order.
type Trace struct {
	Requests []Request
	// Skipped lists malformed lines that were skipped (LoadOptions.Strict
	// unset).
	Skipped []*LineError
	// BlockSize is the tokens per hash id (Mooncake requests).
	BlockSize int
}

// LoadOptions shape LoadTrace.
type LoadOptions struct {
	// Format is FormatAuto (default), FormatMooncake or FormatPrompts.
	Format string
	// Strict refuses the whole trace at the first malformed line; otherwise
	// malformed lines are skipped and listed in Trace.Skipped.
	Strict bool
	// BlockSize is the tokens per hash id (DefaultTraceBlockSize).
	BlockSize int
}

// LoadTraceFile opens path and loads it with LoadTrace.
func LoadTraceFile(path string, opts LoadOptions) (*Trace, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	t, err := LoadTrace(f, opts)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}

// traceLine is the union of both formats' fields.
type traceLine struct {
	Timestamp    *float64        `json:"timestamp"`
	InputLength  *int            `json:"input_length"`
	OutputLength *int            `json:"output_length"`
	MaxTokens    *int            `json:"max_tokens"`
	HashIDs      json.RawMessage `json:"hash_ids"`
	Text         *string         `json:"text"`
	Prompt       *string         `json:"prompt"`
	TokenIDs     json.RawMessage `json:"token_ids"`
}

// LoadTrace reads a JSONL trace. Blank lines are ignored. The requests are
// returned in arrival order (stable: equal timestamps keep line order),
// with arrivals relative to the earliest timestamp.
func LoadTrace(r io.Reader, opts LoadOptions) (*Trace, error) {
	if opts.Format == "" {
		opts.Format = FormatAuto
	}
	switch opts.Format {
	case FormatAuto, FormatMooncake, FormatPrompts:
	default:
		return nil, fmt.Errorf("unknown trace format %q (want auto, mooncake or prompts)", opts.Format)
	}
	if opts.BlockSize == 0 {
		opts.BlockSize = DefaultTraceBlockSize
	}
	if opts.BlockSize < 0 {
		return nil, fmt.Errorf("trace block size %d must be positive", opts.BlockSize)
	}
	t := &Trace{BlockSize: opts.BlockSize}
	tok := mocker.WordTokenizer{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<30)
	var prevTS float64
	line := 0
	for sc.Scan() {
		line++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		req, ts, err := parseLine(b, opts, prevTS, tok)
		if err != nil {
			le := &LineError{Line: line, Err: fmt.Errorf("%w: %v", ErrMalformed, err)}
			if opts.Strict {
				return nil, le
			}
			t.Skipped = append(t.Skipped, le)
			continue
		}
		prevTS = ts
		req.Line = line
		req.Arrival = time.Duration(ts * float64(time.Millisecond))
		t.Requests = append(t.Requests, req)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("line %d: %w", line+1, err)
	}
	sort.SliceStable(t.Requests, func(i, j int) bool { return t.Requests[i].Arrival < t.Requests[j].Arrival })
	if len(t.Requests) > 0 {
		first := t.Requests[0].Arrival
		for i := range t.Requests {
			t.Requests[i].Arrival -= first
		}
	}
	return t, nil
}

func parseLine(b []byte, opts LoadOptions, prevTS float64, tok mocker.WordTokenizer) (Request, float64, error) {
	var l traceLine
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&l); err != nil {
		return Request{}, 0, fmt.Errorf("not a JSON object: %v", err)
	}
	if dec.More() {
		return Request{}, 0, errors.New("trailing data after the JSON object")
	}
	format := opts.Format
	if format == FormatAuto {
		switch {
		case l.HashIDs != nil:
			format = FormatMooncake
		case l.Text != nil || l.Prompt != nil || l.TokenIDs != nil:
			format = FormatPrompts
		default:
			return Request{}, 0, errors.New("neither hash_ids (Mooncake) nor text, prompt or token_ids (prompts)")
		}
	}
	ts := prevTS
	if l.Timestamp != nil {
		ts = *l.Timestamp
		if ts < 0 {
			return Request{}, 0, fmt.Errorf("timestamp %v is negative", ts)
		}
	} else if format == FormatMooncake {
		return Request{}, 0, errors.New("missing timestamp")
	}
	if format == FormatMooncake {
		req, err := parseMooncake(l, opts.BlockSize)
		return req, ts, err
	}
	req, err := parsePrompt(l, tok)
	return req, ts, err
}

func parseMooncake(l traceLine, blockSize int) (Request, error) {
	switch {
	case l.InputLength == nil:
		return Request{}, errors.New("missing input_length")
	case *l.InputLength <= 0:
		return Request{}, fmt.Errorf("input_length %d must be positive", *l.InputLength)
	case l.OutputLength == nil:
		return Request{}, errors.New("missing output_length")
	case *l.OutputLength < 0:
		return Request{}, fmt.Errorf("output_length %d is negative", *l.OutputLength)
	case l.HashIDs == nil:
		return Request{}, errors.New("missing hash_ids")
	}
	var ids []uint64
	if err := json.Unmarshal(l.HashIDs, &ids); err != nil {
		return Request{}, fmt.Errorf("hash_ids must be a list of non-negative integers: %v", err)
	}
	if want := (*l.InputLength + blockSize - 1) / blockSize; len(ids) != want {
		return Request{}, fmt.Errorf("%d hash_ids for input_length %d (want %d blocks of %d tokens)", len(ids), *l.InputLength, want, blockSize)
	}
	return Request{InputLength: *l.InputLength, OutputLength: max(*l.OutputLength, 1), HashIDs: ids}, nil
}

func parsePrompt(l traceLine, tok mocker.WordTokenizer) (Request, error) {
	var tokens []uint32
	switch {
	case l.TokenIDs != nil:
		if err := json.Unmarshal(l.TokenIDs, &tokens); err != nil {
			return Request{}, fmt.Errorf("token_ids must be a list of 32-bit token ids: %v", err)
		}
	case l.Text != nil:
		tokens, _ = tok.Encode(*l.Text)
	case l.Prompt != nil:
		tokens, _ = tok.Encode(*l.Prompt)
	}
	if len(tokens) == 0 {
		return Request{}, errors.New("empty prompt")
	}
	out := defaultOutputLength
	switch {
	case l.OutputLength != nil:
		out = *l.OutputLength
	case l.MaxTokens != nil:
		out = *l.MaxTokens
	}
	if out < 0 {
		return Request{}, fmt.Errorf("output length %d is negative", out)
	}
	return Request{InputLength: len(tokens), OutputLength: max(out, 1), Tokens: tokens}, nil
}

// Scale returns a copy of the trace with arrivals divided by rate (2 = twice
// as fast) and at most limit requests (0: all).
func (t *Trace) Scale(rate float64, limit int) *Trace {
	reqs := t.Requests
	if limit > 0 && limit < len(reqs) {
		reqs = reqs[:limit]
	}
	out := &Trace{Requests: make([]Request, len(reqs)), Skipped: t.Skipped, BlockSize: t.BlockSize}
	copy(out.Requests, reqs)
	if rate > 0 && rate != 1 {
		for i := range out.Requests {
			out.Requests[i].Arrival = time.Duration(float64(out.Requests[i].Arrival) / rate)
		}
	}
	return out
}
