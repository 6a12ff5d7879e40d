package globalrouter

// Headers the front door (extproc) sets from a Decision. The request
// headers the global router reads (HeaderPool, HeaderWorkerID, HeaderDPRank,
// HeaderSession, ...) are declared with the Router; HeaderPool,
// HeaderWorkerID and HeaderDPRank are also set on the routed request and
// its response, so a pin and its answer share one name.
const (
	// HeaderDestination is the Gateway API Inference Extension header
	// Envoy's override_host LB policy reads: the ordered list (primary
	// host:port, then fallbacks); also the key of the same list in the
	// envoy.lb dynamic metadata.
	HeaderDestination = "x-gateway-destination-endpoint"
	// HeaderOverlapBlocks is the primary's KV overlap, in blocks.
	HeaderOverlapBlocks = "x-kvgate-overlap-blocks"
	// HeaderEndpoint is the primary's host:port, on the response.
	HeaderEndpoint = "x-kvgate-endpoint"
	// HeaderPrefiller is the prefill worker's host:port in disaggregated
	// serving; a client's own is removed.
	HeaderPrefiller = "x-prefiller-host-port"
	// HeaderExplain asks for an explanation (value 1 or true); the routed
	// request and the response carry it back.
	HeaderExplain = "x-kvgate-explain"
	// HeaderDropped is the reason of a refused request, on the local reply.
	HeaderDropped = "x-kvgate-dropped-reason"
	// HeaderDataParallelRank delivers the primary's rank to the engine:
	// vLLM reads X-data-parallel-rank
	// (vllm/entrypoints/openai/serving_engine.py, _get_data_parallel_rank),
	// SGLang X-Data-Parallel-Rank; header names are case-insensitive, so
	// one name serves both. A client's own is overwritten on routed
	// requests and removed on the others; HeaderDPRank stays the
	// informational copy.
	HeaderDataParallelRank = "x-data-parallel-rank"
)
