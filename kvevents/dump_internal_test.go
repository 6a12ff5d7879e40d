package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// testDump is a dump of two ranks: a chain of n blocks with branches on
// rank 0, an adapter chain on rank 1, and a block with token ids (dumps from
// other publishers may carry them).
func testDump(n int) DumpReply {
	blocks := map[uint64]pubBlock{}
	r := rand.New(rand.NewPCG(1, 2))
	var prev uint64
	for i := range n {
		h := r.Uint64() | 1
		blocks[h] = pubBlock{parent: prev, hasParent: i > 0, local: r.Uint64()}
		if i%97 == 5 { // a one-block branch
			blocks[r.Uint64()|1] = pubBlock{parent: h, hasParent: true, local: r.Uint64()}
		}
		prev = h
	}
	d := DumpReply{WorkerID: "worker-with-a-long-name", Ranks: []DumpRank{{DPRank: 0, LastEventID: 1 << 40, Blocks: len(blocks)}, {DPRank: 7, LastEventID: 3, Blocks: 11}}}
	for _, st := range chains(blocks) {
		d.Events = append(d.Events, RouterEvent{WorkerID: d.WorkerID, EventID: 1 << 40, Event: Event{Stored: st}})
	}
	ad := &Stored{LoRAName: "an-adapter", ParentHash: &prev}
	for i := range 10 {
		ad.Blocks = append(ad.Blocks, Block{EngineHash: uint64(i + 1), LocalHash: &prev})
	}
	ad.Blocks = append(ad.Blocks, Block{EngineHash: 99, TokenIDs: make([]uint32, 64)})
	d.Events = append(d.Events, RouterEvent{WorkerID: d.WorkerID, DPRank: 7, EventID: 3, Event: Event{Stored: ad}})
	return d
}

// placed lists, in dump order, each block with its parent, rank and adapter.
func placed(d DumpReply) []string {
	var out []string
	for _, e := range d.Events {
		st := e.Event.Stored
		parent := "root"
		if st.ParentHash != nil {
			parent = fmt.Sprintf("%x", *st.ParentHash)
		}
		for _, b := range st.Blocks {
			out = append(out, fmt.Sprintf("%d/%d %s→%x %s %d", e.DPRank, e.EventID, parent, b.EngineHash, st.LoRAName, len(b.TokenIDs)))
			parent = fmt.Sprintf("%x", b.EngineHash)
		}
	}
	return out
}

func TestPageDump(t *testing.T) {
	d := testDump(5000)
	whole, err := EncodeDumpReply(d)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		limit     int
		wantPages int // 0: more than one
	}{
		{limit: MinDumpPageBytes},
		{limit: 10000},
		{limit: len(whole) - 1},
		{limit: len(whole), wantPages: 1}, // page bounds would say 2
		{limit: 1 << 20, wantPages: 1},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprint(tc.limit), func(t *testing.T) {
			msgs, err := encodeDumpPages(d, tc.limit, 42)
			if err != nil {
				t.Fatal(err)
			}
			if tc.wantPages == 1 {
				if len(msgs) != 1 || string(msgs[0]) != string(whole) {
					t.Errorf("got %d messages, want the whole dump as one", len(msgs))
				}
				return
			}
			if len(msgs) < 2 {
				t.Fatalf("got %d pages, want several", len(msgs))
			}
			var a dumpAssembler
			// Any order, as long as the final page comes last.
			order := rand.New(rand.NewPCG(3, 4)).Perm(len(msgs) - 1)
			order = append(order, len(msgs)-1)
			for k, i := range order {
				b := msgs[i]
				if len(b) > tc.limit {
					t.Errorf("page %d is %d bytes, over the %d limit", i, len(b), tc.limit)
				}
				p, err := DecodeDumpReply(b)
				if err != nil {
					t.Fatal(err)
				}
				if p.Page != i || p.Pages != len(msgs) || p.Snapshot != 42 {
					t.Errorf("page %d says page %d of %d, snapshot %d", i, p.Page, p.Pages, p.Snapshot)
				}
				done, err := a.add(p)
				if err != nil || done != (k == len(order)-1) {
					t.Fatalf("add page %d (%d of %d): done %v err %v", i, k+1, len(msgs), done, err)
				}
			}
			got := a.reply()
			if diff := cmp.Diff(placed(d), placed(got)); diff != "" {
				t.Errorf("blocks as placed (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(d.Ranks, got.Ranks); diff != "" || got.WorkerID != d.WorkerID {
				t.Errorf("worker %q, ranks (-want +got):\n%s", got.WorkerID, diff)
			}
		})
	}
	if _, err := pageDump(d, 100, 1); err == nil || !strings.Contains(err.Error(), "cannot hold one block") {
		t.Errorf("100-byte pages: error %v, want one saying a block does not fit", err)
	}
}

