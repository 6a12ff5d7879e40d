package extproc

import (
	"bytes"
	"encoding/json"
)

// Usage is an OpenAI response's token usage.
type Usage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
}

// usageOf reads the usage object of one OpenAI response or stream chunk;
// ok is false when there is none.
func usageOf(data []byte) (u Usage, ok bool) {
	if !bytes.Contains(data, []byte(`"usage"`)) {
		return Usage{}, false
	}
	var v struct {
		Usage *Usage `json:"usage"`
	}
	if json.Unmarshal(data, &v) != nil || v.Usage == nil {
		return Usage{}, false
	}
	return *v.Usage, true
}
