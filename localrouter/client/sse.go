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
	r    *bufio.Reader
	data bytes.Buffer
	line []byte
}

func newSSEReader(r io.Reader) *sseReader { return &sseReader{r: bufio.NewReaderSize(r, 64<<10)} }

var errSSELineTooLong = errors.New("sse: line too long")

// readLine returns the next line without its terminator; io.EOF after the
// last one.
func (s *sseReader) readLine() ([]byte, error) {
	s.line = s.line[:0]
	for {
		b, err := s.r.ReadSlice('\n')
		s.line = append(s.line, b...)
		if len(s.line) > maxSSELine {
			return nil, errSSELineTooLong
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err != nil {
			if errors.Is(err, io.EOF) && len(s.line) > 0 {
				break
			}
			return nil, err
		}
		break
	}
	line := bytes.TrimSuffix(s.line, []byte("\n"))
	return bytes.TrimSuffix(line, []byte("\r")), nil
}

// next returns the data of the next event. At the end of the stream it
// returns the pending event if any, then io.EOF.
func (s *sseReader) next() ([]byte, error) {
	s.data.Reset()
	has := false
	for {
		line, err := s.readLine()
		if err != nil {
			if errors.Is(err, io.EOF) && has {
				return s.data.Bytes(), nil
			}
			if errors.Is(err, io.EOF) {
				return nil, io.EOF
			}
			return nil, fmt.Errorf("sse: %w", err)
		}
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
}
