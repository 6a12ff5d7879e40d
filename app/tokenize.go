package app

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"

	"github.com/kvgate/kvgate/globalrouter"
	"github.com/kvgate/kvgate/kvevents"
	"github.com/kvgate/kvgate/tokenizer"
)

// usageError is bad input to a subcommand: exit status 2.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

func badInput(format string, args ...any) error {
	return &usageError{fmt.Errorf(format, args...)}
}

// tokenizeOutput is what `kvgate tokenize` prints: hashes are uint64,
// written as unsigned decimal JSON numbers.
type tokenizeOutput struct {
	Model          string   `json:"model"`
	Tokenizer      string   `json:"tokenizer"`
	BlockSize      int      `json:"block_size"`
	LoRA           string   `json:"lora,omitempty"`
	CacheSalt      string   `json:"cache_salt,omitempty"`
	IDs            []uint32 `json:"ids"`
	LocalHashes    []uint64 `json:"local_hashes"`
	SequenceHashes []uint64 `json:"sequence_hashes"`
	MMHashes       []string `json:"mm_hashes,omitempty"`
	// MMItems are the media parts as the block keys carry them: content
	// hash, its uint64 item hash (kvevents.MMHash) and placeholder tokens.
	MMItems  []mmItem `json:"mm_items,omitempty"`
	Rendered string   `json:"rendered"`
}

type mmItem struct {
	Hash     string `json:"hash"`
	ItemHash uint64 `json:"item_hash"`
	Offset   int    `json:"offset"`
	Length   int    `json:"length"`
}

// runTokenize is `kvgate tokenize`: a request body on stdin, the ids the
// router hashes and their block hashes on stdout.
func runTokenize(_ context.Context, args []string) error {
	return tokenize(args, os.Stdin, os.Stdout, os.Stderr)
}

