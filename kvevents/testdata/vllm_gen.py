#!/usr/bin/python3
"""Generates the vLLM/SGLang ZMQ KV-event fixtures (vllm_*.msgpack) and what
kvgate must decode from them (vllm_*.json), with an encoder independent of
kvgate: Debian's python3-msgpack, and python3-xxhash for the byte-hash
mapping (kvevents.EngineHashFromBytes = XXH3-64 seed 1337).

The payloads follow vllm/distributed/kv_events.py: the batch is an array
[ts, events, data_parallel_rank] (trailing defaults omitted, msgspec
omit_defaults); events are msgspec tagged structs, either tagged arrays
(array_like=True: ["BlockStored", block_hashes, parent_block_hash,
token_ids, block_size, lora_id, medium, ...], older vLLM and SGLang) or
tagged maps ({"type": "BlockStored", ...}, current vLLM).

Run from this directory: python3 vllm_gen.py
"""
import hashlib
import json

import msgpack
import xxhash

BS = 4  # the block size the Go test configures


def toks(start, n):
    return list(range(start, start + n))


def sha(i):
    return hashlib.sha256(b"block-%d" % i).digest()


def eh(h):
    """kvgate's uint64 engine hash of a vLLM block hash."""
    if isinstance(h, bytes):
        return xxhash.xxh3_64_intdigest(h, seed=1337)
    return h & 0xFFFFFFFFFFFFFFFF


def stored(hashes, parent, tokens, lora=""):
    ev = {"blocks": [{"engine_hash": eh(h), "token_ids": tokens[i * BS:(i + 1) * BS]} for i, h in enumerate(hashes)]}
    if parent is not None:
        ev["parent_hash"] = eh(parent)
    if lora:
        ev["lora_name"] = lora
    return {"stored": ev}


def removed(hashes):
    return {"removed": {"engine_hashes": [eh(h) for h in hashes]}}


CLEARED = {"cleared": True}

cases = []


def case(name, payload, ts, dp_rank, events, skipped_blocks=0, skipped_events=0):
    cases.append((name, msgpack.packb(payload, use_bin_type=True), {
        "ts": ts, "dp_rank": dp_rank, "events": events,
        "skipped_blocks": skipped_blocks, "skipped_events": skipped_events,
    }))


# 1. Tagged arrays (array_like=True), int hashes, nil parent, every kind.
t1 = toks(100, 8)
case("vllm_array_int", [1700000000.25, [
    ["BlockStored", [11, 12], None, t1, BS, None, "GPU"],
    ["BlockStored", [13], 12, toks(200, 4), BS, None, None],
    ["BlockRemoved", [11], "GPU"],
    ["AllBlocksCleared"],
], 0], 1700000000.25, 0, [
    stored([11, 12], None, t1), stored([13], 12, toks(200, 4)), removed([11]), CLEARED])

# 2. Tagged maps (current vLLM), sha256 bytes hashes, bytes parent,
# lora_name, extra and unknown fields; no data_parallel_rank (default
# omitted).
t2 = toks(300, 12)
case("vllm_map_bytes", [1700000001.5, [
    {"type": "BlockStored", "block_hashes": [sha(1), sha(2), sha(3)], "parent_block_hash": None,
     "token_ids": t2, "block_size": BS, "lora_id": 3, "medium": "GPU", "lora_name": "sql-adapter",
     "extra_keys": [None, None, None], "group_idx": 0, "kv_cache_spec_kind": "full_attention",
     "a_field_from_the_future": {"x": [1, 2]}},
    {"type": "BlockStored", "block_hashes": [sha(4)], "parent_block_hash": sha(3),
     "token_ids": toks(400, 4), "block_size": BS, "lora_id": None, "medium": None, "lora_name": None},
    {"medium": "GPU", "block_hashes": [sha(1), sha(4)], "type": "BlockRemoved", "remaining_copy_counts": [0, 0]},
    {"type": "AllBlocksCleared"},
]], 1700000001.5, 0, [
    stored([sha(1), sha(2), sha(3)], None, t2, "sql-adapter"), stored([sha(4)], sha(3), toks(400, 4)),
    removed([sha(1), sha(4)]), CLEARED])

# 3. SGLang: tagged arrays without trailing defaults, attn_dp_rank 2, a
# BlockStoredWithMetadata (extra trailing field), negative Python-hash ints,
# an integer timestamp.
case("vllm_sglang_dp", [1700000002, [
    ["BlockStored", [-5, 7], None, toks(500, 8), BS, None],
    ["BlockStored", [9], 7, toks(600, 4), BS, None, "GPU", {"priority": 1}],
    ["BlockRemoved", [-5]],
], 2], 1700000002.0, 2, [
    stored([-5, 7], None, toks(500, 8)), stored([9], 7, toks(600, 4)), removed([-5])])

# 4. What is skipped and counted: another block size, another medium,
# another KV cache group, an unknown event type; the rest still applies.
case("vllm_skips", [1700000003.0, [
    ["BlockStored", [21, 22], None, toks(700, 16), 8, None, "GPU"],
    {"type": "BlockStored", "block_hashes": [23], "parent_block_hash": None, "token_ids": toks(800, 4),
     "block_size": BS, "lora_id": None, "medium": "CPU_PINNED", "lora_name": None},
    {"type": "BlockStored", "block_hashes": [24], "parent_block_hash": None, "token_ids": toks(900, 4),
     "block_size": BS, "lora_id": None, "medium": "GPU", "lora_name": None, "group_idx": 1},
    ["BlockRemoved", [23], "CPU_PINNED"],
    ["KVCacheOffloaded", [1, 2, 3]],
    ["BlockStored", [25], None, toks(1000, 4), BS, None, "GPU"],
], 0], 1700000003.0, 0, [stored([25], None, toks(1000, 4))], skipped_blocks=4, skipped_events=2)

# Malformed payloads: each must be refused as a whole.
bad = {
    "vllm_bad_not_msgpack": b"\xc1\x00\x01",
    "vllm_bad_not_array": msgpack.packb({"ts": 1}),
    "vllm_bad_short_batch": msgpack.packb([1.0]),
    "vllm_bad_hash_type": msgpack.packb([1.0, [["BlockStored", ["nope"], None, toks(0, 4), BS, None, None]]]),
    "vllm_bad_token_count": msgpack.packb([1.0, [["BlockStored", [1, 2], None, toks(0, 5), BS, None, None]]]),
    "vllm_bad_token_range": msgpack.packb([1.0, [["BlockStored", [1], None, [1, 2, 3, 1 << 33], BS, None, None]]]),
    "vllm_bad_missing_field": msgpack.packb([1.0, [{"type": "BlockStored", "block_hashes": [1], "block_size": BS}]]),
    "vllm_bad_no_tag": msgpack.packb([1.0, [{"block_hashes": [1]}]]),
    "vllm_bad_trailing": msgpack.packb([1.0, []]) + b"\x01",
}

manifest = {"block_size": BS, "cases": [], "malformed": sorted(bad)}
for name, payload, want in cases:
    with open(name + ".msgpack", "wb") as f:
        f.write(payload)
    with open(name + ".json", "w") as f:
        json.dump(want, f, indent=1, sort_keys=True)
        f.write("\n")
    manifest["cases"].append(name)
for name, payload in bad.items():
    with open(name + ".msgpack", "wb") as f:
        f.write(payload)
with open("vllm_manifest.json", "w") as f:
    json.dump(manifest, f, indent=1, sort_keys=True)
    f.write("\n")
