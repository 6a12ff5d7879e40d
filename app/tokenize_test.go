package app

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/kvevents"
	"github.com/kvgate/kvgate/tokenizer"
)

func TestTokenize(t *testing.T) {
	body := `{"model":"m","messages":[{"role":"user","content":"hello there, how are you today my friend?"}],"tools":[{"type":"function","function":{"name":"f"}}]}`
	var out bytes.Buffer
	if err := tokenize([]string{"--encoding", "cl100k_base", "--block-size", "4", "--lora", "ad"}, strings.NewReader(body), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	var got tokenizeOutput
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	// The router's ids: the same body through the same parser and model.
	tok, err := tokenizer.Load(tokenizer.Config{Model: "m", Backend: tokenizer.BackendOpenAI, Encoding: "cl100k_base"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := tokenizer.ParseBody(tokenizer.PathChat, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	ids, err := tok.EncodeChat(b.Chat)
	if err != nil {
		t.Fatal(err)
	}
	local, _ := kvevents.LocalHashes(ids, 4, "ad")
	rendered, _ := tok.RenderChat(b.Chat)
	if !slicesEqual(got.IDs, ids) || !slicesEqual(got.LocalHashes, local) || !slicesEqual(got.SequenceHashes, kvevents.SequenceHashes(local)) || got.Rendered != rendered {
		t.Errorf("tokenize printed %+v, want ids %v local %v rendered %q", got, ids, local, rendered)
	}
	// Decimal, unsigned: a hash above 2^63 is printed as such.
	if strings.Contains(out.String(), "-") && !strings.Contains(rendered, "-") {
		t.Errorf("negative number in %s", out.String())
	}
}

func slicesEqual[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestTokenizeBadInput(t *testing.T) {
	for _, tc := range []struct {
		args []string
		in   string
		want string // in the error
	}{
		{[]string{"--encoding", "cl100k_base"}, `{"model":"m","messages":3}`, "stdin: messages: must be a list"},
		{[]string{"--encoding", "cl100k_base"}, `{"model":"m","messages":[{"role":"user","content":"x"}]`, "stdin: request body is not valid JSON"},
		{[]string{"--encoding", "nope"}, `{"model":"m","prompt":"x"}`, "tokenizer:"},
		{[]string{}, `{"model":"m","prompt":"x"}`, "exactly one of --tokenizer-dir, --encoding or --config"},
		{[]string{"--encoding", "cl100k_base", "--block-size", "0"}, `{"model":"m","prompt":"x"}`, "--block-size"},
		{[]string{"--tokenizer-dir", "/nonexistent"}, `{"model":"m","prompt":"x"}`, "/nonexistent"},
		{[]string{"--config", "/nonexistent.yaml", "--model", "m"}, `{"model":"m","prompt":"x"}`, "--config"},
		{[]string{"--config", "../examples/pools-local.yaml", "--model", "nosuch"}, `{"prompt":"x"}`, `no pool serves model "nosuch" (known: mock-model)`},
		{[]string{"--config", "../examples/pools-local.yaml"}, `{"model":"nosuch","prompt":"x"}`, `no pool serves model "nosuch"`},
	} {
		err := tokenize(tc.args, strings.NewReader(tc.in), &bytes.Buffer{}, io.Discard)
		var ue *usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("tokenize(%q, %s) = %v, want a usage error (exit 2) containing %q", tc.args, tc.in, err, tc.want)
		}
	}
}

// TestTokenizeCacheSalt: --cache-salt, or the body's own cache_salt,
// salts the printed hashes as the router salts the request's; the two
// set and different is refused.
func TestTokenizeCacheSalt(t *testing.T) {
	const prompt = `"prompt":"one two three four five six seven eight nine ten eleven twelve"`
	run := func(args []string, body string) (tokenizeOutput, error) {
		t.Helper()
		var out bytes.Buffer
		err := tokenize(append([]string{"--encoding", "cl100k_base", "--block-size", "4"}, args...), strings.NewReader(body), &out, io.Discard)
		var got tokenizeOutput
		if err == nil {
			if err := json.Unmarshal(out.Bytes(), &got); err != nil {
				t.Fatalf("%v: %s", err, out.String())
			}
		}
		return got, err
	}
	plain, err := run(nil, `{"model":"m",`+prompt+`}`)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := kvevents.RequestHashes(plain.IDs, 4, "", "tenant-a", nil)
	for _, tc := range []struct {
		name string
		args []string
		body string
	}{
		{"flag", []string{"--cache-salt", "tenant-a"}, `{"model":"m",` + prompt + `}`},
		{"body", nil, `{"model":"m",` + prompt + `,"cache_salt":"tenant-a"}`},
		{"both, equal", []string{"--cache-salt", "tenant-a"}, `{"model":"m",` + prompt + `,"cache_salt":"tenant-a"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := run(tc.args, tc.body)
			if err != nil {
				t.Fatal(err)
			}
			if got.CacheSalt != "tenant-a" || !slicesEqual(got.LocalHashes, want) || !slicesEqual(got.SequenceHashes, kvevents.SequenceHashes(want)) {
				t.Errorf("printed salt %q local %v, want tenant-a %v", got.CacheSalt, got.LocalHashes, want)
			}
			for i, h := range got.LocalHashes {
				if i < len(plain.LocalHashes) && h == plain.LocalHashes[i] {
					t.Errorf("block %d: salted hash equals the unsalted one", i)
				}
			}
		})
	}
	_, err = run([]string{"--cache-salt", "tenant-b"}, `{"model":"m",`+prompt+`,"cache_salt":"tenant-a"}`)
	var ue *usageError
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), "differ") {
		t.Errorf("conflicting salts: %v, want a usage error", err)
	}
}

// TestTokenizeMedia: a chat with an image prints the item as the router
// keys it, and hashes its blocks with it.
func TestTokenizeMedia(t *testing.T) {
	body := `{"model":"m","messages":[{"role":"system","content":"You describe pictures for people who cannot see them, carefully."},
		{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://x/a.png"}},{"type":"text","text":"What is in it? Say it in a few words."}]}]}`
	var out bytes.Buffer
	if err := tokenize([]string{"--encoding", "cl100k_base", "--block-size", "4"}, strings.NewReader(body), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	var got tokenizeOutput
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	tok, err := tokenizer.Load(tokenizer.Config{Model: "m", Backend: tokenizer.BackendOpenAI, Encoding: "cl100k_base"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := tokenizer.ParseBody(tokenizer.PathChat, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	ids, mm, err := globalrouter.EncodeChat(tok, b.Chat)
	if err != nil {
		t.Fatal(err)
	}
	local, _ := globalrouter.BlockKeys(ids, 4, "", "", mm)
	if len(got.MMItems) != 1 || len(mm) != 1 {
		t.Fatalf("mm_items = %+v, want one", got.MMItems)
	}
	it := got.MMItems[0]
	if it.Hash != b.Chat.MMHashes[0] || it.ItemHash != kvevents.MMHash(it.Hash) || it.Offset != mm[0].Offset || it.Length != mm[0].Length || it.Offset == 0 {
		t.Errorf("mm_items[0] = %+v, want the router's item %+v", it, mm[0])
	}
	if !slicesEqual(got.IDs, ids) || !slicesEqual(got.LocalHashes, local) {
		t.Errorf("printed ids/hashes are not the router's")
	}
}

// TestTokenizeWarnsOfUnrenderedTools: a chat with tools, rendered by a
// template that does not render them (cl100k_base's ChatML), says so on
// stderr; one without tools does not.
func TestTokenizeWarnsOfUnrenderedTools(t *testing.T) {
	const tools = `,"tools":[{"type":"function","function":{"name":"f","parameters":{}}}]`
	for _, tc := range []struct {
		body string
		warn bool
	}{
		{`{"model":"m","messages":[{"role":"user","content":"hi"}]` + tools + `}`, true},
		{`{"model":"m","messages":[{"role":"user","content":"hi"}]}`, false},
	} {
		var stderr bytes.Buffer
		if err := tokenize([]string{"--encoding", "cl100k_base"}, strings.NewReader(tc.body), io.Discard, &stderr); err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(stderr.String(), "warning: the chat has tools"); got != tc.warn {
			t.Errorf("body %s: warned %v (stderr %q), want %v", tc.body, got, stderr.String(), tc.warn)
		}
	}
}

// TestTokenizeKnownModel: --config with a model some pool serves prints its ids.
func TestTokenizeKnownModel(t *testing.T) {
	var out bytes.Buffer
	if err := tokenize([]string{"--config", "../examples/pools-local.yaml", "--model", "mock-model"}, strings.NewReader(`{"prompt":"x"}`), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
}

// TestTokenizeConfigBlockSize: with --config the block size is the one
// the router hashes the model with, its pools' block_size (the flag's 16
// was printed whatever the pools); a --block-size no serving pool has is
// refused.
func TestTokenizeConfigBlockSize(t *testing.T) {
	file := filepath.Join(t.TempDir(), "pools.yaml")
	cfg := `pools:
  - name: a
    models: [m]
    block_size: 64
    routers: {static: ["127.0.0.1:1"]}
  - name: b
    models: [m, sql]
    block_size: 64
    routers: {static: ["127.0.0.1:2"]}
models:
  - name: sql
    lora_of: m
`
	if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := tokenize([]string{"--config", file, "--model", "m"}, strings.NewReader(`{"prompt":"x"}`), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	var got struct {
		BlockSize int `json:"block_size"`
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil || got.BlockSize != 64 {
		t.Errorf("block_size %d (%v), want the pool's 64", got.BlockSize, err)
	}
	err := tokenize([]string{"--config", file, "--model", "m", "--block-size", "16"}, strings.NewReader(`{"prompt":"x"}`), &out, io.Discard)
	if err == nil || !strings.Contains(err.Error(), `--block-size 16: the pools of `+file+` serving "m" hash with block sizes [64]`) {
		t.Errorf("--block-size 16: %v", err)
	}
}

// TestTokenizeConfigLoRA: with --config, a model configured as a LoRA
// adapter (lora_of) is hashed with the adapter's seed, as the router
// hashes it, without --lora; a --lora naming another adapter is refused.
func TestTokenizeConfigLoRA(t *testing.T) {
	file := filepath.Join(t.TempDir(), "pools.yaml")
	cfg := `models:
  - name: sql
    lora_of: m
pools:
  - name: a
    models: [m, sql]
    routers: {static: ["127.0.0.1:1"]}
`
	if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	body := `{"prompt":"` + strings.Repeat("word ", 40) + `"}`
	var viaConfig, viaFlag bytes.Buffer
	if err := tokenize([]string{"--config", file, "--model", "sql"}, strings.NewReader(body), &viaConfig, io.Discard); err != nil {
		t.Fatal(err)
	}
	if err := tokenize([]string{"--encoding", "cl100k_base", "--model", "sql", "--lora", "sql"}, strings.NewReader(body), &viaFlag, io.Discard); err != nil {
		t.Fatal(err)
	}
	if viaConfig.String() != viaFlag.String() {
		t.Errorf("--config of an adapter:\n%s\nwant as --lora sql:\n%s", viaConfig.String(), viaFlag.String())
	}
	err := tokenize([]string{"--config", file, "--model", "sql", "--lora", "other"}, strings.NewReader(body), &viaConfig, io.Discard)
	if err == nil || !strings.Contains(err.Error(), `configures "sql" as a LoRA adapter of "m"`) {
		t.Errorf("--lora other: %v", err)
	}
}
