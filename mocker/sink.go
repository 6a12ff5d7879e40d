package mocker

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvgate/kvgate/kvevents"
)

// ZMQSink publishes KV events exactly as vLLM does (kvevents.EngineFrames
// of kvevents.EncodeEnginePayload: topic, big-endian sequence from 0,
// msgpack batch) on a ZMQ PUB socket, so `kvgate relay` ingests the mocker
// through the same path as a real vLLM.
type ZMQSink struct {
	sock      zmq4.Socket
	topic     string
	blockSize int
	dpRank    uint32
	seq       uint64

	// The replay socket, when served (ServeReplay).
	replay     zmq4.Socket
	replayDone chan struct{}
	mu         sync.Mutex // guards buffer
	buffer     []sentBatch
	bufferCap  int
}

type sentBatch struct {
	seq     uint64
	payload []byte
}

var _ KVSink = (*ZMQSink)(nil)

// NewZMQSink binds a PUB socket on endpoint (vLLM's default is
// tcp://*:5557). The socket lives until Close or until ctx ends.
func NewZMQSink(ctx context.Context, endpoint, topic string, blockSize int, dpRank uint32) (*ZMQSink, error) {
	sock := zmq4.NewPub(ctx)
	if err := sock.Listen(endpoint); err != nil {
		sock.Close()
		return nil, fmt.Errorf("zmq sink: %w", err)
	}
	return &ZMQSink{sock: sock, topic: topic, blockSize: blockSize, dpRank: dpRank}, nil
}

// Addr is the bound address (useful with port 0).
func (z *ZMQSink) Addr() net.Addr { return z.sock.Addr() }

// Endpoint is the tcp:// endpoint a relay should dial.
func (z *ZMQSink) Endpoint() string { return tcpEndpoint(z.sock.Addr()) }

func tcpEndpoint(addr net.Addr) string {
	a, ok := addr.(*net.TCPAddr)
	if !ok {
		return ""
	}
	host := a.IP.String()
	if a.IP.IsUnspecified() {
		host = "127.0.0.1"
	}
	return "tcp://" + net.JoinHostPort(host, fmt.Sprint(a.Port))
}

// PublishKV implements KVSink. A PUB socket drops messages no subscriber
// takes, as in vLLM.
func (z *ZMQSink) PublishKV(_ context.Context, ts time.Time, events []kvevents.Event) error {
	payload, err := kvevents.EncodeEnginePayload(float64(ts.UnixNano())/1e9, events, z.dpRank, z.blockSize)
	if err != nil {
		return err
	}
	frames := kvevents.EngineFrames(z.topic, z.seq, payload)
	z.mu.Lock()
	if z.bufferCap > 0 {
		if len(z.buffer) == z.bufferCap {
			z.buffer = append(z.buffer[:0], z.buffer[1:]...)
		}
		z.buffer = append(z.buffer, sentBatch{z.seq, payload})
	}
	z.mu.Unlock()
	z.seq++
	return z.sock.SendMulti(zmq4.NewMsgFrom(frames...))
}

// ServeReplay binds vLLM's replay socket on endpoint (a ROUTER; vLLM's
// kv-events-config "replay_endpoint") and keeps the last size batches (vLLM's
// buffer_steps, 10,000 if 0) for subscribers that lost some: a request
// [b"", start_seq] is answered with [b"", seq, payload] for every buffered
// batch from start_seq on, then [b"", END_SEQ = -1, b""].
func (z *ZMQSink) ServeReplay(ctx context.Context, endpoint string, size int) error {
	if size <= 0 {
		size = 10000
	}
	sock := zmq4.NewRouter(ctx, zmq4.WithID(zmq4.SocketIdentity("kvgate-mocker-replay")))
	if err := sock.Listen(endpoint); err != nil {
		sock.Close()
		return fmt.Errorf("zmq replay: %w", err)
	}
	z.mu.Lock()
	z.bufferCap = size
	z.mu.Unlock()
	z.replay, z.replayDone = sock, make(chan struct{})
	go z.serveReplay()
	return nil
}

// ReplayEndpoint is the tcp:// endpoint of the replay socket ("" if not
// served).
func (z *ZMQSink) ReplayEndpoint() string {
	if z.replay == nil {
		return ""
	}
	return tcpEndpoint(z.replay.Addr())
}

func (z *ZMQSink) serveReplay() {
	defer close(z.replayDone)
	end := []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	for {
		msg, err := z.replay.Recv()
		if err != nil {
			return // closed
		}
		if len(msg.Frames) != 3 || len(msg.Frames[2]) != 8 {
			continue // vLLM ignores malformed requests too
		}
		id, start := msg.Frames[0], binary.BigEndian.Uint64(msg.Frames[2])
		z.mu.Lock()
		batches := slices.Clone(z.buffer)
		z.mu.Unlock()
		for _, b := range batches {
			if b.seq >= start {
				seq := make([]byte, 8)
				binary.BigEndian.PutUint64(seq, b.seq)
				if err := z.replay.Send(zmq4.NewMsgFrom(id, []byte{}, seq, b.payload)); err != nil {
					break
				}
			}
		}
		z.replay.Send(zmq4.NewMsgFrom(id, []byte{}, end, []byte{}))
	}
}

// Close closes the sockets.
func (z *ZMQSink) Close() error {
	err := z.sock.Close()
	if z.replay != nil {
		z.replay.Close()
		<-z.replayDone
	}
	return err
}

// PublisherSink sends KV events straight to NATS through a
// kvevents.Publisher (no relay needed).
type PublisherSink struct {
	Publisher *kvevents.Publisher
	DPRank    uint32
}

var _ KVSink = PublisherSink{}

// PublishKV implements KVSink.
func (p PublisherSink) PublishKV(_ context.Context, _ time.Time, events []kvevents.Event) error {
	var errs []error
	for _, ev := range events {
		if _, err := p.Publisher.Publish(p.DPRank, ev); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// FuncSink adapts a function to KVSink (tests, the simulator).
type FuncSink func(ctx context.Context, ts time.Time, events []kvevents.Event) error

// PublishKV implements KVSink.
func (f FuncSink) PublishKV(ctx context.Context, ts time.Time, events []kvevents.Event) error {
	return f(ctx, ts, events)
}
