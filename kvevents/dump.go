package kvevents

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/vmihailenco/msgpack/v5"
)

// Dump wire format (DumpSubject(pool, worker), NATS request-reply).
//
// Request: a message with a reply inbox; an empty body asks for every rank.
// A requester that can take a paged answer sets the DumpPageBytesHeader
// header to the largest page it accepts, in bytes (RequestDump sends its
// connection's MaxPayload).
//
// Answer without that header (a requester from before paging): exactly one
// message, the msgpack DumpReply, or an empty message with DumpErrorHeader
// when it would exceed the server's max payload. Such a requester takes the
// first message as the whole dump, so it is never sent a page.
//
// Answer with that header: N ≥ 1 messages to the reply inbox, each a
// msgpack DumpReply. A dump that fits in one page is one message without
// page fields, byte for byte the unpaged answer. Otherwise every message
// is a page: Page (0-based), Pages (N, at most MaxDumpPages) and Snapshot (a
// random id shared by the pages of one answer) are set, WorkerID is
// repeated, Ranks travel on page 0 only, and the Events of the pages,
// concatenated in page order, are the dump. A Stored chain longer than a page
// is cut into pieces, each piece's ParentHash the last block of the piece
// before it, so pages apply in order like one list. Every page is at most
// the requested size and the publisher's own MaxPayload (and at least
// MinDumpPageBytes, so one page holds one block). An error before the first
// page is one empty message with DumpErrorHeader.
//
// The rank's LastEventID and the block set are read once, atomically, under
// the publisher's lock, before any page is built: every page belongs to the
// same snapshot, and live events with larger ids apply after it.
//
// Why several replies to one request instead of a cursor (one request per
// page): a cursor needs the publisher either to keep each requester's
// snapshot until it has fetched every page (state, expiry, memory per
// router) or to page over a block set that changes between requests (a torn
// dump whose LastEventID matches none of its pages). Pages streamed to the
// requester's inbox are cut from one snapshot taken once and forgotten once
// sent. NATS keeps the order of one connection's messages to a subscriber,
// so a page that is missing when the last page arrives is lost;
// RequestDump then fails at once instead of waiting for its deadline.

// DumpReply is a publisher's answer on DumpSubject(pool, worker): the
// worker's current blocks, as Stored events that rebuild them, and per data-
// parallel rank the id of the last event published before the snapshot was
// taken. The wire format is the msgpack encoding of DumpReply (field names
// as tagged), one message or several pages (see the format above);
// RequestDump returns the pages put together, Page, Pages and Snapshot zero.
//
// A router resynchronising a (worker, rank) — after an event-id gap or a
// publisher restart (ids starting again at 1) — drops what it holds for that
// rank, applies the rank's Events in order, then applies live events whose
// id is greater than the rank's LastEventID and ignores the others (they are
// already in the dump). Every event of a rank carries EventID = LastEventID.
//
// Events list parents before children; a linear run of blocks is one Stored
// chain (or several consecutive ones, when a page boundary cuts it). Blocks
// carry their kvgate LocalHash (XXH3 of the block's tokens with the LoRA
// seed, as an index computes it) instead of token ids, which keeps dumps
// small; LoRAName is kept for information. A block whose parent was evicted
// while the block itself stayed cached (possible in vLLM too) is listed with
// that parent hash: a router that rejects Stored events under unknown
// parents will skip it, as it would have if it had been listening from the
// start and evicted the parent.
type DumpReply struct {
	WorkerID string     `json:"worker_id" msgpack:"worker_id"`
	Ranks    []DumpRank `json:"ranks" msgpack:"ranks"`
	// Events are Stored events of every rank, grouped by rank in Ranks
	// order.
	Events []RouterEvent `json:"events" msgpack:"events"`

	// Page is this message's index in a paged answer, from 0.
	Page int `json:"page,omitempty" msgpack:"page,omitempty"`
	// Pages is the number of pages of a paged answer; 0 for an answer in
	// one message.
	Pages int `json:"pages,omitempty" msgpack:"pages,omitempty"`
	// Snapshot is shared by the pages of one answer (a random id), so pages
	// of two answers to one request are never mixed.
	Snapshot uint64 `json:"snapshot,omitempty" msgpack:"snapshot,omitempty"`
}

// DumpRank is the resume point of one data-parallel rank in a DumpReply.
type DumpRank struct {
	DPRank uint32 `json:"dp_rank" msgpack:"dp_rank"`
	// LastEventID is the id of the rank's last published event, 0 if none.
	LastEventID uint64 `json:"last_event_id" msgpack:"last_event_id"`
	// Blocks is the number of blocks the rank holds.
	Blocks int `json:"blocks" msgpack:"blocks"`
}

