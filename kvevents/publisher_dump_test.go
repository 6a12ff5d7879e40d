package kvevents_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvgate/kvgate/internal/testenv"
	"github.com/kvgate/kvgate/kvevents"
)

// startSmallNATS starts an embedded NATS server whose max_payload is
// maxPayload bytes, so a dump of a few thousand blocks needs many pages.
func startSmallNATS(t testing.TB, maxPayload int32) string {
	t.Helper()
	s, err := natsserver.NewServer(&natsserver.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true, MaxPayload: maxPayload})
	if err != nil {
		t.Fatalf("embedded nats: %v", err)
	}
	go s.Start()
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	if !s.ReadyForConnections(testenv.StartTimeout) {
		t.Fatal("embedded nats not ready")
	}
	return s.ClientURL()
}

// dumpedBlock is a block as a dump places it: under which parent, with
// which local hash and adapter.
type dumpedBlock struct {
	Rank   uint32
	Parent uint64 // 0: at the root
	Local  uint64
	LoRA   string
}

// bigWorker publishes about n blocks over two ranks: long chains (one
// longer than any page), branches, an adapter, an evicted parent and
// removals. It returns the blocks a dump must list, by engine hash.
func bigWorker(t testing.TB, p *kvevents.Publisher, n int) map[uint64]dumpedBlock {
	t.Helper()
	want := map[uint64]dumpedBlock{}
	next := uint64(1) << 40 // engine hashes, unique across ranks
	// store publishes a chain of k blocks under parent, in events of at
	// most 500 blocks (live events must fit the max payload too).
	store := func(rank uint32, parent uint64, k int, lora string) []uint64 {
		t.Helper()
		hashes := make([]uint64, k)
		for i := 0; i < k; i += 500 {
			st := &kvevents.Stored{LoRAName: lora}
			if parent != 0 {
				st.ParentHash = u64(parent)
			}
			for j := i; j < min(k, i+500); j++ {
				toks := []uint32{uint32(next), uint32(next >> 32), uint32(j)}
				hashes[j] = next * 0x9e3779b97f4a7c15 // spread over 64 bits, as engine hashes are
				st.Blocks = append(st.Blocks, kvevents.Block{EngineHash: hashes[j], TokenIDs: toks})
				want[hashes[j]] = dumpedBlock{Rank: rank, Parent: parent, Local: kvevents.BlockHash(toks, kvevents.LoRASeed(lora)), LoRA: lora}
				parent = hashes[j]
				next++
			}
			if _, err := p.Publish(rank, kvevents.Event{Stored: st}); err != nil {
				t.Fatal(err)
			}
		}
		return hashes
	}
	long := store(0, 0, n/2, "") // one chain across many pages
	for i := 0; i < n/4; i += 50 {
		store(0, long[i], 50, "") // branches
	}
	ad := store(1, 0, n/8, "adapter")
	store(1, ad[10], n/8, "adapter")
	// Evict a block in the middle of the long chain: its children stay,
	// listed under the evicted parent.
	if _, err := p.Publish(0, kvevents.Event{Removed: &kvevents.Removed{EngineHashes: []uint64{long[7]}}}); err != nil {
		t.Fatal(err)
	}
	delete(want, long[7])
	return want
}

// flatten lists where a dump puts each block, checking that every chain
// hangs under a block listed earlier, under the root, or under a parent
// the worker evicted.
func flatten(t testing.TB, d kvevents.DumpReply, want map[uint64]dumpedBlock) map[uint64]dumpedBlock {
	t.Helper()
	got := map[uint64]dumpedBlock{}
	for _, e := range d.Events {
		st := e.Event.Stored
		var parent uint64
		if st.ParentHash != nil {
			parent = *st.ParentHash
			if _, seen := got[parent]; !seen {
				if _, held := want[parent]; held {
					t.Fatalf("chain under %x listed before its parent", parent)
				}
			}
		}
		for _, b := range st.Blocks {
			got[b.EngineHash] = dumpedBlock{Rank: e.DPRank, Parent: parent, Local: *b.LocalHash, LoRA: st.LoRAName}
			parent = b.EngineHash
		}
	}
	return got
}

