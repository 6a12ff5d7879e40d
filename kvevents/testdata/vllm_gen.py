#!/usr/bin/python3
"""Generates the engine KV-event fixtures (*.msgpack), what kvgate must
decode from them (*.json) and the manifest (engine_manifest.json).

The payloads are built from the engines' own struct definitions, copied
below field for field with their msgspec options:

  vLLM   vllm/distributed/kv_events.py at vllm-project/vllm commit
         0181ea3173e53eea8cf04a86891488e3dc89bb34: EventBatch (omit_defaults,
         not array_like: a map), KVCacheEvent (omit_defaults, tag=True, not
         array_like: tagged maps), BlockStored, BlockRemoved,
         AllBlocksCleared.
  vLLM, array layout: the same structs with array_like=True on EventBatch
         and KVCacheEvent and BlockStored ending at medium, the layout
         SGLang keeps (below) and older vLLM used.
  SGLang python/sglang/srt/disaggregation/kv_events.py at sgl-project/sglang
         commit 006d053f182f9b488d2bd841afa06d5f9120a258: EventBatch and
         KVCacheEvent both array_like=True, omit_defaults=True, tag=True on
         events; BlockStored ends at lora_id; BlockRemoved has only
         block_hashes. Later SGLang appends attn_dp_rank (EventBatch),
         medium (both events), string adapter ids in lora_id and EAGLE
         bigram pages (token_ids as [token, next_token] pairs); the
         "sglang_new" structs add those fields as defaults, so an old
         payload stays a prefix of a new one.
  SGLang with cache salts, two wire shapes of the same file:
         "sglang_meta": after sgl-project/sglang#30827 (merged 2026-07,
         SGLang 0.5.18): KVCacheEvent and EventBatch array_like without
         omit_defaults (so medium and attn_dp_rank are always written),
         BlockStored ends at medium, and a salted store is
         BlockStoredWithMetadata(BlockStored, tag="BlockStored",
         kw_only=True) whose kw_only field metadata: BlockStoredMetadata
         comes last (position 7 after the tag); BlockStoredMetadata is a
         plain msgspec map {"cache_salt": str} (omit_defaults). The
         recorder (python/sglang/srt/mem_cache/events.py,
         KVCacheEventRecorder.record_store) attaches it to every page of a
         salted node. "sglang_map": after sgl-project/sglang#37482 (issue
         #38561): KVCacheEvent(omit_defaults=True, tag=True) without
         array_like, so events are tagged maps, and BlockStored carries
         cache_salt and session_id as optional fields; EventBatch stays an
         array.

Debian has no python3-msgspec, so msgspec's encoding is reproduced with
python3-msgpack (use_bin_type): a struct with array_like=True encodes as an
array of its fields in order, a tagged one with its tag (the class name)
first, and omit_defaults drops trailing fields equal to their defaults;
without array_like it is a map in field order, a tagged one with "type"
first, and omit_defaults drops every field equal to its default. Bytes
block hashes (vLLM's sha256 modes) map to kvgate's uint64 engine hashes
with python3-xxhash (kvevents.EngineHashFromBytes = XXH3-64 seed 1337),
multimodal identifiers with kvevents.MMHash (XXH3-64 seed 0), and the
expected kvgate local hashes (local_hashes) are computed here too:
XXH3-64 over the block's tokens as LE u32 then its sorted mm hashes as LE
u64, seeded 1337 + XXH3-64(lora_name, 0) [+ XXH3-64(cache_salt, 1)],
wrapping (Dynamo's compute_block_hash_for_seq and compute_salt_hash).

Run from this directory: /usr/bin/python3 vllm_gen.py
(Debian packages python3-msgpack and python3-xxhash.)
"""
import hashlib
import json
import struct

import msgpack
import xxhash

BS = 4  # the block size the Go test configures
LORA_NAMES = {"3": "sql-adapter", "a1b2": "chat-adapter"}  # the decoder's id table
M64 = (1 << 64) - 1
REQUIRED = object()


