// Package sse parses text/event-stream bodies (Server-Sent Events, the
// grammar of the HTML standard) for the data the OpenAI streaming API puts
// in them: each event's data lines, joined by LF. Comments and the event,
// id and retry fields are skipped; lines end at LF, CRLF or CR.
//
// Parser is fed a body in arbitrary chunks (a line, even a CRLF or a UTF-8
// sequence, may be split between chunks) and hands each event's data to a
// callback; Reader pulls events from an io.Reader. Both bound the memory
// one event may take: a line, or an event's joined data, longer than the
// bound is dropped by a Parser (counted in Dropped) and is an error
// (ErrTooLong) for a Reader.
package sse

import (
	"bytes"
	"errors"
	"fmt"
	"io"
)

// Parser reads a text/event-stream body fed in chunks. It is not safe for
// concurrent use.
type Parser struct {
	max     int
	onEvent func(data []byte)
	dropped int

	line     []byte // the current, unfinished line
	skipping bool   // the current line overflowed max
	dropping bool   // the current event's data overflowed max
	lastCR   bool   // the previous chunk ended in CR: a leading LF is part of it
	data     []byte // data lines of the current event, joined by LF
	hasData  bool
}

// NewParser returns a Parser that calls onEvent with each event's data;
// the slice is valid only during the call. A line or an event's data
// longer than max bytes is dropped.
func NewParser(max int, onEvent func(data []byte)) *Parser {
	return &Parser{max: max, onEvent: onEvent}
}

// Dropped is the number of lines and events dropped so far for exceeding
// the bound.
func (p *Parser) Dropped() int { return p.dropped }

// Write feeds one chunk.
func (p *Parser) Write(b []byte) {
	if len(b) == 0 {
		return
	}
	if p.lastCR && b[0] == '\n' {
		b = b[1:]
	}
	p.lastCR = false
	for len(b) > 0 {
		i := bytes.IndexAny(b, "\r\n")
		if i < 0 {
			p.appendLine(b)
			return
		}
		p.appendLine(b[:i])
		p.endLine()
		if b[i] == '\r' {
			if i+1 == len(b) {
				p.lastCR = true
				return
			}
			if b[i+1] == '\n' {
				i++
			}
		}
		b = b[i+1:]
	}
}

// Close ends the stream. Unlike a browser, which drops an event cut short
// by the end of the stream, the parser still dispatches it: usage counting
// prefers a truncated stream's last usage to none, and a client reading
// a stream whose final blank line is missing still gets its last event.
func (p *Parser) Close() {
	if len(p.line) > 0 || p.skipping {
		p.endLine()
	}
	p.lastCR = false
	p.dispatch()
}

func (p *Parser) appendLine(b []byte) {
	if p.skipping {
		return
	}
	if len(p.line)+len(b) > p.max {
		p.line, p.skipping = p.line[:0], true
		p.dropped++
		return
	}
	p.line = append(p.line, b...)
}

func (p *Parser) endLine() {
	line, skipped := p.line, p.skipping
	p.line, p.skipping = p.line[:0], false
	switch {
	case skipped:
		return
	case len(line) == 0:
		p.dispatch()
		return
	case line[0] == ':':
		return // comment
	}
	field, value := line, []byte(nil)
	if i := bytes.IndexByte(line, ':'); i >= 0 {
		field, value = line[:i], line[i+1:]
		if len(value) > 0 && value[0] == ' ' {
			value = value[1:]
		}
	}
	if string(field) != "data" {
		return // event, id, retry: nothing the callers need
	}
	if p.dropping {
		return
	}
	if len(p.data)+1+len(value) > p.max {
		// An event of many data lines past the bound (only a broken or
		// hostile upstream sends one): dropped whole, like a long line.
		p.data, p.hasData, p.dropping = p.data[:0], false, true
		p.dropped++
		return
	}
	if p.hasData {
		p.data = append(p.data, '\n')
	}
	p.data = append(p.data, value...)
	p.hasData = true
}

func (p *Parser) dispatch() {
	p.dropping = false
	if !p.hasData {
		return
	}
	data := p.data
	p.data, p.hasData = p.data[:0], false
	p.onEvent(data)
}

// ErrTooLong is a Reader's error for a line or an event's data over its
// bound.
var ErrTooLong = errors.New("sse: line too long")

// readSize is how much a Reader asks of its io.Reader at a time.
const readSize = 32 << 10

// Reader pulls events from an io.Reader. It is not safe for concurrent
// use.
type Reader struct {
	r     io.Reader
	p     *Parser
	buf   []byte
	arena []byte // queued events' data, back to back
	ends  []int  // end offset in arena of each queued event
	next  int    // index in ends of the next event to return
	err   error  // the error to return once the queue is empty
}

// NewReader returns a Reader of r's events, each line and event at most
// max bytes.
func NewReader(r io.Reader, max int) *Reader {
	rd := &Reader{r: r}
	rd.p = NewParser(max, rd.queue)
	return rd
}

func (r *Reader) queue(data []byte) {
	if r.p.dropped > 0 {
		return // past an overflow: the stream is broken from here
	}
	r.arena = append(r.arena, data...)
	r.ends = append(r.ends, len(r.arena))
}

// Next returns the data of the next event, valid until the next call. At
// the end of the stream it returns the pending event if any, then io.EOF;
// a line or an event over the bound gives ErrTooLong (after the events
// before it), a read error is returned wrapped.
func (r *Reader) Next() ([]byte, error) {
	for {
		if r.next < len(r.ends) {
			start := 0
			if r.next > 0 {
				start = r.ends[r.next-1]
			}
			d := r.arena[start:r.ends[r.next]]
			r.next++
			return d, nil
		}
		r.arena, r.ends, r.next = r.arena[:0], r.ends[:0], 0
		if r.err != nil {
			return nil, r.err
		}
		if r.buf == nil {
			r.buf = make([]byte, readSize)
		}
		n, err := r.r.Read(r.buf)
		r.p.Write(r.buf[:n])
		switch {
		case r.p.dropped > 0:
			r.err = ErrTooLong
		case errors.Is(err, io.EOF):
			r.p.Close()
			if r.p.dropped > 0 {
				r.err = ErrTooLong
			} else {
				r.err = io.EOF
			}
		case err != nil:
			r.err = fmt.Errorf("sse: %w", err)
		}
	}
}
