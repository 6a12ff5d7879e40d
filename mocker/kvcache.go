package mocker

import (
	"container/list"

	"github.com/kvgate/kvgate/kvevents"
)

// kvCache is a paged KV cache in the manner of vLLM v1's block pool: a fixed
// number of blocks, refcounted; a full block is registered under its chained
// sequence hash so later requests with the same prefix reuse it; a block
// whose refcount drops to zero keeps its hash and joins the tail of the free
// queue; allocation takes the head of the free queue (least recently freed)
// and evicts its hash, which is when a Removed event is emitted.
//
// Not safe for concurrent use: the Engine owns it.
type kvCache struct {
	blockSize int
	blocks    []block
	// cached maps a sequence hash to the block holding it.
	cached map[uint64]int32
	// free is an intrusive doubly linked list over blocks with refs == 0,
	// head = next to evict. -1 terminates.
	freeHead, freeTail int32
	numFree            int
	evictions          int64
	// events collects the KV events of the current engine call, in order.
	events *[]kvevents.Event

	// The CPU tier (cpuCap > 0): sequence hashes offloaded from the GPU,
	// in an LRU list (front = most recent).
	cpuCap   int
	cpu      map[uint64]*list.Element
	cpuLRU   list.List
	offloads int64
}

type block struct {
	refs int32
	// hash is the block's sequence hash when registered (hashed is true).
	hash       uint64
	hashed     bool
	prev, next int32
	inFree     bool
}

func newKVCache(numBlocks, blockSize int, events *[]kvevents.Event) *kvCache {
	c := &kvCache{
		blockSize: blockSize,
		blocks:    make([]block, numBlocks),
		cached:    make(map[uint64]int32),
		freeHead:  -1,
		freeTail:  -1,
		events:    events,
	}
	for i := range c.blocks {
		c.pushFree(int32(i))
	}
	return c
}

func (c *kvCache) pushFree(i int32) {
	b := &c.blocks[i]
	b.prev, b.next, b.inFree = c.freeTail, -1, true
	if c.freeTail >= 0 {
		c.blocks[c.freeTail].next = i
	} else {
		c.freeHead = i
	}
	c.freeTail = i
	c.numFree++
}

func (c *kvCache) unlinkFree(i int32) {
	b := &c.blocks[i]
	if b.prev >= 0 {
		c.blocks[b.prev].next = b.next
	} else {
		c.freeHead = b.next
	}
	if b.next >= 0 {
		c.blocks[b.next].prev = b.prev
	} else {
		c.freeTail = b.prev
	}
	b.prev, b.next, b.inFree = -1, -1, false
	c.numFree--
}

// used is the number of blocks referenced by at least one request.
func (c *kvCache) used() int { return len(c.blocks) - c.numFree }

// usage is the fraction of blocks in use (vllm:kv_cache_usage_perc).
func (c *kvCache) usage() float64 {
	if len(c.blocks) == 0 {
		return 0
	}
	return float64(c.used()) / float64(len(c.blocks))
}

// matchPrefix returns how many leading hashes are cached, without touching
// them.
func (c *kvCache) matchPrefix(seqHashes []uint64) int { return leadingIn(c.cached, seqHashes) }

// leadingIn is how many leading hashes are keys of m.
func leadingIn[V any](m map[uint64]V, seqHashes []uint64) int {
	for n, h := range seqHashes {
		if _, ok := m[h]; !ok {
			return n
		}
	}
	return len(seqHashes)
}

// acquireCached takes a reference on the cached block of each hash (they must
// all be cached: call matchPrefix first) and appends them to table.
func (c *kvCache) acquireCached(table []int32, seqHashes []uint64) []int32 {
	for _, h := range seqHashes {
		i := c.cached[h]
		if c.blocks[i].inFree {
			c.unlinkFree(i)
		}
		c.blocks[i].refs++
		table = append(table, i)
	}
	return table
}

// allocate appends n fresh blocks to table, evicting the cached content of
// the least recently freed blocks. It reports false, changing nothing, when
// fewer than n blocks are free.
func (c *kvCache) allocate(table []int32, n int) ([]int32, bool) {
	if n > c.numFree {
		return table, false
	}
	for range n {
		i := c.freeHead
		c.unlinkFree(i)
		b := &c.blocks[i]
		if b.hashed {
			delete(c.cached, b.hash)
			c.evictions++
			c.offload(b.hash)
			c.emitRemoved(b.hash)
			b.hashed, b.hash = false, 0
		}
		b.refs = 1
		table = append(table, i)
	}
	return table, true
}

