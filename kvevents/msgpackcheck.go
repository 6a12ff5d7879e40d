package kvevents

import "fmt"

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
