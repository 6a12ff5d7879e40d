package sim

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/kvgate/kvgate/kvevents"
)

const malformedTrace = `{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]}
not json
{"timestamp": 1, "input_length": 10, "output_length": 1}
{"timestamp": -1, "input_length": 10, "output_length": 1, "hash_ids": [1]}
{"timestamp": 2, "input_length": 1100, "output_length": 1, "hash_ids": [1, 2]}

{"timestamp": 5, "text": ""}
{"text": "hello world, again", "max_tokens": 7}
{"timestamp": 6, "input_length": 5, "output_length": 1, "hash_ids": [-1]}
{"timestamp": 7, "input_length": 5, "output_length": 0, "hash_ids": [9]} {"extra": 1}
{"timestamp": 8, "token_ids": [5, 6, 7]}
`

func TestLoadTraceMalformedLines(t *testing.T) {
	tr, err := LoadTrace(strings.NewReader(malformedTrace), LoadOptions{})
	if err != nil {
		t.Fatalf("LoadTrace: %v", err)
	}
	var lines []int
	for _, le := range tr.Skipped {
		if !errors.Is(le, ErrMalformed) {
			t.Errorf("line %d: error %v is not ErrMalformed", le.Line, le)
		}
		if !strings.HasPrefix(le.Error(), "line ") {
			t.Errorf("error %q does not start with its line", le)
		}
		lines = append(lines, le.Line)
	}
	if diff := cmp.Diff([]int{2, 3, 4, 5, 7, 9, 10}, lines); diff != "" {
		t.Errorf("skipped lines (-want +got):\n%s", diff)
	}
	type got struct {
		Line, In, Out int
		Arrival       time.Duration
	}
	var reqs []got
	for _, r := range tr.Requests {
		reqs = append(reqs, got{r.Line, r.InputLength, r.OutputLength, r.Arrival})
	}
	want := []got{
		{1, 600, 3, 0},
		// No timestamp: the previous accepted line's (0).
		{8, 4, 7, 0},
		{11, 3, defaultOutputLength, 8 * time.Millisecond},
	}
	if diff := cmp.Diff(want, reqs); diff != "" {
		t.Errorf("requests (-want +got):\n%s", diff)
	}

	_, err = LoadTrace(strings.NewReader(malformedTrace), LoadOptions{Strict: true})
	var le *LineError
	if !errors.As(err, &le) || le.Line != 2 {
		t.Errorf("strict LoadTrace error = %v, want a LineError on line 2", err)
	}
}

func TestLoadTraceFormats(t *testing.T) {
	const line = `{"timestamp": 0, "input_length": 20, "output_length": 1, "hash_ids": [1, 2]}`
	if _, err := LoadTrace(strings.NewReader(line), LoadOptions{Format: FormatPrompts, BlockSize: 16, Strict: true}); err == nil {
		t.Error("a Mooncake line loaded as a prompt, want an error")
	}
	tr, err := LoadTrace(strings.NewReader(line), LoadOptions{Format: FormatMooncake, BlockSize: 16, Strict: true})
	if err != nil || len(tr.Requests) != 1 {
		t.Fatalf("LoadTrace = %v, %v; want one request", tr, err)
	}
	if _, err := LoadTrace(strings.NewReader(line), LoadOptions{Format: "csv"}); err == nil {
		t.Error("unknown format accepted")
	}
}

func TestLoadTraceSortsAndScales(t *testing.T) {
	in := `{"timestamp": 300, "input_length": 1, "output_length": 1, "hash_ids": [3]}
{"timestamp": 100, "input_length": 1, "output_length": 1, "hash_ids": [1]}
{"timestamp": 100, "input_length": 1, "output_length": 1, "hash_ids": [2]}
`
	tr, err := LoadTrace(strings.NewReader(in), LoadOptions{Strict: true})
	if err != nil {
		t.Fatal(err)
	}
	s := tr.Scale(2, 2)
	var ids []uint64
	var at []time.Duration
	for _, r := range s.Requests {
		ids = append(ids, r.HashIDs[0])
		at = append(at, r.Arrival)
	}
	if diff := cmp.Diff([]uint64{1, 2}, ids); diff != "" {
		t.Errorf("order after sort and cap (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]time.Duration{0, 0}, at); diff != "" {
		t.Errorf("arrivals (-want +got):\n%s", diff)
	}
	if got := tr.Scale(2, 0).Requests[2].Arrival; got != 100*time.Millisecond {
		t.Errorf("arrival at 2x = %v, want 100ms", got)
	}
}

func TestExpansionSharesPrefixesAtAnyBlockSize(t *testing.T) {
	a := Request{InputLength: 1024 + 100, HashIDs: []uint64{7, 8, 9}}
	b := Request{InputLength: 1024 + 300, HashIDs: []uint64{7, 8, 10}}
	ta, tb := a.AppendTokens(nil, 512, 1), b.AppendTokens(nil, 512, 1)
	if len(ta) != a.InputLength || len(tb) != b.InputLength {
		t.Fatalf("expanded lengths %d, %d; want %d, %d", len(ta), len(tb), a.InputLength, b.InputLength)
	}
	if !slices.Equal(ta[:1024], tb[:1024]) {
		t.Error("equal hash ids expanded to different tokens")
	}
	if slices.Equal(ta[1024:1100], tb[1024:1100]) {
		t.Error("different hash ids expanded to equal tokens")
	}
	if again := a.AppendTokens(nil, 512, 1); !slices.Equal(ta, again) {
		t.Error("expansion is not deterministic")
	}
	if other := a.AppendTokens(nil, 512, 2); slices.Equal(ta, other) {
		t.Error("the seed does not change the expansion")
	}
	for _, bs := range []int{16, 48, 64, 100, 512} {
		ha, _ := kvevents.LocalHashes(ta, bs, "")
		hb, _ := kvevents.LocalHashes(tb, bs, "")
		shared := 0
		for shared < min(len(ha), len(hb)) && ha[shared] == hb[shared] {
			shared++
		}
		if want := 1024 / bs; shared != want {
			t.Errorf("block size %d: %d shared leading blocks, want %d", bs, shared, want)
		}
	}
}

func FuzzLoadTrace(f *testing.F) {
	f.Add([]byte(malformedTrace))
	f.Add([]byte(`{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]}`))
	f.Add([]byte(`{"token_ids": [1, 2, 3], "output_length": 2}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		tr, err := LoadTrace(bytes.NewReader(data), LoadOptions{})
		if err != nil {
			return
		}
		for _, r := range tr.Requests {
			if r.InputLength <= 0 || r.OutputLength < 1 || r.Arrival < 0 {
				t.Fatalf("line %d: accepted request %+v", r.Line, r)
			}
			if r.HashIDs != nil && len(r.HashIDs)*tr.BlockSize < r.InputLength {
				t.Fatalf("line %d: %d hash ids cannot cover %d tokens", r.Line, len(r.HashIDs), r.InputLength)
			}
			if r.HashIDs == nil && len(r.Tokens) != r.InputLength {
				t.Fatalf("line %d: %d tokens, input length %d", r.Line, len(r.Tokens), r.InputLength)
			}
		}
	})
}
