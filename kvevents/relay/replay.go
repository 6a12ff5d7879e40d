package relay

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/go-zeromq/zmq4"
)

// vLLM's publisher keeps its last batches (buffer_steps, 10,000 by default)
// and serves them on an optional ROUTER socket (kv-events-config
// "replay_endpoint"): a DEALER sends [b"", start_seq as 8 bytes big-endian]
// and receives [b"", seq, payload] (newer vLLM: [b"", topic, seq, payload])
// for every buffered batch from start_seq on, then [b"", END_SEQ, b""] with
// END_SEQ = -1 as 8 bytes.

// replayTimeout bounds one replay exchange.
const replayTimeout = 2 * time.Second

var endSeq = bytes.Repeat([]byte{0xff}, 8)

// replayed is one message of a replay, as the three frames of a live one.
type replayed struct {
	seq    uint64
	frames [][]byte
}

// fetchReplay asks the engine's replay socket for every batch from start
// on. ctx bounds the exchange.
func fetchReplay(ctx context.Context, endpoint string, start uint64) ([]replayed, error) {
	ctx, cancel := context.WithTimeout(ctx, replayTimeout)
	defer cancel()
	sock := zmq4.NewDealer(ctx, zmq4.WithDialerMaxRetries(0), zmq4.WithTimeout(replayTimeout))
	defer sock.Close()
	if err := sock.Dial(endpoint); err != nil {
		return nil, fmt.Errorf("replay %s: %w", endpoint, err)
	}
	req := make([]byte, 8)
	binary.BigEndian.PutUint64(req, start)
	if err := sock.SendMulti(zmq4.NewMsgFrom([]byte{}, req)); err != nil {
		return nil, fmt.Errorf("replay %s: request: %w", endpoint, err)
	}
	var out []replayed
	for {
		msg, err := sock.Recv()
		if err != nil {
			return out, fmt.Errorf("replay %s: %w", endpoint, err)
		}
		f := msg.Frames
		if len(f) > 0 && len(f[0]) == 0 {
			f = f[1:] // the empty delimiter
		}
		var topic, seq, payload []byte
		switch len(f) {
		case 2:
			seq, payload = f[0], f[1]
		case 3:
			topic, seq, payload = f[0], f[1], f[2]
		default:
			return out, fmt.Errorf("replay %s: reply of %d frames", endpoint, len(msg.Frames))
		}
		if len(seq) != 8 {
			return out, fmt.Errorf("replay %s: sequence frame of %d bytes", endpoint, len(seq))
		}
		if bytes.Equal(seq, endSeq) {
			return out, nil
		}
		out = append(out, replayed{seq: binary.BigEndian.Uint64(seq), frames: [][]byte{topic, seq, payload}})
	}
}

// recoverGap fetches the batches an engine stream lost, (last, next), from
// its replay socket and publishes them in order. It reports whether the
// whole gap was recovered; what could be fetched is published either way.
func (r *Relay) recoverGap(ctx context.Context, endpoint, replay string, last, next uint64) bool {
	msgs, err := fetchReplay(ctx, replay, last+1)
	if err != nil {
		r.log.Warn("replay of lost engine messages failed", "endpoint", endpoint, "replay", replay, "err", err)
	}
	want := last + 1
	for _, m := range msgs {
		if m.seq <= last || m.seq >= next {
			continue
		}
		if m.seq != want {
			r.log.Warn("engine replay buffer no longer holds lost messages", "endpoint", endpoint, "from_seq", want, "to_seq", m.seq-1)
		}
		want = m.seq + 1
		b, err := r.dec.Decode(m.frames)
		if err != nil {
			r.m.malformed.Inc()
			r.log.Warn("skipping malformed replayed message", "endpoint", endpoint, "seq", m.seq, "err", err)
			continue
		}
		r.m.replayed.Inc()
		r.publishBatch(endpoint, b)
	}
	return err == nil && want == next && len(msgs) > 0 && msgs[0].seq <= last+1
}