const (
	// DumpErrorHeader is the NATS header of a dump reply that carries an
	// error instead of a DumpReply.
	DumpErrorHeader = "Kvgate-Dump-Error"
	// DumpPageBytesHeader is the header of a dump request that accepts a
	// paged answer: the largest page, in bytes, as a decimal integer.
	DumpPageBytesHeader = "Kvgate-Dump-Page-Bytes"
	// MinDumpPageBytes is the smallest page a publisher cuts, whatever the
	// request asks (unless its connection's MaxPayload is smaller).
	MinDumpPageBytes = 4 << 10
	// MaxDumpPages bounds the pages of one answer (at 1 MiB pages, 40
	// billion blocks); a decoder refuses more.
	MaxDumpPages = 1 << 20
)

// ErrDump reports a publisher that could not produce a dump, or a paged
// dump that did not arrive whole.
var ErrDump = errors.New("publisher could not dump")

// EncodeDumpReply returns the msgpack wire form of r.
func EncodeDumpReply(r DumpReply) ([]byte, error) { return msgpack.Marshal(&r) }

// DecodeDumpReply parses one dump message (a whole reply or one page) and
// validates its events and page fields.
func DecodeDumpReply(b []byte) (DumpReply, error) {
	var r DumpReply
	if err := checkMsgpackLengths(b); err != nil {
		return DumpReply{}, fmt.Errorf("%w: dump reply: %v", ErrInvalidEvent, err)
	}
	if err := msgpack.Unmarshal(b, &r); err != nil {
		return DumpReply{}, fmt.Errorf("%w: dump reply: %v", ErrInvalidEvent, err)
	}
	switch {
	case r.Pages < 0 || r.Pages > MaxDumpPages:
		return DumpReply{}, fmt.Errorf("%w: dump reply: %d pages, want 0 to %d", ErrInvalidEvent, r.Pages, MaxDumpPages)
	case r.Pages == 0 && (r.Page != 0 || r.Snapshot != 0):
		return DumpReply{}, fmt.Errorf("%w: dump reply: page %d of an unpaged reply", ErrInvalidEvent, r.Page)
	case r.Page < 0 || (r.Pages > 0 && r.Page >= r.Pages):
		return DumpReply{}, fmt.Errorf("%w: dump reply: page %d of %d", ErrInvalidEvent, r.Page, r.Pages)
	case r.Page > 0 && len(r.Ranks) > 0:
		return DumpReply{}, fmt.Errorf("%w: dump reply: page %d carries ranks (only page 0 does)", ErrInvalidEvent, r.Page)
	}
	for _, e := range r.Events {
		if err := e.Validate(); err != nil {
			return DumpReply{}, fmt.Errorf("dump reply: %w", err)
		}
		if e.Event.Stored == nil {
			return DumpReply{}, fmt.Errorf("%w: dump reply: event %d is %s, want stored", ErrInvalidEvent, e.EventID, e.Event.Kind())
		}
	}
	return r, nil
}

// RequestDump asks the publisher of worker in pool for its current blocks
// over NATS request-reply, accepting a paged answer of pages up to nc's
// MaxPayload, and returns the whole dump. ctx bounds the wait for every
// page (nats.ErrNoResponders when no publisher listens). A dump that does
// not arrive whole — a page lost, or ctx done after the first page — is an
// ErrDump naming the missing pages, never a partial DumpReply.
func RequestDump(ctx context.Context, nc *nats.Conn, pool, worker string) (DumpReply, error) {
	fail := func(err error) (DumpReply, error) {
		return DumpReply{}, fmt.Errorf("dump of worker %q in pool %q: %w", worker, pool, err)
	}
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return fail(err)
	}
	defer sub.Unsubscribe() //nolint:errcheck // a closed connection has dropped it already
	// The pages of a big dump arrive in a burst; they are wanted whole, so
	// the client must not drop any as a slow consumer.
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		return fail(err)
	}
	req := nats.NewMsg(DumpSubject(pool, worker))
	req.Reply = inbox
	pageBytes := nc.MaxPayload()
	if pageBytes <= 0 {
		pageBytes = 1 << 20 // no server INFO yet: nats-server's default max_payload
	}
	req.Header.Set(DumpPageBytesHeader, strconv.FormatInt(pageBytes, 10))
	if err := nc.PublishMsg(req); err != nil {
		return fail(err)
	}
	var a dumpAssembler
	for {
		msg, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			if a.started() {
				return fail(fmt.Errorf("%w: %s: %w", ErrDump, a.missing(), err))
			}
			return fail(err)
		}
		if e := msg.Header.Get(DumpErrorHeader); e != "" {
			return fail(fmt.Errorf("%w: %s", ErrDump, e))
		}
		page, err := DecodeDumpReply(msg.Data)
		if err != nil {
			return fail(err)
		}
		done, err := a.add(page)
		if err != nil {
			return fail(err)
		}
		if done {
			return a.reply(), nil
		}
	}
}