class Struct:
    def __init__(self, name, fields, array_like, omit_defaults, tag):
        self.name, self.fields = name, fields
        self.array_like, self.omit_defaults, self.tag = array_like, omit_defaults, tag

    def __call__(self, **values):
        unknown = set(values) - {f for f, _ in self.fields}
        assert not unknown, (self.name, unknown)
        vals = []
        for f, default in self.fields:
            if f in values:
                vals.append((f, values[f], default))
            else:
                assert default is not REQUIRED, (self.name, f)
                vals.append((f, default, default))
        if self.array_like:
            out = [v for _, v, _ in vals]
            if self.omit_defaults:
                while vals and vals[-1][2] is not REQUIRED and vals[-1][1] == vals[-1][2]:
                    vals.pop()
                    out.pop()
            return ([self.name] if self.tag else []) + out
        out = {"type": self.name} if self.tag else {}
        for f, v, d in vals:
            if self.omit_defaults and d is not REQUIRED and v == d:
                continue
            out[f] = v
        return out


# vLLM, current (map layout).
STORED_FIELDS = [("block_hashes", REQUIRED), ("parent_block_hash", REQUIRED), ("token_ids", REQUIRED),
                 ("block_size", REQUIRED), ("lora_id", REQUIRED), ("medium", REQUIRED), ("lora_name", REQUIRED),
                 ("extra_keys", None), ("group_idx", None), ("kv_cache_spec_kind", None),
                 ("kv_cache_spec_sliding_window", None)]
vllm = {
    "batch": Struct("EventBatch", [("ts", REQUIRED), ("events", REQUIRED), ("data_parallel_rank", None)], False, True, False),
    "stored": Struct("BlockStored", STORED_FIELDS, False, True, True),
    "removed": Struct("BlockRemoved", [("block_hashes", REQUIRED), ("medium", REQUIRED), ("group_idx", None)], False, True, True),
    "cleared": Struct("AllBlocksCleared", [], False, True, True),
}
# vLLM, array layout.
vllm_array = {
    "batch": Struct("EventBatch", [("ts", REQUIRED), ("events", REQUIRED), ("data_parallel_rank", None)], True, True, False),
    "stored": Struct("BlockStored", STORED_FIELDS[:6], True, True, True),
    "removed": Struct("BlockRemoved", [("block_hashes", REQUIRED), ("medium", REQUIRED)], True, True, True),
    "cleared": Struct("AllBlocksCleared", [], True, True, True),
}
# SGLang at the cited commit, and with the fields later SGLang appends.
sglang = {
    "batch": Struct("EventBatch", [("ts", REQUIRED), ("events", REQUIRED)], True, True, False),
    "stored": Struct("BlockStored", STORED_FIELDS[:5], True, True, True),
    "removed": Struct("BlockRemoved", [("block_hashes", REQUIRED)], True, True, True),
    "cleared": Struct("AllBlocksCleared", [], True, True, True),
}
sglang_new = {
    "batch": Struct("EventBatch", [("ts", REQUIRED), ("events", REQUIRED), ("attn_dp_rank", None)], True, True, False),
    "stored": Struct("BlockStored", STORED_FIELDS[:5] + [("medium", None)], True, True, True),
    "removed": Struct("BlockRemoved", [("block_hashes", REQUIRED), ("medium", None)], True, True, True),
    "cleared": Struct("AllBlocksCleared", [], True, True, True),
}

# SGLang with cache salts (see the docstring).
SG_STORED = STORED_FIELDS[:5] + [("medium", None)]
sglang_meta = {
    "batch": Struct("EventBatch", [("ts", REQUIRED), ("events", REQUIRED), ("attn_dp_rank", None)], True, False, False),
    "stored": Struct("BlockStored", SG_STORED, True, False, True),
    "stored_meta": Struct("BlockStored", SG_STORED + [("metadata", REQUIRED)], True, False, True),
    "metadata": Struct("BlockStoredMetadata", [("cache_salt", REQUIRED)], False, True, False),
    "removed": Struct("BlockRemoved", [("block_hashes", REQUIRED), ("medium", None)], True, False, True),
}
sglang_map = {
    "batch": sglang_meta["batch"],
    "stored": Struct("BlockStored", SG_STORED + [("cache_salt", None), ("session_id", None)], False, True, True),
    "removed": Struct("BlockRemoved", [("block_hashes", REQUIRED), ("medium", None)], False, True, True),
    "cleared": Struct("AllBlocksCleared", [], False, True, True),
}


def toks(start, n):
    return list(range(start, start + n))


def sha(i):
    return hashlib.sha256(b"block-%d" % i).digest()


