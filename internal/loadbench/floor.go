package loadbench

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"google.golang.org/grpc"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
)

// The gRPC floor: what one request/response pair costs on a long-lived
// bidirectional gRPC stream over loopback with no work on either side, the
// transport the channel's probes ride on. grpc-go's own benchmark service
// (interop/grpc_testing.BenchmarkService.StreamingCall) answers each
// request with an empty response in order; the client sends a payload the
// size of a probe's 512 block hashes. Served beside the router, with the
// same server options, and paced by the same harness, it is the part of a
// probe's latency and CPU no router work can remove.

// floorService echoes each request of a StreamingCall with an empty
// response, in order.
type floorService struct {
	testgrpc.UnimplementedBenchmarkServiceServer
}

func (floorService) StreamingCall(s testgrpc.BenchmarkService_StreamingCallServer) error {
	in := new(testgrpc.SimpleRequest)
	out := new(testgrpc.SimpleResponse)
	for {
		if err := s.RecvMsg(in); err != nil {
			return nil // the client ended the stream
		}
		if err := s.Send(out); err != nil {
			return err
		}
	}
}

// floorClient multiplexes callers on one StreamingCall: answers come in
// the order of the requests, so a FIFO of waiters pairs them.
type floorClient struct {
	stream  testgrpc.BenchmarkService_StreamingCallClient
	payload *testgrpc.SimpleRequest

	mu      sync.Mutex // serialises Send and the FIFO's order
	waiters []chan error
	err     error // the stream's end, once it ended
}

func newFloorClient(ctx context.Context, conn grpc.ClientConnInterface, payloadBytes int) (*floorClient, error) {
	st, err := testgrpc.NewBenchmarkServiceClient(conn).StreamingCall(ctx)
	if err != nil {
		return nil, fmt.Errorf("probe bench: gRPC floor: %w", err)
	}
	f := &floorClient{stream: st, payload: &testgrpc.SimpleRequest{Payload: &testgrpc.Payload{Body: make([]byte, payloadBytes)}}}
	go f.receive()
	return f, nil
}

func (f *floorClient) receive() {
	out := new(testgrpc.SimpleResponse)
	for {
		err := f.stream.RecvMsg(out)
		f.mu.Lock()
		if err != nil {
			f.err = err
			for _, w := range f.waiters {
				w <- err
			}
			f.waiters = nil
			f.mu.Unlock()
			return
		}
		var w chan error
		if len(f.waiters) > 0 {
			w, f.waiters = f.waiters[0], f.waiters[1:]
		}
		f.mu.Unlock()
		if w != nil {
			w <- nil
		}
	}
}

// roundTrip sends one request and waits for its answer or ctx.
func (f *floorClient) roundTrip(ctx context.Context) error {
	w := make(chan error, 1)
	f.mu.Lock()
	if f.err != nil {
		f.mu.Unlock()
		return f.err
	}
	f.waiters = append(f.waiters, w)
	err := f.stream.Send(f.payload)
	f.mu.Unlock()
	if err != nil {
		return err
	}
	select {
	case err := <-w:
		return err
	case <-ctx.Done():
		return errors.Join(ctx.Err(), errors.New("the gRPC floor's answers are in order: a late one is still paired with its request"))
	}
}

func (f *floorClient) close() { _ = f.stream.CloseSend() }
