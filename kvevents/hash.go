package kvevents

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/zeebo/xxh3"
)

// Seed is the XXH3 seed of every kvgate block hash.
const Seed uint64 = 1337

// ErrBlockSize reports a block size that is zero or negative.
var ErrBlockSize = errors.New("block size must be positive")

// littleEndian is true on little-endian hosts, where token slices can be
// hashed in place instead of copied.
var littleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// LoRASeed returns the seed of local block hashes for an adapter: Seed for
// the base model (empty name), otherwise XXH3-64 of the name with Seed.
func LoRASeed(loraName string) uint64 {
	if loraName == "" {
		return Seed
	}
	return xxh3.HashStringSeed(loraName, Seed)
}

// BlockHash returns the local hash of one block of token ids with seed.
func BlockHash(tokens []uint32, seed uint64) uint64 {
	if len(tokens) == 0 {
		return xxh3.HashSeed(nil, seed)
	}
	return hashBytes(tokenBytes(tokens), seed)
}

// AppendLocalHashes appends the local hashes of the complete blocks of
// tokens to dst and returns it. A trailing partial block is ignored.
func AppendLocalHashes(dst []uint64, tokens []uint32, blockSize int, loraName string) ([]uint64, error) {
	if blockSize <= 0 {
		return dst, fmt.Errorf("%w: got %d", ErrBlockSize, blockSize)
	}
	seed := LoRASeed(loraName)
	for i := 0; i+blockSize <= len(tokens); i += blockSize {
		dst = append(dst, BlockHash(tokens[i:i+blockSize], seed))
	}
	return dst, nil
}

// LocalHashes returns the local hashes of the complete blocks of tokens.
func LocalHashes(tokens []uint32, blockSize int, loraName string) ([]uint64, error) {
	if blockSize <= 0 {
		return nil, fmt.Errorf("%w: got %d", ErrBlockSize, blockSize)
	}
	return AppendLocalHashes(make([]uint64, 0, len(tokens)/blockSize), tokens, blockSize, loraName)
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
