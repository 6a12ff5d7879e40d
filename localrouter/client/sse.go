package client

import (
	"io"

	"github.com/kvgate/kvgate/lib/sse"
)

// maxSSELine bounds one SSE line and one event's data (a generous bound
// for one chunk of JSON).
const maxSSELine = 4 << 20

var errSSELineTooLong = sse.ErrTooLong

// sseReader reads the data of Server-Sent Events (lib/sse): each
// event's data lines joined by "\n".
type sseReader struct{ r *sse.Reader }

func newSSEReader(r io.Reader) *sseReader {
	return &sseReader{sse.NewReader(r, maxSSELine)}
}

// next returns the data of the next event. At the end of the stream it
// returns the pending event if any, then io.EOF.
func (s *sseReader) next() ([]byte, error) { return s.r.Next() }