func TestDumpAssembler(t *testing.T) {
	page := func(i, n int, snap uint64) DumpReply {
		p := DumpReply{WorkerID: "w", Page: i, Pages: n, Snapshot: snap}
		if i == 0 {
			p.Ranks = []DumpRank{{LastEventID: 9}}
		}
		h := uint64(100 + i)
		p.Events = []RouterEvent{{WorkerID: "w", EventID: 9, Event: Event{Stored: &Stored{Blocks: []Block{{EngineHash: h, LocalHash: &h}}}}}}
		return p
	}
	other := page(1, 3, 8)
	other.WorkerID = "x"
	tests := []struct {
		name    string
		pages   []DumpReply
		wantErr string // "" : whole after the last page
	}{
		{"unpaged", []DumpReply{{WorkerID: "w"}}, ""},
		{"in order", []DumpReply{page(0, 3, 7), page(1, 3, 7), page(2, 3, 7)}, ""},
		{"another answer ignored", []DumpReply{page(1, 3, 7), page(0, 2, 8), {WorkerID: "w"}, page(0, 3, 7), page(2, 3, 7)}, ""},
		{"duplicate", []DumpReply{page(0, 3, 7), page(0, 3, 7)}, "page 0 of 3 received twice"},
		{"page count changes", []DumpReply{page(0, 3, 7), page(1, 4, 7)}, "page 1 says 4 pages, page 0 said 3"},
		{"worker changes", []DumpReply{page(0, 3, 8), other}, `page 1 names worker "x"`},
		{"lost before the final page", []DumpReply{page(0, 4, 7), page(3, 4, 7)}, "got 2 of 4 pages, missing page(s) 1-2 after the final page"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var a dumpAssembler
			for i, p := range tc.pages {
				done, err := a.add(p)
				if err != nil {
					if tc.wantErr == "" || !errors.Is(err, ErrDump) || !strings.Contains(err.Error(), tc.wantErr) {
						t.Fatalf("add %d: error %v, want ErrDump with %q", i, err, tc.wantErr)
					}
					return
				}
				if done != (i == len(tc.pages)-1) {
					t.Fatalf("add %d of %d: done %v", i+1, len(tc.pages), done)
				}
			}
			if tc.wantErr != "" {
				t.Fatalf("no error, want %q", tc.wantErr)
			}
			if r := a.reply(); r.Pages != 0 || r.Page != 0 || r.Snapshot != 0 || r.WorkerID != "w" {
				t.Errorf("reply %+v, want worker w without page fields", r)
			}
		})
	}
}

// FuzzDumpPages feeds messages (each a 2-byte length and that many bytes)
// to the page assembler: it must never call a dump whole with a page
// missing, nor panic.
func FuzzDumpPages(f *testing.F) {
	pages, err := pageDump(testDump(20), 1200, 5) // small pages keep the seed small
	if err != nil {
		f.Fatal(err)
	}
	var seed []byte
	for _, p := range pages {
		b, err := EncodeDumpReply(p)
		if err != nil {
			f.Fatal(err)
		}
		seed = binary.BigEndian.AppendUint16(seed, uint16(len(b)))
		seed = append(seed, b...)
	}
	f.Add(seed)
	f.Add(seed[:len(seed)/2])
	f.Fuzz(func(t *testing.T, in []byte) {
		var a dumpAssembler
		received := map[uint64]map[int]bool{}
		for len(in) >= 2 {
			n := int(binary.BigEndian.Uint16(in))
			in = in[2:]
			if n > len(in) {
				return
			}
			msg := in[:n]
			in = in[n:]
			p, err := DecodeDumpReply(msg)
			if err != nil {
				continue
			}
			if received[p.Snapshot] == nil {
				received[p.Snapshot] = map[int]bool{}
			}
			received[p.Snapshot][p.Page] = true
			done, err := a.add(p)
			if err != nil {
				if !errors.Is(err, ErrDump) {
					t.Fatalf("assembler error %v is not ErrDump", err)
				}
				return
			}
			if done {
				r := a.reply()
				if a.first.Pages > 0 && len(received[a.first.Snapshot]) != a.first.Pages {
					t.Fatalf("whole after %d of %d pages", len(received[a.first.Snapshot]), a.first.Pages)
				}
				if r.Pages != 0 && a.first.Pages != 0 {
					t.Fatalf("assembled reply keeps page fields: %d", r.Pages)
				}
				return
			}
		}
	})
}

func BenchmarkPageDump100k(b *testing.B) {
	d := testDump(100000)
	b.ReportAllocs()
	var bytes, pages int
	for b.Loop() {
		pp, err := pageDump(d, 1<<20, 1)
		if err != nil {
			b.Fatal(err)
		}
		bytes, pages = 0, len(pp)
		for _, p := range pp {
			enc, err := EncodeDumpReply(p)
			if err != nil {
				b.Fatal(err)
			}
			bytes += len(enc)
		}
	}
	b.ReportMetric(float64(bytes), "wire-B/op")
	b.ReportMetric(float64(pages), "pages/op")
}

// A header claiming more elements than the message holds is refused before
// msgpack allocates for them.
func TestDecodeDumpReplyHugeLengths(t *testing.T) {
	tests := []struct {
		name string
		in   []byte
	}{
		{"array32 of 4G events", []byte{0x81, 0xa6, 'e', 'v', 'e', 'n', 't', 's', 0xdd, 0xff, 0xff, 0xff, 0xff, 0x80}},
		{"map32 of 4G entries", []byte{0xdf, 0xff, 0xff, 0xff, 0xff, 0xc0}},
		{"str32 of 4 GB", []byte{0x81, 0xa9, 'w', 'o', 'r', 'k', 'e', 'r', '_', 'i', 'd', 0xdb, 0xff, 0xff, 0xff, 0xff}},
		{"nested arrays past the end", []byte{0x91, 0x9f}},
		{"unused code", []byte{0xc1}},
		{"empty", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := DecodeDumpReply(tc.in); !errors.Is(err, ErrInvalidEvent) {
				t.Errorf("DecodeDumpReply(%x) error %v, want ErrInvalidEvent", tc.in, err)
			}
		})
	}
	for _, n := range []int{0, 1, 20, 3000} {
		b, err := EncodeDumpReply(testDump(n))
		if err != nil {
			t.Fatal(err)
		}
		if err := checkMsgpackLengths(b); err != nil {
			t.Errorf("dump of %d blocks: %v", n, err)
		}
	}
}
