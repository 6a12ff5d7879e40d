package mocker

import (
	"bytes"
	"context"
	"encoding/binary"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/google/go-cmp/cmp"

	"github.com/kvgate/kvgate/kvevents"
)

// TestZMQSinkReplay asks the mocker's replay socket, as vLLM's is asked,
// for batches nobody received.
func TestZMQSinkReplay(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	z, err := NewZMQSink(ctx, "tcp://127.0.0.1:0", "kv", 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer z.Close()
	if err := z.ServeReplay(ctx, "tcp://127.0.0.1:0", 2); err != nil {
		t.Fatal(err)
	}
	var sent [][]kvevents.Event
	for h := range uint64(3) {
		evs := []kvevents.Event{{Stored: &kvevents.Stored{Blocks: []kvevents.Block{{EngineHash: h + 1, TokenIDs: []uint32{1, 2}}}}}}
		sent = append(sent, evs)
		if err := z.PublishKV(ctx, t0, evs); err != nil {
			t.Fatal(err)
		}
	}
	dealer := zmq4.NewDealer(ctx)
	defer dealer.Close()
	if err := dealer.Dial(z.ReplayEndpoint()); err != nil {
		t.Fatal(err)
	}
	if err := dealer.SendMulti(zmq4.NewMsgFrom([]byte{}, []byte{0, 0, 0, 0, 0, 0, 0, 0})); err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	var got [][]kvevents.Event
	for {
		msg, err := dealer.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if len(msg.Frames) != 3 || len(msg.Frames[0]) != 0 {
			t.Fatalf("reply frames %q", msg.Frames)
		}
		if bytes.Equal(msg.Frames[1], bytes.Repeat([]byte{0xff}, 8)) {
			break
		}
		seqs = append(seqs, binary.BigEndian.Uint64(msg.Frames[1]))
		b, err := kvevents.DecodeEnginePayload(msg.Frames[2], 2)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, b.Events)
	}
	// The buffer holds 2: batch 0 is gone.
	if diff := cmp.Diff([]uint64{1, 2}, seqs); diff != "" {
		t.Errorf("replayed sequences (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(sent[1:], got); diff != "" {
		t.Errorf("replayed events (-want +got):\n%s", diff)
	}
}
