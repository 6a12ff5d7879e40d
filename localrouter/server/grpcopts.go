package server

import (
	"runtime"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// transportWindow fixes HTTP/2 flow-control windows. Setting them turns off
// gRPC's bandwidth-delay-product estimation, whose ping frames otherwise
// ride along small RPCs (a probe is ~4 KiB of hashes): fewer frames,
// allocations and syscalls per call.
const transportWindow = 1 << 20

// MaxRecvMsgBytes bounds one request message. gRPC's default, 4 MiB, is
// ~520k block hashes: a prompt the global router accepts (16 MiB bodies)
// can need more, and a refused probe would open the router's circuit.
const MaxRecvMsgBytes = 64 << 20

// GRPCServerOptions are the local router's gRPC server options, with m's
// interceptors: keepalive pings (so a connection cut without a FIN ends its
// Track streams and frees their requests), fixed flow-control windows, and
// a pool of stream workers reused across RPCs instead of a new goroutine
// per call.
func GRPCServerOptions(m *Metrics) []grpc.ServerOption {
	return append([]grpc.ServerOption{
		grpc.ChainUnaryInterceptor(m.UnaryInterceptor()),
		grpc.ChainStreamInterceptor(m.StreamInterceptor()),
	}, TransportOptions()...)
}

// TransportOptions are GRPCServerOptions without the metrics: keepalive
// pings (a connection cut without a FIN ends its streams, which frees their
// requests), fixed flow-control windows, stream workers reused across
// calls, the message size bound. A global router serving the local-router
// API for its subtree uses them too.
func TransportOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 20 * time.Second, Timeout: 10 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		grpc.InitialWindowSize(transportWindow),
		grpc.InitialConnWindowSize(transportWindow),
		grpc.NumStreamWorkers(uint32(runtime.GOMAXPROCS(0))),
		grpc.MaxRecvMsgSize(MaxRecvMsgBytes),
	}
}
