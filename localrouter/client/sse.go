package client

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
)

// maxSSELine bounds one SSE line (a generous bound for one chunk of JSON).
const maxSSELine = 4 << 20

// sseReader reads the data of Server-Sent Events: each event's data lines
// joined by "\n". Comments, other fields and events without data are
// skipped. Lines may end in \n, \r\n or \r.
type sseReader struct {
	sc   *bufio.Scanner
	data bytes.Buffer
}

func newSSEReader(r io.Reader) *sseReader {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxSSELine)
	sc.Split(scanSSELines)
	return &sseReader{sc: sc}
}

var errSSELineTooLong = errors.New("sse: line too long")

// scanSSELines splits at \r\n, \n or \r.
func scanSSELines(data []byte, atEOF bool) (advance int, token []byte, err error) {
	if atEOF && len(data) == 0 {
		return 0, nil, nil
	}
	if i := bytes.IndexAny(data, "\r\n"); i >= 0 {
		if data[i] == '\n' {
			return i + 1, data[:i], nil
		}
		if i+1 < len(data) {
			if data[i+1] == '\n' {
				return i + 2, data[:i], nil
			}
			return i + 1, data[:i], nil
		}
		if atEOF {
			return i + 1, data[:i], nil
		}
		return 0, nil, nil // a \r at the end: is a \n next?
	}
	if atEOF {
		return len(data), data, nil
	}
	return 0, nil, nil
}

// next returns the data of the next event. At the end of the stream it
// returns the pending event if any, then io.EOF.
func (s *sseReader) next() ([]byte, error) {
	s.data.Reset()
	has := false
	for s.sc.Scan() {
		line := s.sc.Bytes()
		if len(line) == 0 {
			if has {
				return s.data.Bytes(), nil
			}
			continue
		}
		if line[0] == ':' {
			continue
		}
		field, value, _ := bytes.Cut(line, []byte(":"))
		if string(field) != "data" {
			continue
		}
		value = bytes.TrimPrefix(value, []byte(" "))
		if has {
			s.data.WriteByte('\n')
		}
		s.data.Write(value)
		has = true
	}
	if err := s.sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, errSSELineTooLong
		}
		return nil, fmt.Errorf("sse: %w", err)
	}
	if has {
		return s.data.Bytes(), nil
	}
	return nil, io.EOF
}
