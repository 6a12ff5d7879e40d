package localrouter

// refChunk is how many one-ref slices ActiveSequences carves at once.
// Chunks are never given back: like the blocks map, which never shrinks
// either, they stay sized for the peak of active blocks.
const refChunk = 256

// addRef returns refs with r appended. A block new to every worker gets a
// one-ref slice from a's spare ones or its chunk; a block gaining a
// second worker grows by append, leaving its one-ref slice spare. Caller
// holds a.mu.
func (a *ActiveSequences) addRef(refs []blockRef, r blockRef) []blockRef {
	if len(refs) > 0 {
		grown := append(refs, r)
		if cap(refs) == 1 {
			a.dropRefs(refs)
		}
		return grown
	}
	var one []blockRef
	if n := len(a.spare); n > 0 {
		one, a.spare = a.spare[n-1], a.spare[:n-1]
	} else {
		if len(a.chunk) == 0 {
			a.chunk = make([]blockRef, refChunk)
		}
		one, a.chunk = a.chunk[:1:1], a.chunk[1:]
	}
	one[0] = r
	return one
}

// dropRefs takes back a block's refs slice that is no longer used, to
// reuse it if it holds one ref. Caller holds a.mu.
func (a *ActiveSequences) dropRefs(refs []blockRef) {
	if cap(refs) == 1 {
		a.spare = append(a.spare, refs[:1])
	}
}
