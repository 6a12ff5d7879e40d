// Package kvevents holds what engines tell routers about their KV caches:
// the event types (Stored, Removed, Cleared, wrapped in a RouterEvent), their
// JSON and msgpack encodings, and kvgate's block hashing.
//
// # Block hashing
//
// Tokens are cut into blocks of blockSize; only complete blocks count. A
// block's local hash is XXH3-64 over its token ids as little-endian u32,
// with seed 1337 (or, for a LoRA adapter, a seed derived from the adapter
// name, so adapters never share blocks). A block's sequence hash chains the
// local hashes: seq[0] = local[0], seq[i] = XXH3-64(LE(seq[i-1]) ‖
// LE(local[i]), 1337). These match NVIDIA Dynamo's, so a Dynamo-format event
// stream can be consumed. Engines keep their own opaque block hashes; the
// router never reproduces them: events carry token ids, the router hashes
// them itself and keeps engine hash → block maps for removals.
//
// Engine hashes are uint64. Engines that hash to bytes (vLLM's sha256 mode)
// are mapped with EngineHashFromBytes.
package kvevents
