package kvevents

import (
	"errors"
	"fmt"
)

// CheckMsgpack reports an error if b is not one well-formed msgpack value
// whose every array, map, string and binary length fits in b. Decoders of
// outside msgpack (events from NATS, replica-sync messages) call it first:
// msgpack (v5.4) allocates a slice at whatever length its header claims,
// so a few crafted bytes could otherwise ask for gigabytes.
func CheckMsgpack(b []byte) error {
	if err := checkMsgpackLengths(b); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidEvent, err)
	}
	return nil
}

// checkMsgpackLengths checks that b starts with one complete msgpack value
// in which no array, map, string or binary claims more elements or bytes
// than b has left. msgpack (v5.4) allocates a decoded slice at the length
// its header claims, so a few crafted bytes could otherwise ask for
// gigabytes; after this check the allocation is bounded by len(b). It
// walks the value without recursion, so nesting cannot exhaust the stack.
func checkMsgpackLengths(b []byte) error {
	i, pending := 0, 1 // values still to read
	// open[k] is how many values the k-th open container still holds; its
	// length is the nesting depth, bounded because msgpack decoders skip
	// unknown values recursively (a deep enough nest overflows the stack,
	// a fatal error no recover catches).
	open := make([]int, 1, 8)
	open[0] = 1
	length := func(size int) (int, error) {
		if len(b)-i < size {
			return 0, errors.New("msgpack truncated")
		}
		var n uint64
		for _, c := range b[i : i+size] {
			n = n<<8 | uint64(c)
		}
		i += size
		if n > uint64(len(b)) {
			return 0, fmt.Errorf("msgpack length %d exceeds the %d-byte message", n, len(b))
		}
		return int(n), nil
	}
	for pending > 0 {
		if i >= len(b) {
			return errors.New("msgpack truncated")
		}
		for open[len(open)-1] == 0 {
			open = open[:len(open)-1]
		}
		open[len(open)-1]--
		c := b[i]
		i++
		pending--
		var children, skip int // values inside, bytes to pass over
		var err error
		switch {
		case c <= 0x7f, c >= 0xe0, c == 0xc0, c == 0xc2, c == 0xc3: // fixints, nil, bools
		case c <= 0x8f:
			children = 2 * int(c&0x0f)
		case c <= 0x9f:
			children = int(c & 0x0f)
		case c <= 0xbf:
			skip = int(c & 0x1f)
		case c == 0xcc, c == 0xd0:
			skip = 1
		case c == 0xcd, c == 0xd1:
			skip = 2
		case c == 0xca, c == 0xce, c == 0xd2:
			skip = 4
		case c == 0xcb, c == 0xcf, c == 0xd3:
			skip = 8
		case c >= 0xd4 && c <= 0xd8: // fixext 1, 2, 4, 8, 16 and a type byte
			skip = 1 + 1<<(c-0xd4)
		case c == 0xc4, c == 0xd9:
			skip, err = length(1)
		case c == 0xc5, c == 0xda:
			skip, err = length(2)
		case c == 0xc6, c == 0xdb:
			skip, err = length(4)
		case c >= 0xc7 && c <= 0xc9: // ext 8, 16, 32 and a type byte
			skip, err = length(1 << (c - 0xc7))
			skip++
		case c == 0xdc:
			children, err = length(2)
		case c == 0xdd:
			children, err = length(4)
		case c == 0xde:
			children, err = length(2)
			children *= 2
		case c == 0xdf:
			children, err = length(4)
			children *= 2
		default: // 0xc1, never used
			return fmt.Errorf("msgpack code %#x", c)
		}
		if err != nil {
			return err
		}
		if skip > len(b)-i {
			return errors.New("msgpack truncated")
		}
		i += skip
		// Every value takes at least one byte.
		if pending += children; pending > len(b)-i {
			return fmt.Errorf("msgpack claims %d more values in %d bytes", pending, len(b)-i)
		}
		if children > 0 {
			if len(open) > MaxMsgpackDepth {
				return fmt.Errorf("msgpack nested deeper than %d", MaxMsgpackDepth)
			}
			open = append(open, children)
		}
	}
	return nil
}

// MaxMsgpackDepth bounds the nesting of msgpack kvgate accepts from outside
// (its own messages nest about 6 deep; vLLM's event batches about 5).
const MaxMsgpackDepth = 64