// A dump of 20k blocks on a server with a 64 KiB max_payload arrives in
// many pages, each within the limit, and rebuilds the publisher's blocks.
func TestPagedDump(t *testing.T) {
	noLeaks(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	nc := testenv.ConnectNATS(t, startSmallNATS(t, 64<<10))
	reg := prometheus.NewRegistry()
	p, err := kvevents.NewPublisher(nc, kvevents.PublisherConfig{Pool: "a", WorkerID: "big", Logger: testenv.Logger(t), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	want := bigWorker(t, p, 20000)
	// The requester on its own connection: pages cross the server.
	dump, err := kvevents.RequestDump(ctx, testenv.ConnectNATS(t, nc.ConnectedUrl()), "a", "big")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, flatten(t, dump, want)); diff != "" {
		t.Errorf("dumped blocks (-want +got):\n%s", diff)
	}
	wantRanks := []kvevents.DumpRank{
		{DPRank: 0, LastEventID: p.LastEventID(0), Blocks: len(p.Blocks(0))},
		{DPRank: 1, LastEventID: p.LastEventID(1), Blocks: len(p.Blocks(1))},
	}
	if diff := cmp.Diff(wantRanks, dump.Ranks); diff != "" {
		t.Errorf("dump ranks (-want +got):\n%s", diff)
	}
	if dump.WorkerID != "big" || dump.Page != 0 || dump.Pages != 0 || dump.Snapshot != 0 {
		t.Errorf("dump header %q page %d/%d snapshot %d, want worker big and no page fields", dump.WorkerID, dump.Page, dump.Pages, dump.Snapshot)
	}
	for _, e := range dump.Events {
		if want := p.LastEventID(e.DPRank); e.EventID != want {
			t.Fatalf("dumped event of rank %d has id %d, want the rank's last id %d", e.DPRank, e.EventID, want)
		}
	}
	// ~43 B per block: 20k blocks need at least 13 pages of 64 KiB.
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "kvgate_publisher_dump_pages_total" {
			if pages := mf.GetMetric()[0].GetCounter().GetValue(); pages < 13 {
				t.Errorf("dump sent in %v pages, want ≥ 13", pages)
			}
			return
		}
	}
	t.Error("no kvgate_publisher_dump_pages_total metric")
}

// A page that never arrives fails the dump with ErrDump naming it: at
// once when a later page shows it lost, at the deadline when it was the
// last.
func TestPagedDumpLostPage(t *testing.T) {
	noLeaks(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	nc := testenv.ConnectNATS(t, startSmallNATS(t, 64<<10))
	p, err := kvevents.NewPublisher(nc, kvevents.PublisherConfig{Pool: "a", WorkerID: "big", Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	bigWorker(t, p, 20000)
	var sent atomic.Int64 // pages of a whole answer
	kvevents.SetDumpPageDrop(p, func(int) bool { sent.Add(1); return false })
	if _, err := kvevents.RequestDump(ctx, nc, "a", "big"); err != nil {
		t.Fatal(err)
	}
	pages := int(sent.Load())

	tests := []struct {
		name     string
		drop     func(page int) bool
		deadline bool // the loss shows only at the deadline
		want     string
	}{
		{"middle page", func(page int) bool { return page == 2 }, false, fmt.Sprintf("got %d of %d pages, missing page(s) 2 after the final page", pages-1, pages)},
		{"run of pages", func(page int) bool { return page >= 3 && page <= 5 }, false, "missing page(s) 3-5"},
		{"first page", func(page int) bool { return page == 0 }, false, "missing page(s) 0 after"},
		{"final page", func(page int) bool { return page == pages-1 }, true, fmt.Sprintf("missing page(s) %d", pages-1)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			kvevents.SetDumpPageDrop(p, tc.drop)
			rctx := ctx
			if tc.deadline {
				var cancel context.CancelFunc
				// Long enough for every other page to arrive on a loaded
				// machine: the loss must show as a missing page, not as
				// a dump that never started.
				rctx, cancel = context.WithTimeout(ctx, 4*time.Second)
				defer cancel()
			}
			d, err := kvevents.RequestDump(rctx, nc, "a", "big")
			if !errors.Is(err, kvevents.ErrDump) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("RequestDump error = %v, want ErrDump with %q", err, tc.want)
			}
			if tc.deadline != errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("RequestDump error = %v, deadline exceeded %v, want %v", err, !tc.deadline, tc.deadline)
			}
			if d.Events != nil || d.Ranks != nil {
				t.Errorf("failed dump returned %d events and %d ranks, want none", len(d.Events), len(d.Ranks))
			}
		})
	}
}

// A requester from before paging (no page header, one reply taken) gets
// the whole dump in one message when it fits, and an error when it does
// not: never a page it would take for the whole dump.
func TestUnpagedRequester(t *testing.T) {
	noLeaks(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	nc := testenv.ConnectNATS(t, startSmallNATS(t, 64<<10))
	p, err := kvevents.NewPublisher(nc, kvevents.PublisherConfig{Pool: "a", WorkerID: "w", Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.PublishStored([]uint32{1, 2, 3, 4}, 2, []uint64{1, 2}, nil, ""); err != nil {
		t.Fatal(err)
	}
	old, err := nc.RequestWithContext(ctx, kvevents.DumpSubject("a", "w"), nil)
	if err != nil {
		t.Fatal(err)
	}
	paged, err := kvevents.RequestDump(ctx, nc, "a", "w")
	if err != nil {
		t.Fatal(err)
	}
	// A small dump is one page: the very bytes an old requester gets.
	if b, err := kvevents.EncodeDumpReply(paged); err != nil || string(b) != string(old.Data) {
		t.Errorf("one-page dump %x (err %v), want the unpaged reply %x", b, err, old.Data)
	}

	bigWorker(t, p, 20000)
	old, err = nc.RequestWithContext(ctx, kvevents.DumpSubject("a", "w"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if e := old.Header.Get(kvevents.DumpErrorHeader); !strings.Contains(e, "exceeds the NATS max payload") || len(old.Data) != 0 {
		t.Errorf("unpaged reply to a big dump: header %q, %d bytes; want the max payload error and no data", e, len(old.Data))
	}
	// A malformed page header is refused the same way.
	req := nats.NewMsg(kvevents.DumpSubject("a", "w"))
	req.Header.Set(kvevents.DumpPageBytesHeader, "lots")
	bad, err := nc.RequestMsgWithContext(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if e := bad.Header.Get(kvevents.DumpErrorHeader); !strings.Contains(e, kvevents.DumpPageBytesHeader) {
		t.Errorf("reply to a bad page header: error %q, want one naming the header", e)
	}
}

// BenchmarkDump100k times a dump of 100k blocks (1,563 chains of 64) over
// an embedded NATS server with the default 1 MiB max_payload, from the
// request to the last page decoded, and reports the bytes on the wire.
func BenchmarkDump100k(b *testing.B) {
	nc := testenv.ConnectNATS(b, testenv.StartNATS(b))
	reg := prometheus.NewRegistry()
	p, err := kvevents.NewPublisher(nc, kvevents.PublisherConfig{Pool: "a", WorkerID: "big", Registerer: reg})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	const blocks, chain, blockSize = 100000, 64, 16
	toks := make([]uint32, chain*blockSize)
	hashes := make([]uint64, chain)
	for c := 0; c < blocks; c += chain {
		n := min(chain, blocks-c)
		for i := range n {
			hashes[i] = uint64(c+i+1) * 0x9e3779b97f4a7c15
			for j := range blockSize {
				toks[i*blockSize+j] = uint32((c+i)*blockSize + j)
			}
		}
		if err := p.PublishStored(toks[:n*blockSize], blockSize, hashes[:n], nil, ""); err != nil {
			b.Fatal(err)
		}
	}
	req := testenv.ConnectNATS(b, nc.ConnectedUrl())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	b.ReportAllocs()
	for b.Loop() {
		d, err := kvevents.RequestDump(ctx, req, "a", "big")
		if err != nil {
			b.Fatal(err)
		}
		if d.Ranks[0].Blocks != blocks {
			b.Fatalf("dump of %d blocks, want %d", d.Ranks[0].Blocks, blocks)
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	var dumps, pages, bytes float64
	for _, mf := range mfs {
		switch m := mf.GetMetric()[0]; mf.GetName() {
		case "kvgate_publisher_dump_requests_total":
			dumps = m.GetCounter().GetValue()
		case "kvgate_publisher_dump_pages_total":
			pages = m.GetCounter().GetValue()
		case "kvgate_publisher_dump_reply_bytes":
			bytes = m.GetHistogram().GetSampleSum()
		}
	}
	b.ReportMetric(bytes/dumps, "wire-B/op")
	b.ReportMetric(pages/dumps, "pages/op")
	b.ReportMetric(bytes/dumps/blocks, "wire-B/block")
}