// tokenize is `kvgate tokenize`; warnings (what the ids may not show) go
// to stderr.
func tokenize(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("tokenize", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: kvgate tokenize [flags] < body.json\n\nReads an OpenAI completions or chat completions body (or, with --path, a Responses API or Anthropic messages body) and prints the token ids the router hashes, Dynamo's local and sequence block hashes (unsigned decimal; salted with --cache-salt or the body's cache_salt, media items in the blocks they overlap) and the rendered prompt.")
		fs.PrintDefaults()
	}
	dir := fs.String("tokenizer-dir", "", "model folder with tokenizer.json and tokenizer_config.json")
	encoding := fs.String("encoding", "", "OpenAI encoding: cl100k_base or o200k_base")
	config := fs.String("config", "", "global router configuration file (with --model)")
	model := fs.String("model", "", "model whose tokenizer --config names (default: the body's model)")
	blockSize := fs.Int("block-size", 16, "KV block size in tokens (with --config: default the block_size of the pools serving the model, and one of theirs)")
	lora := fs.String("lora", "", "LoRA adapter name the blocks are hashed for")
	salt := fs.String("cache-salt", "", "cache_salt the blocks are hashed with (default: the body's cache_salt; both set and different is an error)")
	path := fs.String("path", "", "request path deciding the body's form: /v1/chat/completions, /v1/completions, /v1/responses, /v1/messages (default: by the body's fields)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &usageError{err}
	}
	if fs.NArg() > 0 {
		return badInput("unexpected arguments %q", fs.Args())
	}
	if *blockSize <= 0 {
		return badInput("--block-size: must be positive, got %d", *blockSize)
	}
	chosen := 0
	for _, s := range []string{*dir, *encoding, *config} {
		if s != "" {
			chosen++
		}
	}
	if chosen != 1 {
		return badInput("choose the tokenizer with exactly one of --tokenizer-dir, --encoding or --config")
	}
	data, err := io.ReadAll(io.LimitReader(stdin, 64<<20))
	if err != nil {
		return fmt.Errorf("reading stdin: %w", err)
	}
	body, err := tokenizer.ParseBodyNoModel(*path, data)
	if err != nil {
		return badInput("stdin: %v", err)
	}
	// The router hashes with the body's cache_salt; a flag that says
	// otherwise would print hashes the router never computes for this body.
	switch {
	case *salt != "" && body.CacheSalt != "" && *salt != body.CacheSalt:
		return badInput("--cache-salt %q and the body's cache_salt %q differ; drop one", *salt, body.CacheSalt)
	case *salt == "":
		*salt = body.CacheSalt
	}
	name := body.Model
	if *model != "" {
		name = *model
	}
	var cfg tokenizer.Config
	switch {
	case *dir != "":
		cfg = tokenizer.Config{Model: name, Backend: tokenizer.BackendHuggingFace, Path: *dir}
	case *encoding != "":
		cfg = tokenizer.Config{Model: name, Backend: tokenizer.BackendOpenAI, Encoding: *encoding}
	default:
		if name == "" {
			return badInput("--config: no model: set --model or the body's model")
		}
		gc, err := globalrouter.LoadConfig(*config, nil)
		if err != nil {
			return badInput("--config: %v", err)
		}
		// The router refuses a model no pool serves (404 unknown_model):
		// hashes printed for one would be hashes it never computes.
		if known := servedModels(gc); !slices.Contains(known, name) && !slices.Contains(known, "*") {
			return badInput("--config %s: no pool serves model %q (known: %s)", *config, name, strings.Join(known, ", "))
		}
		cfg = gc.TokenizerFor(name)
		// The router hashes a model once per block size of the pools
		// serving it: the hashes printed are for one of those.
		var sizes []int
		for _, p := range gc.Pools {
			if (slices.Contains(p.Models, name) || slices.Contains(p.Models, "*")) && !slices.Contains(sizes, p.BlockSize) {
				sizes = append(sizes, p.BlockSize)
			}
		}
		// A model configured as a LoRA adapter (lora_of) is hashed with
		// the adapter's seed, named by the model: as the router does.
		for _, m := range gc.Models {
			if m.Name != name || m.LoRAOf == "" || m.LoRAOf == name {
				continue
			}
			if *lora != "" && *lora != name {
				return badInput("--lora %q: %s configures %q as a LoRA adapter of %q, hashed as adapter %q", *lora, *config, name, m.LoRAOf, name)
			}
			*lora = name
		}
		switch {
		case flagSet(fs, "block-size") && !slices.Contains(sizes, *blockSize):
			return badInput("--block-size %d: the pools of %s serving %q hash with block sizes %v", *blockSize, *config, name, sizes)
		case !flagSet(fs, "block-size") && len(sizes) == 1:
			*blockSize = sizes[0]
		case !flagSet(fs, "block-size"):
			return badInput("--config %s: the pools serving %q hash with block sizes %v: choose one with --block-size", *config, name, sizes)
		}
	}
	cfg.Logger = discardLogger()
	tok, err := tokenizer.Load(cfg)
	if err != nil {
		return badInput("tokenizer: %v", err)
	}
	out := tokenizeOutput{Model: name, Tokenizer: tok.Name(), BlockSize: *blockSize, LoRA: *lora, CacheSalt: *salt}
	var mm []kvevents.MMSpan
	switch {
	case body.Chat != nil:
		// As the router encodes a chat: ids and media items.
		if out.IDs, mm, err = globalrouter.EncodeChat(tok, body.Chat); err != nil {
			return badInput("stdin: %v", err)
		}
		if len(body.Chat.Tools) > 0 && !tok.RendersTools() {
			fmt.Fprintf(stderr, "warning: the chat has tools, but tokenizer %s has no chat template that renders them: the ids below omit the tools (an engine whose template renders them computes others)\n", tok.Name())
		}
		out.MMHashes = body.Chat.MMHashes
		for i, s := range mm {
			out.MMItems = append(out.MMItems, mmItem{Hash: body.Chat.MMHashes[i], ItemHash: s.Hash, Offset: s.Offset, Length: s.Length})
		}
		if tok.HasChatTemplate() {
			out.Rendered, _ = tok.RenderChat(body.Chat)
		}
	case body.PromptTokens != nil:
		out.IDs = body.PromptTokens
		out.Rendered, _ = tok.Decode(body.PromptTokens)
	default:
		if out.IDs, err = tok.Encode(body.Prompt); err != nil {
			return badInput("stdin: %v", err)
		}
		out.Rendered = body.Prompt
	}
	local, err := globalrouter.BlockKeys(out.IDs, *blockSize, *lora, *salt, mm)
	if err != nil {
		return badInput("--block-size: %v", err)
	}
	out.LocalHashes = local
	out.SequenceHashes = kvevents.SequenceHashes(local)
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(out)
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// servedModels lists the models some pool of gc serves, sorted.
func servedModels(gc *globalrouter.Config) []string {
	var out []string
	for _, p := range gc.Pools {
		for _, m := range p.Models {
			if !slices.Contains(out, m) {
				out = append(out, m)
			}
		}
	}
	slices.Sort(out)
	return out
}