def eh(h):
    """kvgate's uint64 engine hash of an engine block hash."""
    if isinstance(h, bytes):
        return xxhash.xxh3_64_intdigest(h, seed=1337)
    return h & M64


def mm_hash(identifier):
    if isinstance(identifier, str):
        identifier = identifier.encode()
    return xxhash.xxh3_64_intdigest(identifier, seed=0)


def chain_seed(lora, salt):
    seed = 1337
    if lora:
        seed = (seed + xxhash.xxh3_64_intdigest(lora.encode(), seed=0)) & M64
    if salt:
        seed = (seed + xxhash.xxh3_64_intdigest(salt.encode(), seed=1)) & M64
    return seed


def local_hash(tokens, mm, seed):
    data = struct.pack("<%dI" % len(tokens), *tokens) + b"".join(struct.pack("<Q", h) for h in sorted(mm))
    return xxhash.xxh3_64_intdigest(data, seed=seed)


def want_stored(hashes, parent, tokens, lora="", salt="", mm=None, medium="", by_ref=False):
    """What kvgate must decode, and the block keys it must compute."""
    mm = mm or [[] for _ in hashes]
    blocks, local = [], []
    seed = chain_seed(lora, salt)
    for i, h in enumerate(hashes):
        b = {"engine_hash": eh(h)}
        if not by_ref:
            b["token_ids"] = tokens[i * BS:(i + 1) * BS]
            local.append(str(local_hash(b["token_ids"], mm[i], seed)))
        if mm[i]:
            b["mm_hashes"] = sorted(mm[i])
        blocks.append(b)
    ev = {"blocks": blocks}
    if parent is not None:
        ev["parent_hash"] = eh(parent)
    for k, v in (("lora_name", lora), ("cache_salt", salt), ("medium", medium)):
        if v:
            ev[k] = v
    return {"stored": ev}, local


def want_removed(hashes, medium=""):
    ev = {"engine_hashes": [eh(h) for h in hashes]}
    if medium:
        ev["medium"] = medium
    return {"removed": ev}


CLEARED = {"cleared": True}
cases = []


def case(name, payload, ts, dp_rank, wants, skipped=None, skipped_blocks=0, engine_block_size=0):
    events, local = [], []
    for w in wants:
        if isinstance(w, tuple):
            events.append(w[0])
            local.append(w[1])
        else:
            events.append(w)
            local.append(None)
    cases.append((name, msgpack.packb(payload, use_bin_type=True), {
        "ts": ts, "dp_rank": dp_rank, "events": events, "local_hashes": local,
        "skipped": skipped or {}, "skipped_blocks": skipped_blocks, "engine_block_size": engine_block_size,
    }))


V, A, S, N = vllm, vllm_array, sglang, sglang_new
BIG = (1 << 64) - 5  # a hash above 2^63, as an unsigned msgpack int

# 1. Current vLLM: map batch, tagged-map events, defaults omitted; a hash
# above 2^63 and a negative one; an adapter by name; dp rank 1.
t = toks(100, 8)
case("vllm_map_batch", V["batch"](ts=1700000000.25, events=[
    V["stored"](block_hashes=[BIG, -7], parent_block_hash=None, token_ids=t, block_size=BS, lora_id=None,
                medium="GPU", lora_name=None, group_idx=0, kv_cache_spec_kind="full_attention"),
    V["stored"](block_hashes=[13], parent_block_hash=-7, token_ids=toks(200, 4), block_size=BS, lora_id=1,
                medium=None, lora_name="sql-adapter"),
    V["removed"](block_hashes=[BIG], medium="GPU"),
    V["cleared"](),
], data_parallel_rank=1), 1700000000.25, 1, [
    want_stored([BIG, -7], None, t), want_stored([13], -7, toks(200, 4), lora="sql-adapter"),
    want_removed([BIG]), CLEARED])

# 2. The array layout: tagged arrays, trailing defaults omitted (no rank).
case("vllm_array_batch", A["batch"](ts=1700000001.5, events=[
    A["stored"](block_hashes=[11, 12], parent_block_hash=None, token_ids=toks(300, 8), block_size=BS, lora_id=None, medium="GPU"),
    A["removed"](block_hashes=[11], medium="GPU"),
    A["cleared"](),
]), 1700000001.5, 0, [want_stored([11, 12], None, toks(300, 8)), want_removed([11]), CLEARED])

