// Package kvevents holds what engines tell routers about their KV caches:
// the event types (Stored, Removed, Cleared, Skipped, wrapped in a
// RouterEvent), their JSON and msgpack encodings, kvgate's block hashing,
// the publisher (PublishStored…, dump answers), the engine decoders that
// turn an engine's own event stream into kvgate events, and the NATS
// subjects they travel on. The vLLM/SGLang relay is kvevents/relay. Who is
// alive (etcd keys, worker records, roles) is package membership's, not
// this one's.
//
// # Block hashing
//
// Tokens are cut into blocks of blockSize; only complete blocks count. A
// block's local hash is XXH3-64 over its token ids as little-endian u32,
// followed by the sorted content hashes (MMHash) of the multimodal items
// whose placeholders it holds, with the chain's seed: ChainSeed(lora,
// salt) = 1337 + XXH3-64(lora, 0) + XXH3-64(salt, 1), wrapping, each term
// only when set, so adapters, cache salts and images never share blocks.
// A block's sequence hash chains the local hashes: seq[0] = local[0],
// seq[i] = XXH3-64(LE(seq[i-1]) ‖ LE(local[i]), 1337). These match NVIDIA
// Dynamo's, so a Dynamo-format event stream can be consumed. Requests are
// hashed with AppendRequestHashes. Engines keep their own opaque block
// hashes; the router never reproduces them: events carry token ids, the
// router hashes them itself and keeps engine hash → block maps for
// removals.
//
// Engine hashes are uint64. Engines that hash to bytes (vLLM's sha256 mode)
// are mapped with EngineHashFromBytes.
//
// # Tiers
//
// Stored and Removed carry the medium of the cache tier they concern
// (TierOf: GPU, CPU, disk, external); "" is the GPU. A lower-tier Stored may
// name its blocks by engine hash alone: copies of blocks the worker holds
// on another tier.
//
// # Engine decoders
//
// EngineDecoder is the seam between an engine's wire format and the relay;
// NewVLLMDecoder decodes vLLM's and SGLang's ZMQ msgpack batches
// (vllm_msgpack.go documents what is accepted). A malformed event is
// skipped and counted by SkipReason; the rest of its batch is kept.
// CheckMsgpack bounds every msgpack length against the message before a
// decoder allocates.
//
// # Files
//
// event.go (Event, RouterEvent, tiers, SkipNotice; JSON and msgpack
// encodings), hash.go (block and sequence hashes, seeds), xxh3.go (the
// specialised XXH3-64 paths), subjects.go (the NATS subjects),
// publisher.go (Publisher: an engine's events onto NATS, with ids and
// dumps), dump.go (dump requests and replies, paged), engine.go
// (EngineDecoder, EngineBatch, SkipReason), msgpackcheck.go
// (CheckMsgpack), vllm_msgpack.go (the vLLM/SGLang wire format: batches,
// ranks, msgpack scalars), vllm_msgpack_event.go (one event's fields:
// hashes, token ids, extra_keys), vllm_msgpack_apply.go (a decoded event
// into kvgate's: KV cache groups, cache salts, lower tiers),
// vllm_msgpack_encode.go (the encoder, for tests and the mocker).
package kvevents
