package localrouter

import (
	"errors"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/lib/config"
)

func TestParseWorkerChain(t *testing.T) {
	got, err := ParseWorkerChain(" saturation, cost=1/normalize=max ,prefix=2,cold=0.5/lru_size=8")
	if err != nil {
		t.Fatal(err)
	}
	want := "saturation,cost=1/normalize=max,prefix=2,cold=0.5/lru_size=8"
	if s := FormatWorkerChain(got); s != want {
		t.Errorf("round trip: %q, want %q", s, want)
	}
	if err := ValidateWorkerChain(got, DefaultConfig()); err != nil {
		t.Errorf("valid chain: %v", err)
	}
	for _, tt := range []struct{ in, want string }{
		{"cost,,prefix", "entry 2: empty"},
		{"=2", "no name"},
		{"cost=x", `weight "x" is not a number`},
		{"cost/normalize", `argument "normalize" is not key=value`},
		{"cost/a=1/a=2", `argument "a" given twice`},
	} {
		if _, err := ParseWorkerChain(tt.in); err == nil || !strings.Contains(err.Error(), tt.want) || !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("ParseWorkerChain(%q): error %v, want one containing %q", tt.in, err, tt.want)
		}
	}
}

func TestValidateWorkerChainNamesTheFault(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"cost,bogus=1", `unknown filter or scorer "bogus"`},
		{"cost/normalise=max", `"cost": unknown argument "normalise" (known: credit, normalize, scale)`},
		{"prefix/x=1", `"prefix": unknown argument "x" (it takes none)`},
		{"cost/normalize=min", `normalize="min": want one of none, max`},
		{"saturation=2,cost", `"saturation": a filter takes no weight`},
		{"cost=-1", `"cost": weight -1 must be > 0`},
		{"saturation", "no scorer"},
		{"cost,cost", `"cost" named twice`},
		{"cold/lru_size=0", "lru_size 0 must be a count"},
		{"session/slack=-1", "slack -1 must be ≥ 0"},
		{"saturation/kv_usage=2,cost", "kv_usage 2 must be within 0..1"},
		{"cost/credit=nan", `credit="nan" is not a number`},
	} {
		specs, err := ParseWorkerChain(tt.in)
		if err != nil {
			t.Fatalf("%q: %v", tt.in, err)
		}
		err = ValidateWorkerChain(specs, DefaultConfig())
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: error %v, want one containing %q", tt.in, err, tt.want)
		}
		cfg := DefaultConfig()
		cfg.WorkerChain = specs
		if _, err := New(cfg, Options{SweepInterval: -1}); err == nil {
			t.Errorf("%q: New accepted it", tt.in)
		}
	}
}

// chainRouter is a router of workers a, b, c (block size 4) under chain.
func FuzzParseWorkerChain(f *testing.F) {
	for _, s := range []string{"", "saturation,cost=1", "cost=1/normalize=max,prefix=2,cold=0.5/lru_size=8", "session/slack=0.3", "=", ",", "a/b=c/d", "cost=1e400", "lora,lora-affinity=2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		specs, err := ParseWorkerChain(s)
		if err != nil {
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("error %v is not ErrInvalidConfig", err)
			}
			return
		}
		_ = ValidateWorkerChain(specs, DefaultConfig())
		again, err := ParseWorkerChain(FormatWorkerChain(specs))
		if err != nil {
			t.Fatalf("%q formats as %q, which does not parse: %v", s, FormatWorkerChain(specs), err)
		}
		if FormatWorkerChain(again) != FormatWorkerChain(specs) {
			t.Fatalf("round trip of %q: %q then %q", s, FormatWorkerChain(specs), FormatWorkerChain(again))
		}
	})
}

// BenchmarkBestWorkerChain: 64 workers, 256 cached prompts of 64 blocks,
// a 64-block request, under the default chain and a six-entry one.
func FuzzDecodeWorkerChain(f *testing.F) {
	for _, s := range []string{"- name: cost\n", "- {name: cold, weight: 0.5, args: {lru_size: 3}}\n- name: prefix\n", "[]", "name: x", "- {name: cost, wieght: 1}\n", "- {name: session, args: {slack: x}}\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		doc, err := config.ParseFile("chain.yaml", []byte(text))
		if err != nil {
			return
		}
		specs, err := DecodeWorkerChain("chain.yaml", "worker_chain", doc, DefaultConfig())
		if err != nil {
			if !strings.HasPrefix(err.Error(), "chain.yaml") {
				t.Fatalf("error %q does not name the file", err)
			}
			return
		}
		if len(specs) > 0 {
			if err := ValidateWorkerChain(specs, DefaultConfig()); err != nil {
				t.Fatalf("decoded chain %v does not validate: %v", specs, err)
			}
		}
	})
}