# 3. sha256 bytes hashes and parent (vLLM's sha256 hash modes).
case("vllm_bytes_hashes", V["batch"](ts=1700000002.0, events=[
    V["stored"](block_hashes=[sha(1), sha(2)], parent_block_hash=None, token_ids=toks(400, 8), block_size=BS,
                lora_id=None, medium="GPU", lora_name=None),
    V["stored"](block_hashes=[sha(3)], parent_block_hash=sha(2), token_ids=toks(500, 4), block_size=BS,
                lora_id=None, medium="GPU", lora_name=None),
    V["removed"](block_hashes=[sha(1), sha(3)], medium="GPU"),
]), 1700000002.0, 0, [
    want_stored([sha(1), sha(2)], None, toks(400, 8)), want_stored([sha(3)], sha(2), toks(500, 4)),
    want_removed([sha(1), sha(3)])])

# 4. A mixed-validity batch, as vLLM's offloading connector sends it: GPU
# stores, a CPU-tier store of the same blocks with token_ids=[], a
# removal; and among them events that are each skipped and counted (too
# few tokens, a string hash, no type field, an unknown type, an unknown
# medium). Everything else applies.
case("vllm_mixed_validity", V["batch"](ts=1700000003.0, events=[
    V["stored"](block_hashes=[21, 22], parent_block_hash=None, token_ids=toks(600, 8), block_size=BS,
                lora_id=None, medium="GPU", lora_name=None),
    V["stored"](block_hashes=[21, 22], parent_block_hash=None, token_ids=[], block_size=BS,
                lora_id=None, medium="CPU", lora_name=None),
    V["stored"](block_hashes=[23, 24], parent_block_hash=None, token_ids=toks(0, 5), block_size=BS,
                lora_id=None, medium="GPU", lora_name=None),
    V["stored"](block_hashes=["nope"], parent_block_hash=None, token_ids=toks(0, 4), block_size=BS,
                lora_id=None, medium="GPU", lora_name=None),
    {"block_hashes": [25]},
    ["KVCacheOffloaded", [1, 2, 3]],
    V["stored"](block_hashes=[26], parent_block_hash=None, token_ids=toks(700, 4), block_size=BS,
                lora_id=None, medium="TAPE", lora_name=None),
    V["removed"](block_hashes=[22], medium="GPU"),
    V["stored"](block_hashes=[27], parent_block_hash=21, token_ids=toks(800, 4), block_size=BS,
                lora_id=None, medium="CPU_PINNED", lora_name=None),
]), 1700000003.0, 0, [
    want_stored([21, 22], None, toks(600, 8)),
    want_stored([21, 22], None, [], medium="cpu", by_ref=True),
    want_removed([22]),
    want_stored([27], 21, toks(800, 4), medium="cpu")],
    skipped={"malformed": 3, "unknown_type": 1, "medium": 1}, skipped_blocks=1)

# 5. extra_keys: a salted chain (vLLM puts cache_salt in the first block's
# keys only; the child store inherits it), an adapter name repeated in
# every block's keys, and two different images behind the same placeholder
# tokens, as (identifier, offset) pairs.
img = [0] * BS
case("vllm_extra_keys", V["batch"](ts=1700000004.0, events=[
    V["stored"](block_hashes=[31, 32], parent_block_hash=None, token_ids=toks(900, 8), block_size=BS,
                lora_id=None, medium="GPU", lora_name=None, extra_keys=[("tenant-a",), None]),
    V["stored"](block_hashes=[33], parent_block_hash=32, token_ids=toks(950, 4), block_size=BS,
                lora_id=None, medium="GPU", lora_name=None, extra_keys=[None]),
    V["stored"](block_hashes=[34, 35], parent_block_hash=None, token_ids=img + img, block_size=BS,
                lora_id=2, medium="GPU", lora_name="chat-adapter",
                extra_keys=[("chat-adapter", ("img-aaaa", 0)), ("chat-adapter", ("img-bbbb", 0))]),
    V["stored"](block_hashes=[36], parent_block_hash=None, token_ids=toks(990, 4), block_size=BS,
                lora_id=None, medium="GPU", lora_name=None, extra_keys=[(b"\x01\x02embeds",)]),
]), 1700000004.0, 0, [
    want_stored([31, 32], None, toks(900, 8), salt="tenant-a"),
    want_stored([33], 32, toks(950, 4), salt="tenant-a"),
    want_stored([34, 35], None, img + img, lora="chat-adapter", mm=[[mm_hash("img-aaaa")], [mm_hash("img-bbbb")]]),
    want_stored([36], None, toks(990, 4), mm=[[mm_hash(b"\x01\x02embeds")]])])

