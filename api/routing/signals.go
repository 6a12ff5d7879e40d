package routing

import (
	"strings"
	"time"
)

// EngineSample is one DP rank's signals, as its engine last reported them.
// Fields the engine did not report are zero and their Has flag false.
type EngineSample struct {
	// Engine is "vllm" or "sglang" (signals.EngineVLLM, EngineSGLang).
	Engine string
	// Running and Waiting are requests in the batch and in the queue.
	Running, Waiting float64
	// KVUsage is the KV cache usage, 0..1 (HasKVUsage when reported).
	KVUsage    float64
	HasKVUsage bool
	// Preemptions is vLLM's cumulative preemption count, or SGLang's
	// requests retracted since its last stats interval (a gauge).
	Preemptions float64
	// PrefixHitRate is the prefix cache hit rate, 0..1: SGLang's gauge, or
	// vLLM's hits / queries since the engine started (HasPrefixHitRate when
	// either is reported).
	PrefixHitRate    float64
	HasPrefixHitRate bool
	// LoRARunning and LoRAWaiting are the LoRA adapters of the requests
	// running and waiting, comma-joined as vLLM's vllm:lora_requests_info
	// labels carry them (a string keeps Sample comparable), and MaxLoRA
	// its max_lora label; HasLoRA when the engine reports them.
	LoRARunning, LoRAWaiting string
	MaxLoRA                  int
	HasLoRA                  bool
	// At is when the sample was scraped.
	At time.Time
}

// SignalsReport is the engine-signal side of a BestWorker choice, filled
// in when BestWorkerOptions.Signals points at one.
type SignalsReport struct {
	// Engine is the chosen rank's engine signals, when its metrics are
	// scraped (HasEngine).
	Engine    EngineSample
	HasEngine bool
	// Skipped lists the ranks the worker chain's filters left out, with
	// why: engine saturation (Config.SaturationWaiting,
	// SaturationKVUsage), a LoRA adapter not loaded. A forced worker is
	// never skipped. AllSaturated: every candidate was saturated, so none
	// was skipped for it and the best of all was chosen.
	Skipped      []Skip
	AllSaturated bool
}

// Skip is a rank BestWorker left out, and why.
type Skip struct {
	Worker WorkerKey
	Reason string
}

// HasAdapter reports whether adapter name is loaded on the rank: among the
// adapters of its running or of its waiting requests.
func (s EngineSample) HasAdapter(name string) (running, waiting bool) {
	return adapterListed(s.LoRARunning, name), adapterListed(s.LoRAWaiting, name)
}

// adapterListed reports whether name is in the comma-joined adapter list.
func adapterListed(list, name string) bool {
	if name == "" {
		return false
	}
	for a := range strings.SplitSeq(list, ",") {
		if strings.TrimSpace(a) == name {
			return true
		}
	}
	return false
}
