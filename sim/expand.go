package sim

// vocab is the range of expanded token ids (a Llama-like vocabulary).
const vocab = 32000

// AppendTokens appends the request's prompt token ids to dst. A raw prompt
// is its own tokens; a Mooncake request expands each hash id into
// blockSize tokens drawn from a generator seeded by (seed, id) alone, so an
// id yields the same tokens wherever it appears and a shared id prefix is a
// shared token prefix at any router block size. The last block is cut to
// input_length.
func (r *Request) AppendTokens(dst []uint32, blockSize int, seed uint64) []uint32 {
	if r.HashIDs == nil {
		return append(dst, r.Tokens...)
	}
	left := r.InputLength
	for _, id := range r.HashIDs {
		n := min(left, blockSize)
		dst = appendBlockTokens(dst, id, n, seed)
		left -= n
	}
	return dst
}

// appendBlockTokens appends the first n tokens of block id.
func appendBlockTokens(dst []uint32, id uint64, n int, seed uint64) []uint32 {
	x := splitmix(seed ^ splitmix(id+0x5851f42d4c957f2d))
	for range n {
		x += 0x9e3779b97f4a7c15
		dst = append(dst, uint32(mix(x)%vocab))
	}
	return dst
}

func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	return mix(x)
}

func mix(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}