// dumpAssembler puts the pages of one answer together.
type dumpAssembler struct {
	first *DumpReply            // the first message taken: it fixes Pages and Snapshot
	pages map[int][]RouterEvent // events by page
	ranks []DumpRank
	last  bool // the final page arrived
}

func (a *dumpAssembler) started() bool { return a.first != nil }

// add takes one decoded message and reports whether the dump is whole. A
// page of another answer (another Snapshot) is ignored; a page missing when
// the final one arrives is lost (NATS keeps one connection's order), which
// is an ErrDump.
func (a *dumpAssembler) add(p DumpReply) (bool, error) {
	if a.first == nil {
		if p.Pages == 0 {
			a.first = &p
			return true, nil
		}
		a.first = &p
		a.pages = make(map[int][]RouterEvent, min(p.Pages, 1024))
	}
	if p.Pages == 0 || p.Snapshot != a.first.Snapshot {
		return false, nil // another responder's answer
	}
	switch {
	case p.Pages != a.first.Pages:
		return false, fmt.Errorf("%w: page %d says %d pages, page %d said %d", ErrDump, p.Page, p.Pages, a.first.Page, a.first.Pages)
	case p.WorkerID != a.first.WorkerID:
		return false, fmt.Errorf("%w: page %d names worker %q, page %d named %q", ErrDump, p.Page, p.WorkerID, a.first.Page, a.first.WorkerID)
	}
	if _, dup := a.pages[p.Page]; dup {
		return false, fmt.Errorf("%w: page %d of %d received twice", ErrDump, p.Page, p.Pages)
	}
	a.pages[p.Page] = p.Events
	if p.Page == 0 {
		a.ranks = p.Ranks
	}
	if p.Page == p.Pages-1 {
		a.last = true
	}
	if len(a.pages) == p.Pages {
		return true, nil
	}
	if a.last {
		return false, fmt.Errorf("%w: %s after the final page", ErrDump, a.missing())
	}
	return false, nil
}

// missing describes the pages not received, as ranges.
func (a *dumpAssembler) missing() string {
	n := a.first.Pages
	var parts []string
	for i := 0; i < n; i++ {
		if _, ok := a.pages[i]; ok {
			continue
		}
		j := i
		for j+1 < n {
			if _, ok := a.pages[j+1]; ok {
				break
			}
			j++
		}
		if j == i {
			parts = append(parts, strconv.Itoa(i))
		} else {
			parts = append(parts, strconv.Itoa(i)+"-"+strconv.Itoa(j))
		}
		if len(parts) == 8 {
			parts = append(parts, "…")
			break
		}
		i = j
	}
	return fmt.Sprintf("got %d of %d pages, missing page(s) %s", len(a.pages), n, strings.Join(parts, ", "))
}

// reply returns the dump put together; a whole answer must have arrived.
func (a *dumpAssembler) reply() DumpReply {
	if a.first.Pages == 0 {
		return *a.first
	}
	r := DumpReply{WorkerID: a.first.WorkerID, Ranks: a.ranks}
	n := 0
	for _, evs := range a.pages {
		n += len(evs)
	}
	r.Events = make([]RouterEvent, 0, n)
	for i := range a.first.Pages {
		r.Events = append(r.Events, a.pages[i]...)
	}
	return r
}

// encodeDumpPages encodes r as the messages of a paged answer, each at
// most limit bytes. A dump that fits in one message is that one message,
// without page fields; page cutting works from size bounds, so the whole
// encoding is tried first whenever it might fit.
func encodeDumpPages(r DumpReply, limit int, snapshot uint64) ([][]byte, error) {
	blocks := 0
	for _, e := range r.Events {
		if e.Event.Stored != nil {
			blocks += len(e.Event.Stored.Blocks)
		}
	}
	if blocks*minDumpBlockBytes <= limit {
		whole, err := EncodeDumpReply(r)
		if err != nil {
			return nil, err
		}
		if len(whole) <= limit {
			return [][]byte{whole}, nil
		}
	}
	pages, err := pageDump(r, limit, snapshot)
	if err != nil {
		return nil, err
	}
	out := make([][]byte, len(pages))
	for i, pg := range pages {
		data, err := EncodeDumpReply(pg)
		if err != nil {
			return nil, err
		}
		if len(data) > limit {
			return nil, fmt.Errorf("dump page %d of %d is %d bytes, over its %d-byte bound", i, len(pages), len(data), limit)
		}
		out[i] = data
	}
	return out, nil
}