// release drops one reference on each block of table, last block first, so
// a request's tail blocks are evicted before its (more shared) head.
func (c *kvCache) release(table []int32) {
	for j := len(table) - 1; j >= 0; j-- {
		i := table[j]
		b := &c.blocks[i]
		b.refs--
		if b.refs == 0 {
			c.pushFree(i)
		}
	}
}

// register records block i as holding seqHash. It reports false when another
// block already holds that hash: the block then stays unregistered (vLLM
// keeps such duplicates uncached too).
func (c *kvCache) register(i int32, seqHash uint64) bool {
	if _, dup := c.cached[seqHash]; dup {
		return false
	}
	b := &c.blocks[i]
	b.hash, b.hashed = seqHash, true
	c.cached[seqHash] = i
	return true
}

// reset drops every free block's registration (vLLM's reset_prefix_cache);
// blocks in use keep theirs. It emits Cleared when nothing is in use.
func (c *kvCache) reset() bool {
	if c.used() > 0 {
		return false
	}
	for h, i := range c.cached {
		c.blocks[i].hashed, c.blocks[i].hash = false, 0
		delete(c.cached, h)
	}
	clear(c.cpu)
	c.cpuLRU.Init()
	*c.events = append(*c.events, kvevents.Event{Cleared: true})
	return true
}

// offload copies an evicted GPU block to the CPU tier, as vLLM's offloading
// connector does: Stored with medium CPU and no token ids (the same engine
// hash), before the GPU's Removed. The tier evicts least recently used.
func (c *kvCache) offload(h uint64) {
	if c.cpuCap <= 0 {
		return
	}
	if c.cpu == nil {
		c.cpu = make(map[uint64]*list.Element)
	}
	if el, ok := c.cpu[h]; ok {
		c.cpuLRU.MoveToFront(el)
		return
	}
	for c.cpuLRU.Len() >= c.cpuCap {
		old := c.cpuLRU.Back()
		oh := old.Value.(uint64)
		c.cpuLRU.Remove(old)
		delete(c.cpu, oh)
		c.emit(kvevents.Event{Removed: &kvevents.Removed{EngineHashes: []uint64{oh}, Medium: "CPU"}})
	}
	c.cpu[h] = c.cpuLRU.PushFront(h)
	c.offloads++
	ev := *c.events
	if n := len(ev); n > 0 && ev[n-1].Stored != nil && ev[n-1].Stored.Medium == "CPU" {
		st := ev[n-1].Stored
		st.Blocks = append(st.Blocks, kvevents.Block{EngineHash: h})
		return
	}
	c.emit(kvevents.Event{Stored: &kvevents.Stored{Medium: "CPU", Blocks: []kvevents.Block{{EngineHash: h}}}})
}

func (c *kvCache) emit(ev kvevents.Event) { *c.events = append(*c.events, ev) }

// matchCPU returns how many leading hashes the CPU tier holds.
func (c *kvCache) matchCPU(seqHashes []uint64) int { return leadingIn(c.cpu, seqHashes) }

// touchCPU marks hashes recently used on the CPU tier (a reload keeps the
// CPU copy).
func (c *kvCache) touchCPU(seqHashes []uint64) {
	for _, h := range seqHashes {
		if el, ok := c.cpu[h]; ok {
			c.cpuLRU.MoveToFront(el)
		}
	}
}

func (c *kvCache) cpuLen() int { return len(c.cpu) }

func (c *kvCache) emitRemoved(h uint64) {
	ev := *c.events
	if n := len(ev); n > 0 && ev[n-1].Removed != nil && ev[n-1].Removed.Medium == "" {
		ev[n-1].Removed.EngineHashes = append(ev[n-1].Removed.EngineHashes, h)
		return
	}
	*c.events = append(ev, kvevents.Event{Removed: &kvevents.Removed{EngineHashes: []uint64{h}}})
}

// Contents returns the sequence hashes of every registered block.
func (c *kvCache) contents() map[uint64]struct{} {
	out := make(map[uint64]struct{}, len(c.cached))
	for h := range c.cached {
		out[h] = struct{}{}
	}
	return out
}
