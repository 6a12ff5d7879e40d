package extproc

import "testing"

// The SSE parser's tests (split-invariance, bounds) are lib/sse's.

func TestUsageOf(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Usage
		ok   bool
	}{
		{`{"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}`, Usage{3, 4}, true},
		{`{"choices":[],"usage":null}`, Usage{}, false},
		{`{"choices":[]}`, Usage{}, false},
		{`[DONE]`, Usage{}, false},
		{`{"usage":"x"}`, Usage{}, false},
		// The Responses API (openai 7.60.0, resources/responses/responses.d.ts:
		// ResponseUsage; ResponseCompletedEvent.response.usage).
		{`{"id":"resp_1","object":"response","usage":{"input_tokens":5,"output_tokens":6,"total_tokens":11}}`, Usage{5, 6}, true},
		{`{"type":"response.completed","response":{"usage":{"input_tokens":5,"output_tokens":6}}}`, Usage{5, 6}, true},
		{`{"type":"response.created","response":{"usage":null}}`, Usage{}, false},
		// Anthropic (@anthropic-ai/sdk 1.16.0, resources/messages/messages.d.ts:
		// Message.usage, RawMessageStartEvent.message, MessageDeltaUsage).
		{`{"type":"message","usage":{"input_tokens":8,"output_tokens":2}}`, Usage{8, 2}, true},
		{`{"type":"message_start","message":{"usage":{"input_tokens":8,"output_tokens":1}}}`, Usage{8, 1}, true},
		{`{"type":"message","usage":{"input_tokens":3,"cache_read_input_tokens":16,"cache_creation_input_tokens":2,"output_tokens":2}}`, Usage{21, 2}, true},
	} {
		got, ok := usageOf([]byte(tc.in), Usage{})
		if got != tc.want || ok != tc.ok {
			t.Errorf("usageOf(%s) = %v, %v; want %v, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

// TestUsageOfAnthropicStream: message_delta's usage has input_tokens null;
// the total keeps message_start's.
func TestUsageOfAnthropicStream(t *testing.T) {
	u, _ := usageOf([]byte(`{"type":"message_start","message":{"usage":{"input_tokens":8,"output_tokens":1}}}`), Usage{})
	u, ok := usageOf([]byte(`{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"input_tokens":null,"output_tokens":4}}`), u)
	if want := (Usage{8, 4}); !ok || u != want {
		t.Errorf("got %v, %v; want %v, true", u, ok, want)
	}
	// The mocker's: message_delta restates the input split by the cache.
	u, ok = usageOf([]byte(`{"type":"message_delta","usage":{"input_tokens":3,"cache_read_input_tokens":5,"output_tokens":4}}`), u)
	if want := (Usage{8, 4}); !ok || u != want {
		t.Errorf("got %v, %v; want %v, true", u, ok, want)
	}
}

// FuzzUsageOf: any response bytes read as a usage or none, never a panic.
func FuzzUsageOf(f *testing.F) {
	f.Add([]byte(`{"usage":{"prompt_tokens":3,"completion_tokens":4}}`))
	f.Add([]byte(`{"type":"response.completed","response":{"usage":{"input_tokens":5}}}`))
	f.Add([]byte(`{"type":"message_start","message":{"usage":{"input_tokens":8,"output_tokens":null}}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		u, ok := usageOf(data, Usage{})
		if !ok && u != (Usage{}) {
			t.Errorf("no usage but %v", u)
		}
	})
}
