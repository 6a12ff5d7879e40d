package mocker

import (
	"context"
	"errors"
	"fmt"
	"net"
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
func (z *ZMQSink) Endpoint() string {
	a, ok := z.sock.Addr().(*net.TCPAddr)
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
	z.seq++
	return z.sock.SendMulti(zmq4.NewMsgFrom(frames...))
}

// Close closes the socket.
func (z *ZMQSink) Close() error { return z.sock.Close() }

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
