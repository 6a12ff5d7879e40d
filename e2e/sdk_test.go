package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvgate/kvgate/internal/testenv"
)

// sdkDir is where `make sdk` (mk/sdk.mk) installs the OpenAI and Anthropic
// Node SDKs: $KVGATE_SDK_DIR, else the repository's .cache/sdk.
func sdkDir(t *testing.T) string {
	if d := os.Getenv("KVGATE_SDK_DIR"); d != "" {
		return d
	}
	d, err := filepath.Abs("../.cache/sdk")
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// needSDKs returns node's path and the SDK folder, or skips the test when
// either is missing; under KVGATE_REQUIRE_TOOLS (make test sets it) a
// missing one fails it.
func needSDKs(t *testing.T) (node, dir string) {
	t.Helper()
	missing := func(what string) {
		msg := what + " is missing: run `make sdk` (mk/sdk.mk), which needs node and npm"
		if os.Getenv("KVGATE_REQUIRE_TOOLS") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		missing("node")
	}
	dir = sdkDir(t)
	for _, pkg := range []string{"openai", "@anthropic-ai/sdk"} {
		if _, err := os.Stat(filepath.Join(dir, "node_modules", pkg, "package.json")); err != nil {
			missing(filepath.Join(dir, "node_modules", pkg))
		}
	}
	return node, dir
}

type sdkRoute struct {
	Pool, Worker string
	Overlap      int
}

type sdkThrown struct {
	Thrown *struct {
		Status int
		Name   string
		Body   json.RawMessage
	}
}

// TestSDKs runs the official openai (7.60.0) and @anthropic-ai/sdk
// (1.16.0) Node packages (e2e/testdata/sdk/sdk.mjs) against kvgate up's
// gateway, every endpoint streamed and not, and checks what the SDKs made
// of the answers, and that the same long prompt sent twice through each
// API lands on the same worker with the cache the engine reads.
func TestSDKs(t *testing.T) {
	node, dir := needSDKs(t)
	s := startSystem(t, fixedProbes)
	ctx := testenv.ContextWithTimeout(t, 2*testTimeout)
	cmd := exec.CommandContext(ctx, node, "testdata/sdk/sdk.mjs", dir, s.GatewayURL(), "mock-llama")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var result json.RawMessage
	sc := bufio.NewScanner(stdout)
	sc.Buffer(nil, 4<<20)
	for sc.Scan() {
		var line struct {
			WaitFor *sdkRoute       `json:"waitFor"`
			Result  json.RawMessage `json:"result"`
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("sdk.mjs printed %q: %v", sc.Text(), err)
		}
		if line.WaitFor != nil {
			// The first send's blocks reach the index, then the second goes.
			waitCached(t, s, line.WaitFor.Pool, line.WaitFor.Worker, 20)
			fmt.Fprintln(stdin)
		}
		if line.Result != nil {
			result = line.Result
		}
	}
	if err := cmd.Wait(); err != nil || result == nil {
		t.Fatalf("node sdk.mjs: %v\n%s", err, stderr.String())
	}
	var r struct {
		Chat, Completions struct {
			Route                sdkRoute
			Object, Text, Finish string
		}
		ChatStream, CompletionsStream struct{ Text, Finish string }
		Responses                     struct {
			Route          sdkRoute
			Object, Status string
			OutputText     string
			OutputTypes    []string
			Usage          struct {
				InputTokens  int `json:"input_tokens"`
				OutputTokens int `json:"output_tokens"`
			}
		}
		ResponsesStream struct {
			Types          []string
			Deltas, Status string
			OutputText     string
		}
		ResponsesRawStream struct{ Types []string }
		ResponsesTool      struct {
			Call struct {
				Name      string
				Arguments map[string]string
				CallID    string
			}
			After     []string
			AfterText string
		}
		ResponsesToolStream struct {
			Types              []string
			Status, Type, Name string
			Arguments          map[string]string
		}
		OpenaiModel  struct{ ID, Object string }
		OpenaiModels struct{ IDs []string }
		Messages     struct {
			Route                  sdkRoute
			Type, Role, Stop, Text string
			Blocks                 []string
			Usage                  struct {
				InputTokens  int `json:"input_tokens"`
				OutputTokens int `json:"output_tokens"`
			}
		}
		MessagesStream struct {
			Types                 []string
			Text, Stop, FinalText string
		}
		MessagesTool struct {
			Stop, Name, AfterStop string
			Input                 map[string]string
			After                 []string
		}
		MessagesToolStream struct {
			Stop, Type, Partial string
			Input               map[string]string
		}
		AnthropicModel                                    struct{ ID, Type, DisplayName string }
		ResponsesError, MessagesError, MessagesBadRequest sdkThrown
		Routing                                           map[string]struct {
			First, Second sdkRoute
			Usage         json.RawMessage
		}
	}
	if err := json.Unmarshal(result, &r); err != nil {
		t.Fatalf("result %s: %v", result, err)
	}
	t.Logf("sdk.mjs result: %s", result)
	words := func(s string) int { return len(strings.Fields(s)) }

	// OpenAI chat and completions.
	if r.Chat.Object != "chat.completion" || words(r.Chat.Text) != 3 || r.Chat.Route.Worker == "" || words(r.ChatStream.Text) != 3 {
		t.Errorf("chat %+v, stream %+v", r.Chat, r.ChatStream)
	}
	if r.Completions.Object != "text_completion" || words(r.Completions.Text) != 3 || words(r.CompletionsStream.Text) != 3 {
		t.Errorf("completions %+v, stream %+v", r.Completions, r.CompletionsStream)
	}
	// Responses: the SDK's output_text, its stream helper's accumulation.
	if r.Responses.Object != "response" || r.Responses.Status != "incomplete" || words(r.Responses.OutputText) != 3 ||
		!slices.Equal(r.Responses.OutputTypes, []string{"message"}) || r.Responses.Route.Worker == "" || r.Responses.Usage.OutputTokens != 3 {
		t.Errorf("responses %+v", r.Responses)
	}
	wantText := []string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
		"response.output_text.delta", "response.output_text.delta", "response.output_text.delta", "response.output_text.done",
		"response.content_part.done", "response.output_item.done", "response.incomplete"}
	if diff := cmp.Diff(wantText, r.ResponsesStream.Types); diff != "" {
		t.Errorf("responses.stream events (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(wantText, r.ResponsesRawStream.Types); diff != "" {
		t.Errorf("responses.create stream events (-want +got):\n%s", diff)
	}
	if r.ResponsesStream.OutputText != r.ResponsesStream.Deltas || words(r.ResponsesStream.OutputText) != 3 {
		t.Errorf("responses.stream: output_text %q, deltas %q", r.ResponsesStream.OutputText, r.ResponsesStream.Deltas)
	}
	if r.ResponsesTool.Call.Name != "get_weather" || r.ResponsesTool.Call.Arguments["city"] == "" || r.ResponsesTool.Call.CallID == "" ||
		!slices.Equal(r.ResponsesTool.After, []string{"message"}) || words(r.ResponsesTool.AfterText) != 2 {
		t.Errorf("responses function call round %+v", r.ResponsesTool)
	}
	if r.ResponsesToolStream.Type != "function_call" || r.ResponsesToolStream.Status != "completed" || r.ResponsesToolStream.Arguments["city"] == "" ||
		!slices.Contains(r.ResponsesToolStream.Types, "response.function_call_arguments.done") {
		t.Errorf("responses function call stream %+v", r.ResponsesToolStream)
	}
	// Models.
	if r.OpenaiModel.ID != "mock-llama" || r.OpenaiModel.Object != "model" || !slices.Contains(r.OpenaiModels.IDs, "mock-llama") {
		t.Errorf("openai models %+v %+v", r.OpenaiModel, r.OpenaiModels)
	}
	if r.AnthropicModel.ID != "mock-llama" || r.AnthropicModel.Type != "model" || r.AnthropicModel.DisplayName == "" {
		t.Errorf("anthropic model %+v", r.AnthropicModel)
	}
	// Anthropic Messages.
	if r.Messages.Type != "message" || r.Messages.Role != "assistant" || r.Messages.Stop != "max_tokens" || words(r.Messages.Text) != 3 ||
		r.Messages.Route.Worker == "" || r.Messages.Usage.OutputTokens != 3 {
		t.Errorf("messages %+v", r.Messages)
	}
	wantEvents := []string{"message_start", "content_block_start", "content_block_delta", "content_block_delta", "content_block_delta",
		"content_block_stop", "message_delta", "message_stop"}
	if diff := cmp.Diff(wantEvents, r.MessagesStream.Types); diff != "" {
		t.Errorf("messages.stream events (-want +got):\n%s", diff)
	}
	if r.MessagesStream.Text != r.MessagesStream.FinalText || words(r.MessagesStream.Text) != 3 || r.MessagesStream.Stop != "max_tokens" {
		t.Errorf("messages.stream %+v", r.MessagesStream)
	}
	if r.MessagesTool.Stop != "tool_use" || r.MessagesTool.Name != "get_weather" || r.MessagesTool.Input["city"] == "" ||
		r.MessagesTool.AfterStop != "max_tokens" || !slices.Equal(r.MessagesTool.After, []string{"text"}) {
		t.Errorf("messages tool round %+v", r.MessagesTool)
	}
	if r.MessagesToolStream.Stop != "tool_use" || r.MessagesToolStream.Type != "tool_use" || r.MessagesToolStream.Input["city"] == "" {
		t.Errorf("messages tool stream %+v", r.MessagesToolStream)
	}
	// Errors, each in its API's shape as its SDK reads it.
	checkThrown := func(name string, got sdkThrown, status int, errClass string, shape func(json.RawMessage) bool) {
		t.Helper()
		if got.Thrown == nil || got.Thrown.Status != status || got.Thrown.Name != errClass || !shape(got.Thrown.Body) {
			t.Errorf("%s: thrown %+v, want %s %d in its API's error shape", name, got.Thrown, errClass, status)
		}
	}
	openaiShape := func(b json.RawMessage) bool {
		var e struct{ Message, Type string }
		return json.Unmarshal(b, &e) == nil && e.Message != "" && e.Type != ""
	}
	anthropicShape := func(typ string) func(json.RawMessage) bool {
		return func(b json.RawMessage) bool {
			var e struct {
				Type  string
				Error struct{ Type, Message string }
			}
			return json.Unmarshal(b, &e) == nil && e.Type == "error" && e.Error.Type == typ && e.Error.Message != ""
		}
	}
	checkThrown("responses, unknown model", r.ResponsesError, 404, "NotFoundError", openaiShape)
	checkThrown("messages, unknown model", r.MessagesError, 404, "NotFoundError", anthropicShape("not_found_error"))
	checkThrown("messages, no messages", r.MessagesBadRequest, 400, "BadRequestError", anthropicShape("invalid_request_error"))

	// Routing: the same long prompt twice through each API.
	for _, api := range []string{"chat", "completions", "responses", "messages"} {
		rt, ok := r.Routing[api]
		if !ok {
			t.Errorf("routing %s: no result", api)
			continue
		}
		if rt.Second.Worker == "" || rt.Second.Pool != rt.First.Pool || rt.Second.Worker != rt.First.Worker {
			t.Errorf("routing %s: second send on %+v, want %+v", api, rt.Second, rt.First)
		}
		if rt.Second.Overlap < 20 {
			t.Errorf("routing %s: second send overlap %d blocks, want ≥ 20", api, rt.Second.Overlap)
		}
		var u struct {
			Chat struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
			Responses struct {
				Cached int `json:"cached_tokens"`
			} `json:"input_tokens_details"`
			Anthropic int `json:"cache_read_input_tokens"`
		}
		json.Unmarshal(rt.Usage, &u)
		hit := max(u.Chat.Cached, u.Responses.Cached, u.Anthropic)
		if hit/16 != rt.Second.Overlap && hit/16 != rt.Second.Overlap-1 {
			t.Errorf("routing %s: engine cache hit %d tokens, router overlap %d blocks (usage %s)", api, hit, rt.Second.Overlap, rt.Usage)
		}
	}
	waitIdle(t, s)
}
