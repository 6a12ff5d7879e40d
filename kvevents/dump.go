package kvevents

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/vmihailenco/msgpack/v5"
)

// DumpReply is a publisher's answer on DumpSubject(pool, worker): the
// worker's current blocks, as Stored events that rebuild them, and per data-
// parallel rank the id of the last event published before the snapshot was
// taken. The wire format is the msgpack encoding of DumpReply (field names
// as tagged); an empty request body asks for every rank.
//
// A router resynchronising a (worker, rank) — after an event-id gap or a
// publisher restart (ids starting again at 1) — drops what it holds for that
// rank, applies the rank's Events in order, then applies live events whose
// id is greater than the rank's LastEventID and ignores the others (they are
// already in the dump). Every event of a rank carries EventID = LastEventID.
//
// Events list parents before children; a linear run of blocks is one Stored
// chain. Blocks carry their kvgate LocalHash (XXH3 of the block's tokens
// with the LoRA seed, as an index computes it) instead of token ids, which
// keeps dumps small; LoRAName is kept for information. A block whose parent was evicted while the block itself stayed
// cached (possible in vLLM too) is listed with that parent hash: a router
// that rejects Stored events under unknown parents will skip it, as it would
// have if it had been listening from the start and evicted the parent.
type DumpReply struct {
	WorkerID string     `json:"worker_id" msgpack:"worker_id"`
	Ranks    []DumpRank `json:"ranks" msgpack:"ranks"`
	// Events are Stored events of every rank, grouped by rank in Ranks
	// order.
	Events []RouterEvent `json:"events" msgpack:"events"`
}

// DumpRank is the resume point of one data-parallel rank in a DumpReply.
type DumpRank struct {
	DPRank uint32 `json:"dp_rank" msgpack:"dp_rank"`
	// LastEventID is the id of the rank's last published event, 0 if none.
	LastEventID uint64 `json:"last_event_id" msgpack:"last_event_id"`
	// Blocks is the number of blocks the rank holds.
	Blocks int `json:"blocks" msgpack:"blocks"`
}

// EncodeDumpReply returns the msgpack wire form of r.
func EncodeDumpReply(r DumpReply) ([]byte, error) { return msgpack.Marshal(&r) }

// DecodeDumpReply parses a dump reply and validates its events.
func DecodeDumpReply(b []byte) (DumpReply, error) {
	var r DumpReply
	if err := msgpack.Unmarshal(b, &r); err != nil {
		return DumpReply{}, fmt.Errorf("%w: dump reply: %v", ErrInvalidEvent, err)
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

// DumpErrorHeader is the NATS header of a dump reply that carries an error
// instead of a DumpReply (the reply would exceed the server's max payload).
const DumpErrorHeader = "Kvgate-Dump-Error"

// ErrDump reports a publisher that could not produce a dump.
var ErrDump = errors.New("publisher could not dump")

// RequestDump asks the publisher of worker in pool for its current blocks
// over NATS request-reply; ctx bounds the wait (nats.ErrNoResponders when no
// publisher listens).
func RequestDump(ctx context.Context, nc *nats.Conn, pool, worker string) (DumpReply, error) {
	msg, err := nc.RequestWithContext(ctx, DumpSubject(pool, worker), nil)
	if err != nil {
		return DumpReply{}, fmt.Errorf("dump of worker %q in pool %q: %w", worker, pool, err)
	}
	if e := msg.Header.Get(DumpErrorHeader); e != "" {
		return DumpReply{}, fmt.Errorf("%w: worker %q in pool %q: %s", ErrDump, worker, pool, e)
	}
	return DecodeDumpReply(msg.Data)
}
