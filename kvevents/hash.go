package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"unsafe"

	"github.com/zeebo/xxh3"
)

// Seed is the XXH3 seed of every kvgate block hash of the base model
// without a cache salt (Dynamo's XXH3_SEED).
const Seed uint64 = 1337

// ErrBlockSize reports a block size that is zero or negative.
var ErrBlockSize = errors.New("block size must be positive")

// littleEndian is true on little-endian hosts, where token slices can be
// hashed in place instead of copied.
var littleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// LoRASeed returns the seed of local block hashes for an adapter, as
// Dynamo computes it (lib/kv-router/src/protocols.rs,
// compute_block_hash_for_seq): Seed for the base model (empty name),
// otherwise Seed + XXH3-64(name, seed 0), a wrapping add.
func LoRASeed(loraName string) uint64 { return ChainSeed(loraName, "") }

// ChainSeed returns the seed of the local block hashes of a request or a
// stored chain with adapter loraName and cache salt (vLLM's and SGLang's
// cache_salt request field), as Dynamo's compute_salt_hash does
// (lib/kv-hashing/src/salt.rs): Seed, plus XXH3-64(loraName, seed 0) for an
// adapter, plus XXH3-64(salt, seed 1) for a salt, with wrapping adds. Empty
// strings mean none. Different adapters, salts and their pairs never share
// blocks.
func ChainSeed(loraName, salt string) uint64 {
	seed := Seed
	if loraName != "" {
		seed += xxh3.HashString(loraName)
	}
	if salt != "" {
		seed += xxh3.HashStringSeed(salt, 1)
	}
	return seed
}

// MMHash maps a multimodal item's identifier (vLLM's mm_hash / feature
// identifier string, e.g. a hex digest of the image) to the uint64 that
// block keys carry: XXH3-64 of the identifier with seed 0. The request
// renderer and the event decoder both use it, so one image has one hash.
func MMHash(identifier string) uint64 { return xxh3.HashString(identifier) }

// BlockHash returns the local hash of one block of token ids with seed.
func BlockHash(tokens []uint32, seed uint64) uint64 {
	if len(tokens) == 0 {
		return xxh3.HashSeed(nil, seed)
	}
	return hashBytes(tokenBytes(tokens), seed)
}

// BlockHashMM returns the local hash of a block whose placeholder tokens
// stand for multimodal items with content hashes mm (Dynamo's
// compute_block_hash_for_seq with block_mm_infos): XXH3-64 over the
// block's tokens as LE u32 followed by the sorted mm hashes as LE u64.
// Without mm it is BlockHash, so different images behind the same
// placeholder tokens give different blocks and text blocks are unchanged.
func BlockHashMM(tokens []uint32, mm []uint64, seed uint64) uint64 {
	if len(mm) == 0 {
		return BlockHash(tokens, seed)
	}
	buf := make([]byte, 0, 4*len(tokens)+8*len(mm))
	for _, t := range tokens {
		buf = binary.LittleEndian.AppendUint32(buf, t)
	}
	sorted := mm
	if !slices.IsSorted(mm) {
		sorted = slices.Sorted(slices.Values(mm))
	}
	for _, h := range sorted {
		buf = binary.LittleEndian.AppendUint64(buf, h)
	}
	return xxh3.HashSeed(buf, seed)
}

// MMSpan places one multimodal item in a request's token sequence: its
// placeholder tokens are tokens[Offset : Offset+Length], and Hash is its
// content hash (MMHash of the engine's identifier).
type MMSpan struct {
	Hash           uint64
	Offset, Length int
}

// AppendLocalHashes appends the local hashes of the complete blocks of
// tokens to dst and returns it. A trailing partial block is ignored.
func AppendLocalHashes(dst []uint64, tokens []uint32, blockSize int, loraName string) ([]uint64, error) {
	return AppendRequestHashes(dst, tokens, blockSize, loraName, "", nil)
}

// AppendRequestHashes is the hashing entry point for a request: it appends
// the local hashes of the complete blocks of tokens for adapter loraName
// ("" for the base model), cache salt ("" for none) and the multimodal
// items mm (nil for text), the same keys an index computes from the
// engine's KV events for those blocks. A block's key includes the hash of
// every item whose placeholder run overlaps it.
func AppendRequestHashes(dst []uint64, tokens []uint32, blockSize int, loraName, salt string, mm []MMSpan) ([]uint64, error) {
	if blockSize <= 0 {
		return dst, fmt.Errorf("%w: got %d", ErrBlockSize, blockSize)
	}
	seed := ChainSeed(loraName, salt)
	if len(mm) == 0 {
		for i := 0; i+blockSize <= len(tokens); i += blockSize {
			dst = append(dst, BlockHash(tokens[i:i+blockSize], seed))
		}
		return dst, nil
	}
	var blockMM []uint64
	for i := 0; i+blockSize <= len(tokens); i += blockSize {
		blockMM = blockMM[:0]
		for _, s := range mm {
			if s.Length > 0 && s.Offset < i+blockSize && s.Offset+s.Length > i {
				blockMM = append(blockMM, s.Hash)
			}
		}
		dst = append(dst, BlockHashMM(tokens[i:i+blockSize], blockMM, seed))
	}
	return dst, nil
}

// RequestHashes returns AppendRequestHashes(nil, …).
func RequestHashes(tokens []uint32, blockSize int, loraName, salt string, mm []MMSpan) ([]uint64, error) {
	if blockSize <= 0 {
		return nil, fmt.Errorf("%w: got %d", ErrBlockSize, blockSize)
	}
	return AppendRequestHashes(make([]uint64, 0, len(tokens)/blockSize), tokens, blockSize, loraName, salt, mm)
}

// LocalHashes returns the local hashes of the complete blocks of tokens.
func LocalHashes(tokens []uint32, blockSize int, loraName string) ([]uint64, error) {
	if blockSize <= 0 {
		return nil, fmt.Errorf("%w: got %d", ErrBlockSize, blockSize)
	}
	return AppendLocalHashes(make([]uint64, 0, len(tokens)/blockSize), tokens, blockSize, loraName)
}

// Hash returns the kvgate local hash of block b of a chain hashed
// with seed (ChainSeed of the Stored event's adapter and salt): its
// LocalHash when it has no token ids (dumps), else BlockHashMM.
func (b Block) Hash(seed uint64) uint64 {
	if len(b.TokenIDs) == 0 && b.LocalHash != nil {
		return *b.LocalHash
	}
	return BlockHashMM(b.TokenIDs, b.MMHashes, seed)
}

// ChainHash returns the sequence hash of a block whose parent has sequence
// hash parent and whose local hash is local.
func ChainHash(parent, local uint64) uint64 { return hash16(parent, local, Seed) }

// AppendSequenceHashes appends the chained sequence hashes of local to dst.
func AppendSequenceHashes(dst []uint64, local []uint64) []uint64 {
	for i, h := range local {
		if i > 0 {
			h = ChainHash(dst[len(dst)-1], h)
		}
		dst = append(dst, h)
	}
	return dst
}

// SequenceHashes returns the chained sequence hashes of local.
func SequenceHashes(local []uint64) []uint64 {
	return AppendSequenceHashes(make([]uint64, 0, len(local)), local)
}

// EngineHashFromBytes maps an engine's byte-string block hash (vLLM's sha256
// mode) to the uint64 engine hashes events carry.
func EngineHashFromBytes(b []byte) uint64 {
	return xxh3.HashSeed(b, Seed)
}