# 6. Adapters known by id only: an int lora_id in the table, one not in it.
case("vllm_lora_id_only", V["batch"](ts=1700000005.0, events=[
    V["stored"](block_hashes=[41], parent_block_hash=None, token_ids=toks(1000, 4), block_size=BS,
                lora_id=3, medium="GPU", lora_name=None),
    V["stored"](block_hashes=[42], parent_block_hash=None, token_ids=toks(1100, 4), block_size=BS,
                lora_id=7, medium="GPU", lora_name=None),
    V["stored"](block_hashes=[43], parent_block_hash=None, token_ids=toks(1200, 4), block_size=BS,
                lora_id=0, medium="GPU", lora_name=None),
]), 1700000005.0, 0, [
    want_stored([41], None, toks(1000, 4), lora="sql-adapter"),
    want_stored([42], None, toks(1100, 4), lora="lora-id:7"),
    want_stored([43], None, toks(1200, 4))])

# 7. A hybrid model whose full-attention group is 1 and group 0 a sliding
# window: the kind decides, and removals (group_idx only) follow it.
case("vllm_hybrid_groups", V["batch"](ts=1700000006.0, events=[
    V["stored"](block_hashes=[51], parent_block_hash=None, token_ids=toks(1300, 4), block_size=BS, lora_id=None,
                medium="GPU", lora_name=None, group_idx=0, kv_cache_spec_kind="sliding_window",
                kv_cache_spec_sliding_window=128),
    V["stored"](block_hashes=[52], parent_block_hash=None, token_ids=toks(1300, 4), block_size=BS, lora_id=None,
                medium="GPU", lora_name=None, group_idx=1, kv_cache_spec_kind="full_attention"),
    V["removed"](block_hashes=[51], medium="GPU", group_idx=0),
    V["removed"](block_hashes=[52], medium="GPU", group_idx=1),
]), 1700000006.0, 0, [want_stored([52], None, toks(1300, 4)), want_removed([52])],
    skipped={"kv_group": 2}, skipped_blocks=1)

# 8. SGLang at the cited commit (negative Python-hash ints), then newer
# SGLang: attn_dp_rank 2, medium, a string adapter id (in the table).
case("sglang_array", S["batch"](ts=1700000007, events=[
    S["stored"](block_hashes=[-5, 7], parent_block_hash=None, token_ids=toks(1400, 8), block_size=BS, lora_id=None),
    S["removed"](block_hashes=[-5]),
]), 1700000007.0, 0, [want_stored([-5, 7], None, toks(1400, 8)), want_removed([-5])])
case("sglang_new_dp", N["batch"](ts=1700000008.0, events=[
    N["stored"](block_hashes=[61], parent_block_hash=None, token_ids=toks(1500, 4), block_size=BS, lora_id="a1b2", medium="GPU"),
    N["stored"](block_hashes=[62], parent_block_hash=None, token_ids=toks(1600, 4), block_size=BS, lora_id=None, medium="CPU_PINNED"),
    N["removed"](block_hashes=[62], medium="CPU_PINNED"),
], attn_dp_rank=2), 1700000008.0, 2, [
    want_stored([61], None, toks(1500, 4), lora="chat-adapter"),
    want_stored([62], None, toks(1600, 4), medium="cpu"), want_removed([62], medium="cpu")])

# 9. SGLang EAGLE: bigram pages, token_ids as [token, next_token] pairs.
pairs = [[x, x + 1] for x in toks(1700, 8)]
case("sglang_eagle_bigram", N["batch"](ts=1700000009.0, events=[
    N["stored"](block_hashes=[71, 72], parent_block_hash=None, token_ids=pairs, block_size=BS, lora_id=None),
]), 1700000009.0, 0, [want_stored([71, 72], None, toks(1700, 8))])

