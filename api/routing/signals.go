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
	// TTFT, ITL, Queue, Prefill and Decode are the engine's own latency
	// histograms, cumulative since it started, when scraped (Has): the
	// time to first token, the inter-token latency, and the per-request
	// queue, prefill and decode phases (vLLM; SGLang reports the queue).
	// The local router's calibration takes their interval deltas.
	TTFT, ITL, Queue, Prefill, Decode HistogramTotals
	// At is when the sample was scraped.
	At time.Time
}

// HistogramTotals are a Prometheus histogram's cumulative _sum (in the
// histogram's unit, seconds here) and _count.
type HistogramTotals struct {
	Sum, Count float64
	Has        bool
}

// Mean is the mean observation between prev and h (Sum and Count deltas)
// and the observations in between; ok is false when either lacks the
// histogram, nothing was observed, or the totals went down (the engine
// restarted: the interval is unknown).
func (h HistogramTotals) Mean(prev HistogramTotals) (mean, count float64, ok bool) {
	if !h.Has || !prev.Has {
		return 0, 0, false
	}
	dc, ds := h.Count-prev.Count, h.Sum-prev.Sum
	if !(dc > 0) || ds < 0 {
		return 0, 0, false
	}
	return ds / dc, dc, true
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
