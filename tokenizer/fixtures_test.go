package tokenizer

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// Small tokenizer.json files built in code, for the tests that must run
// without the reference data (fuzzing, bad input, the chat cache).

// tinyByteLevel is a Llama-3-shaped byte-level BPE: the cl100k split
// pattern, ByteLevel, a handful of merges, special tokens and a BOS added
// by a TemplateProcessing post-processor.
func tinyByteLevel() map[string]any {
	vocab := map[string]int{}
	for b := 0; b < 256; b++ {
		vocab[string(byteToRune[b])] = b
	}
	merges := [][2]string{{"Ġ", "t"}, {"h", "e"}, {"Ġt", "he"}, {"i", "n"}, {"Ġ", "a"}, {"e", "r"}, {"Ġ", "Ġ"}, {"ĠĠ", "ĠĠ"}, {"Ċ", "Ċ"}, {"o", "u"}, {"Ġ", "y"}, {"Ġy", "ou"}}
	for _, m := range merges {
		if _, ok := vocab[m[0]+m[1]]; !ok {
			vocab[m[0]+m[1]] = len(vocab)
		}
	}
	n := len(vocab)
	return map[string]any{
		"version": "1.0",
		"added_tokens": []map[string]any{
			{"id": n, "content": "<|begin_of_text|>", "special": true},
			{"id": n + 1, "content": "<|im_start|>", "special": true},
			{"id": n + 2, "content": "<|im_end|>", "special": true},
		},
		"normalizer": nil,
		"pre_tokenizer": map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": patCL100K}, "behavior": "Isolated", "invert": false},
			map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
		}},
		"post_processor": map[string]any{"type": "Sequence", "processors": []any{
			map[string]any{"type": "ByteLevel"},
			map[string]any{"type": "TemplateProcessing",
				"single":         []any{map[string]any{"SpecialToken": map[string]any{"id": "<|begin_of_text|>", "type_id": 0}}, map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}}},
				"special_tokens": map[string]any{"<|begin_of_text|>": map[string]any{"id": "<|begin_of_text|>", "ids": []int{n}, "tokens": []string{"<|begin_of_text|>"}}},
			},
		}},
		"decoder": map[string]any{"type": "ByteLevel"},
		"model":   map[string]any{"type": "BPE", "vocab": vocab, "merges": merges, "ignore_merges": true},
	}
}

// tinySentencePiece is a Mistral-shaped model: ▁ normalizer, merges by
// rank over characters, byte fallback, BOS.
func tinySentencePiece() map[string]any {
	vocab := map[string]int{"<unk>": 0, "<s>": 1, "</s>": 2}
	for b := 0; b < 256; b++ {
		vocab[fmt.Sprintf("<0x%02X>", b)] = len(vocab)
	}
	for _, c := range "▁abcdefghijklmnopqrstuvwxyzT." {
		vocab[string(c)] = len(vocab)
	}
	merges := []string{"▁ t", "h e", "▁t he", "i n", "▁ a", "e r", "▁ ▁", "o u"}
	for _, m := range merges {
		var a, b string
		fmt.Sscanf(m, "%s %s", &a, &b)
		vocab[a+b] = len(vocab)
	}
	return map[string]any{
		"version": "1.0",
		"added_tokens": []map[string]any{
			{"id": 0, "content": "<unk>", "special": true},
			{"id": 1, "content": "<s>", "special": true},
			{"id": 2, "content": "</s>", "special": true},
		},
		"normalizer": map[string]any{"type": "Sequence", "normalizers": []any{
			map[string]any{"type": "Prepend", "prepend": "▁"},
			map[string]any{"type": "Replace", "pattern": map[string]any{"String": " "}, "content": "▁"},
		}},
		"pre_tokenizer": nil,
		"post_processor": map[string]any{"type": "TemplateProcessing",
			"single":         []any{map[string]any{"SpecialToken": map[string]any{"id": "<s>", "type_id": 0}}, map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}}},
			"special_tokens": map[string]any{"<s>": map[string]any{"id": "<s>", "ids": []int{1}, "tokens": []string{"<s>"}}},
		},
		"decoder": map[string]any{"type": "Sequence", "decoders": []any{
			map[string]any{"type": "Replace", "pattern": map[string]any{"String": "▁"}, "content": " "},
			map[string]any{"type": "ByteFallback"},
			map[string]any{"type": "Fuse"},
			map[string]any{"type": "Strip", "content": " ", "start": 1, "stop": 0},
		}},
		"model": map[string]any{"type": "BPE", "vocab": vocab, "merges": merges, "unk_token": "<unk>", "fuse_unk": true, "byte_fallback": true},
	}
}

// writeModel writes a model folder: tokenizer.json and, when template is
// not empty, tokenizer_config.json with that chat template.
func writeModel(t testing.TB, file map[string]any, template string) string {
	t.Helper()
	dir := t.TempDir()
	data, err := json.Marshal(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	if template != "" {
		cfg, _ := json.Marshal(map[string]any{"chat_template": template, "bos_token": "<|begin_of_text|>"})
		if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), cfg, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func loadTiny(t testing.TB, file map[string]any, template string) *Model {
	t.Helper()
	m, err := Load(Config{Model: "tiny", Backend: BackendHuggingFace, Path: writeModel(t, file, template)})
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	return m
}
