package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/kvevents"
	"github.com/kvgate/kvgate/tokenizer"
)

func TestTokenize(t *testing.T) {
	body := `{"model":"m","messages":[{"role":"user","content":"hello there, how are you today my friend?"}],"tools":[{"type":"function","function":{"name":"f"}}]}`
	var out bytes.Buffer
	if err := tokenize([]string{"--encoding", "cl100k_base", "--block-size", "4", "--lora", "ad"}, strings.NewReader(body), &out); err != nil {
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
	} {
		err := tokenize(tc.args, strings.NewReader(tc.in), &bytes.Buffer{})
		var ue *usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("tokenize(%q, %s) = %v, want a usage error (exit 2) containing %q", tc.args, tc.in, err, tc.want)
		}
	}
}
