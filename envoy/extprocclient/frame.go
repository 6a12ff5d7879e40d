package extprocclient

import (
	"strconv"

	"google.golang.org/protobuf/types/known/structpb"
)

// FrameKind says what a Frame carries.
type FrameKind int

// Frame kinds, in the order HTTP sends them in one direction.
const (
	FrameHeaders FrameKind = iota + 1
	FrameData
	FrameTrailers
)

func (k FrameKind) String() string {
	switch k {
	case FrameHeaders:
		return "headers"
	case FrameData:
		return "data"
	case FrameTrailers:
		return "trailers"
	}
	return "frame(" + strconv.Itoa(int(k)) + ")"
}

// Frame is one codec event of one direction: headers, a data chunk, or
// trailers. Trailers always end the direction.
type Frame struct {
	Kind      FrameKind
	Headers   Headers // FrameHeaders, FrameTrailers
	Data      []byte  // FrameData
	EndStream bool    // FrameHeaders, FrameData: nothing follows
}

// LocalReply is a reply the filter sent itself (Envoy's sendLocalReply).
type LocalReply struct {
	Status  int
	Headers Headers // without :status
	Body    []byte
	// Details is what Envoy puts in %RESPONSE_CODE_DETAILS%, e.g.
	// "ext_proc_error_per-message_timeout_exceeded".
	Details string
}

// Info is what the filter recorded for one request.
type Info struct {
	// DynamicMetadata is the request's dynamic metadata after the filter:
	// the initial metadata plus what the server wrote into receiving
	// namespaces.
	DynamicMetadata map[string]*structpb.Struct
	// RouteCacheCleared reports an honoured clear_route_cache.
	RouteCacheCleared bool
	// ClearRouteCacheIgnored counts clear_route_cache requests Envoy ignores
	// (response path, no header mutation in the same response, disabled).
	ClearRouteCacheIgnored int
	// RejectedMutations counts header mutations refused by the mutation
	// rules and ignored (Envoy's rejected_header_mutations).
	RejectedMutations int
	// MetadataNamespacesIgnored counts dynamic metadata namespaces dropped
	// because they are not receiving namespaces.
	MetadataNamespacesIgnored int
	// SpuriousMessages counts out-of-order or unexpected server messages.
	SpuriousMessages int
	// MessagesSent counts ProcessingRequests sent; zero means no gRPC
	// stream was opened at all.
	MessagesSent int
	// LocalReply is set when the filter answered the request itself.
	LocalReply *LocalReply
}

type direction int

const (
	dirRequest direction = iota
	dirResponse
)

func (d direction) String() string {
	if d == dirRequest {
		return "request"
	}
	return "response"
}

// callbackState is ProcessorState's CallbackState: which reply the filter
