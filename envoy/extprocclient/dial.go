package extprocclient

import "google.golang.org/grpc"

// EnvoyHTTP2Window is Envoy's default HTTP/2 flow-control window, stream
// and connection alike (initial_stream_window_size and
// initial_connection_window_size in api/envoy/config/core/v3/protocol.proto:
// "defaults to 268435456 (256 * 1024 * 1024)"). Envoy's gRPC client to an
// ext_proc server runs with it unless the cluster says otherwise.
const EnvoyHTTP2Window = 256 << 20

// DialOptions are the gRPC dial options that make a grpc-go connection to an
// ext_proc server behave, on the wire, as Envoy's does by default: fixed
// 256 MiB windows and so no bandwidth-delay-product probing (grpc-go turns
// its BDP pings off once a window is set; Envoy sends none). Callers add
// their transport credentials.
func DialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithInitialWindowSize(EnvoyHTTP2Window),
		grpc.WithInitialConnWindowSize(EnvoyHTTP2Window),
	}
}