# 10. SGLang's default page_size 1: every block of size 1, all skipped.
case("sglang_page_size_1", N["batch"](ts=1700000010.0, events=[
    N["stored"](block_hashes=[81, 82, 83], parent_block_hash=None, token_ids=[5, 6, 7], block_size=1, lora_id=None),
    N["stored"](block_hashes=[84], parent_block_hash=83, token_ids=[8], block_size=1, lora_id=None),
]), 1700000010.0, 0, [], skipped={"block_size": 2}, skipped_blocks=4, engine_block_size=1)

# 11. block_offsets: block i's tokens start at block_offsets[i].
ev = V["stored"](block_hashes=[91, 92], parent_block_hash=None, token_ids=toks(1800, 12), block_size=BS,
                 lora_id=None, medium="GPU", lora_name=None)
ev["block_offsets"] = [0, 8]
case("vllm_block_offsets", V["batch"](ts=1700000011.0, events=[ev]), 1700000011.0, 0, [
    ({"stored": {"blocks": [{"engine_hash": 91, "token_ids": toks(1800, 4)}, {"engine_hash": 92, "token_ids": toks(1808, 4)}]}},
     [str(local_hash(toks(1800, 4), [], 1337)), str(local_hash(toks(1808, 4), [], 1337))])])

# 12. SGLang 0.5.18 salted stores (BlockStoredWithMetadata): the root
# page and its child both carry the salt, their hashes are SGLang's
# salt-seeded ones; the same tokens unsalted are another chain that keys
# unsalted; a salted page removed.
SM, SP = sglang_meta, sglang_map
salt_meta = SM["metadata"](cache_salt="tenant-a")
case("sglang_salted_array", SM["batch"](ts=1700000012.0, events=[
    SM["stored_meta"](block_hashes=[-101], parent_block_hash=None, token_ids=toks(1900, 4), block_size=BS,
                      lora_id=None, medium="GPU", metadata=salt_meta),
    SM["stored_meta"](block_hashes=[102], parent_block_hash=-101, token_ids=toks(1904, 4), block_size=BS,
                      lora_id=None, medium="GPU", metadata=salt_meta),
    SM["stored"](block_hashes=[103, 104], parent_block_hash=None, token_ids=toks(1900, 8), block_size=BS,
                 lora_id=None, medium="GPU"),
    SM["removed"](block_hashes=[102], medium="GPU"),
], attn_dp_rank=0), 1700000012.0, 0, [
    want_stored([-101], None, toks(1900, 4), salt="tenant-a"),
    want_stored([102], -101, toks(1904, 4), salt="tenant-a"),
    want_stored([103, 104], None, toks(1900, 8)),
    want_removed([102])])

# 13. SGLang after #37482: tagged-map events, cache_salt (and session_id,
# which kvgate ignores) as fields of BlockStored.
case("sglang_salted_map", SP["batch"](ts=1700000013.0, events=[
    SP["stored"](block_hashes=[111, 112], parent_block_hash=None, token_ids=toks(2000, 8), block_size=BS,
                 lora_id=None, medium="GPU", cache_salt="tenant-b", session_id="sess-1"),
    SP["stored"](block_hashes=[113], parent_block_hash=None, token_ids=toks(2000, 4), block_size=BS,
                 lora_id=None, medium="GPU", session_id="sess-2"),
    SP["removed"](block_hashes=[111], medium="GPU"),
    SP["cleared"](),
], attn_dp_rank=1), 1700000013.0, 1, [
    want_stored([111, 112], None, toks(2000, 8), salt="tenant-b"),
    want_stored([113], None, toks(2000, 4)),
    want_removed([111]), CLEARED])

# Malformed messages: each refused as a whole.
bad = {
    "bad_not_msgpack": b"\xc1\x00\x01",
    "bad_not_a_batch": msgpack.packb("ts"),
    "bad_short_batch": msgpack.packb([1.0]),
    "bad_map_without_events": msgpack.packb({"ts": 1.0}),
    "bad_events_not_array": msgpack.packb([1.0, {"BlockStored": 1}]),
    "bad_trailing": msgpack.packb([1.0, []]) + b"\x01",
}

manifest = {"block_size": BS, "lora_names": LORA_NAMES, "cases": [], "malformed": sorted(bad)}
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
with open("engine_manifest.json", "w") as f:
    json.dump(manifest, f, indent=1, sort_keys=True)
    f.write("\n")
