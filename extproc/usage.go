package extproc

import (
	"bytes"
	"encoding/json"
)

// Usage is an OpenAI response's token usage.
type Usage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
}

// usageOf reads the usage object of one OpenAI response or stream chunk;
// ok is false when there is none.
func usageOf(data []byte) (u Usage, ok bool) {
	if !bytes.Contains(data, []byte(`"usage"`)) {
		return Usage{}, false
	}
	var v struct {
		Usage *Usage `json:"usage"`
	}
	if json.Unmarshal(data, &v) != nil || v.Usage == nil {
		return Usage{}, false
	}
	return *v.Usage, true
}

// sseParser reads a text/event-stream body fed in arbitrary chunks (a line,
// even a UTF-8 sequence, may be split between chunks) and hands each
// event's data to onEvent. Lines end at LF, CRLF or CR, as the SSE grammar
// says. A line longer than maxLine is dropped rather than buffered without
// bound. Not safe for concurrent use.
type sseParser struct {
	maxLine int
	onEvent func(data []byte)

	line     []byte // the current, unfinished line
	skipping bool   // the current line overflowed maxLine
	dropping bool   // the current event's data overflowed maxLine
	lastCR   bool   // the previous chunk ended in CR: a leading LF is part of it
	data     []byte // data lines of the current event, joined by LF
	hasData  bool
}

func newSSEParser(maxLine int, onEvent func([]byte)) *sseParser {
	return &sseParser{maxLine: maxLine, onEvent: onEvent}
}

// Write feeds one chunk.
func (p *sseParser) Write(b []byte) {
	if len(b) == 0 {
		return
	}
	if p.lastCR && len(b) > 0 && b[0] == '\n' {
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
// prefers a truncated stream's last usage to none.
func (p *sseParser) Close() {
	if len(p.line) > 0 || p.skipping {
		p.endLine()
	}
	p.lastCR = false
	p.dispatch()
}

func (p *sseParser) appendLine(b []byte) {
	if p.skipping {
		return
	}
	if len(p.line)+len(b) > p.maxLine {
		p.line, p.skipping = p.line[:0], true
		return
	}
	p.line = append(p.line, b...)
}

func (p *sseParser) endLine() {
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
		return // event, id, retry: nothing the router needs
	}
	if p.dropping {
		return
	}
	if len(p.data)+1+len(value) > p.maxLine {
		// An event of many data lines past the bound (only a broken or
		// hostile upstream sends one): dropped whole, like a long line.
		p.data, p.hasData, p.dropping = p.data[:0], false, true
		return
	}
	if p.hasData {
		p.data = append(p.data, '\n')
	}
	p.data = append(p.data, value...)
	p.hasData = true
}

func (p *sseParser) dispatch() {
	p.dropping = false
	if !p.hasData {
		return
	}
	data := p.data
	p.data, p.hasData = p.data[:0], false
	p.onEvent(data)
}
