package globalrouter_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/globalrouter"
)

// TestConfigUnread: a pool's weight set while no chain runs the weighted
// policy is named (file, pool, value, the chain); with weighted in the
// live or the shadow chain, or at its default, it is not.
func TestConfigUnread(t *testing.T) {
	const pools = `
pools:
  - name: pool-a
    models: [m]
    weight: WEIGHT
    routers: {static: ["127.0.0.1:7101"]}
`
	for _, tt := range []struct {
		chain, weight, shadow string
		want                  string
	}{
		{"[model-match, cost]", "3", "", `pool "pool-a": weight 3 is read by the weighted policy only, which the chain (model-match, cost) does not run`},
		{"[model-match, cost]", "1", "", ""},
		{"[model-match, weighted]", "3", "", ""},
		{"[model-match, cost]", "3", "shadow: {chain: [model-match, weighted]}\n", ""},
	} {
		file := filepath.Join(t.TempDir(), "pools.yaml")
		data := "chain: " + tt.chain + "\n" + tt.shadow + strings.Replace(pools, "WEIGHT", tt.weight, 1)
		if err := os.WriteFile(file, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := globalrouter.LoadConfig(file, nil)
		if err != nil {
			t.Fatalf("%s: %v", data, err)
		}
		got := strings.Join(cfg.Unread(), "\n")
		if tt.want == "" && got != "" || tt.want != "" && !strings.Contains(got, file+": "+tt.want) {
			t.Errorf("chain %s weight %s %s: Unread %q, want %q", tt.chain, tt.weight, tt.shadow, got, tt.want)
		}
	}
}

// TestConfigRefusesTokenizerModel: a model entry's tokenizer.model other
// than its name is refused: the router names the tokenizer after the
// entry, so the field would be passed over.
func TestConfigRefusesTokenizerModel(t *testing.T) {
	file := filepath.Join(t.TempDir(), "pools.yaml")
	data := `models:
  - name: m
    tokenizer: {backend: openai, model: other}
pools:
  - name: pool-a
    models: [m]
    routers: {static: ["127.0.0.1:7101"]}
`
	if err := os.WriteFile(file, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := globalrouter.LoadConfig(file, nil)
	if want := `models: "m": tokenizer.model "other" is not read`; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("error %v, want one containing %q", err, want)
	}
	// A field another backend reads is refused at validation, with the
	// file's position, before any tokenizer is loaded.
	data = strings.Replace(data, "model: other", "timeout: 2s", 1)
	if err := os.WriteFile(file, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = globalrouter.LoadConfig(file, nil)
	if want := `models: "m": tokenizer: invalid configuration: model "m": timeout is read by the remote backend only, not openai`; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("error %v, want one containing %q", err, want)
	}
}