// pageDump cuts r into pages of at most limit encoded bytes (see the wire
// format above). One page comes back as r itself, without page fields.
// Sizes are bounded, not measured: a block's msgpack form is at most
// maxDumpBlockBytes whatever its hashes, and an event's or a page's
// envelope is measured with the largest values its fields can take.
func pageDump(r DumpReply, limit int, snapshot uint64) ([]DumpReply, error) {
	head0, err := pageEnvelopeBytes(r.WorkerID, r.Ranks)
	if err != nil {
		return nil, err
	}
	head, err := pageEnvelopeBytes(r.WorkerID, nil)
	if err != nil {
		return nil, err
	}
	pages := []DumpReply{{WorkerID: r.WorkerID, Ranks: r.Ranks}}
	used := head0
	for _, ev := range r.Events {
		st := ev.Event.Stored
		if st == nil || len(st.Blocks) == 0 {
			return nil, fmt.Errorf("%w: dump event %d of rank %d is not a stored chain", ErrInvalidEvent, ev.EventID, ev.DPRank)
		}
		ovh, err := eventEnvelopeBytes(ev)
		if err != nil {
			return nil, err
		}
		blocks, parent := st.Blocks, st.ParentHash
		for len(blocks) > 0 {
			n, size := 0, used+ovh
			for n < len(blocks) {
				b, err := blockBytes(blocks[n])
				if err != nil {
					return nil, err
				}
				if size+b > limit {
					break
				}
				size += b
				n++
			}
			if n == 0 {
				if len(pages[len(pages)-1].Events) == 0 {
					return nil, fmt.Errorf("a dump page of %d bytes cannot hold one block", limit)
				}
				pages = append(pages, DumpReply{WorkerID: r.WorkerID})
				used = head
				continue
			}
			piece := ev
			piece.Event.Stored = &Stored{ParentHash: parent, LoRAName: st.LoRAName, Blocks: blocks[:n:n]}
			p := &pages[len(pages)-1]
			p.Events = append(p.Events, piece)
			used = size
			last := blocks[n-1].EngineHash
			parent, blocks = &last, blocks[n:]
		}
	}
	if len(pages) == 1 {
		return []DumpReply{r}, nil
	}
	if len(pages) > MaxDumpPages {
		return nil, fmt.Errorf("a dump of %d pages of %d bytes exceeds %d pages", len(pages), limit, MaxDumpPages)
	}
	for i := range pages {
		pages[i].Page, pages[i].Pages, pages[i].Snapshot = i, len(pages), snapshot
	}
	return pages, nil
}

// msgpack array headers take 1 byte up to 15 elements and at most 5.
const arrayHeaderSlack = 4

// maxDumpBlockBytes bounds the msgpack form of a block carrying a local
// hash and no token ids (as dumps do).
var maxDumpBlockBytes = func() int {
	h := ^uint64(0)
	b, err := msgpack.Marshal(&Block{EngineHash: h, LocalHash: &h})
	if err != nil {
		panic(err)
	}
	return len(b)
}()

// minDumpBlockBytes is the least a block can take in msgpack.
var minDumpBlockBytes = func() int {
	b, err := msgpack.Marshal(&Block{})
	if err != nil {
		panic(err)
	}
	return len(b)
}()

func blockBytes(b Block) (int, error) {
	if len(b.TokenIDs) == 0 {
		return maxDumpBlockBytes, nil
	}
	enc, err := msgpack.Marshal(&b)
	return len(enc), err
}

// eventEnvelopeBytes bounds the encoded size of ev's pieces without their
// blocks (each piece may carry a parent hash).
func eventEnvelopeBytes(ev RouterEvent) (int, error) {
	h := ^uint64(0)
	ev.Event = Event{Stored: &Stored{ParentHash: &h, LoRAName: ev.Event.Stored.LoRAName, Blocks: []Block{}}}
	b, err := msgpack.Marshal(&ev)
	return len(b) + arrayHeaderSlack, err
}

// pageEnvelopeBytes bounds the encoded size of a page without its events.
func pageEnvelopeBytes(worker string, ranks []DumpRank) (int, error) {
	b, err := EncodeDumpReply(DumpReply{WorkerID: worker, Ranks: ranks, Page: MaxDumpPages, Pages: MaxDumpPages, Snapshot: ^uint64(0)})
	return len(b) + arrayHeaderSlack, err
}
