package kvevents

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/vmihailenco/msgpack/v5"
)

// EncodeEnginePayload encodes events as a vLLM KV event batch, the way
// current vLLM does: the batch as an array [ts, events, dp_rank], each event
// a tagged map ({"type": "BlockStored", …}) with integer block hashes and
// the event's medium (GPU, CPU, DISK, EXTERNAL); a lower-tier Stored whose
// blocks carry no token ids is sent with empty token_ids, as vLLM's
// offloading connector does. blockSize must divide every Stored block. The mocker
// publishes this on its ZMQ socket so the relay path is the real one.
func EncodeEnginePayload(ts float64, events []Event, dpRank uint32, blockSize int) ([]byte, error) {
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	w := &errWriter{enc: enc}
	w.do(enc.EncodeArrayLen(3))
	w.do(enc.EncodeFloat64(ts))
	w.do(enc.EncodeArrayLen(len(events)))
	for i, ev := range events {
		switch {
		case ev.Stored != nil:
			st := ev.Stored
			salted := st.CacheSalt != "" && len(st.Blocks) > 0
			if salted {
				w.do(enc.EncodeMapLen(9))
			} else {
				w.do(enc.EncodeMapLen(8))
			}
			w.str("type", "BlockStored")
			w.do(enc.EncodeString("block_hashes"))
			w.do(enc.EncodeArrayLen(len(st.Blocks)))
			n := 0
			byRef := medium(st.Medium) != "GPU" && len(st.Blocks) > 0 && len(st.Blocks[0].TokenIDs) == 0
			for _, b := range st.Blocks {
				w.do(enc.EncodeUint(b.EngineHash))
				n += len(b.TokenIDs)
				if byRef && len(b.TokenIDs) == 0 {
					continue
				}
				if len(b.TokenIDs) != blockSize {
					return nil, fmt.Errorf("%w: event %d: block of %d tokens, block size %d", ErrInvalidEvent, i, len(b.TokenIDs), blockSize)
				}
			}
			w.do(enc.EncodeString("parent_block_hash"))
			if st.ParentHash == nil {
				w.do(enc.EncodeNil())
			} else {
				w.do(enc.EncodeUint(*st.ParentHash))
			}
			w.do(enc.EncodeString("token_ids"))
			w.do(enc.EncodeArrayLen(n))
			for _, b := range st.Blocks {
				for _, t := range b.TokenIDs {
					w.do(enc.EncodeUint(uint64(t)))
				}
			}
			w.do(enc.EncodeString("block_size"))
			w.do(enc.EncodeInt(int64(blockSize)))
			w.do(enc.EncodeString("lora_id"))
			w.do(enc.EncodeNil())
			w.str("medium", medium(st.Medium))
			w.do(enc.EncodeString("lora_name"))
			if st.LoRAName == "" {
				w.do(enc.EncodeNil())
			} else {
				w.do(enc.EncodeString(st.LoRAName))
			}
			if salted {
				encodeSaltKeys(w, st)
			}
		case ev.Removed != nil:
			w.do(enc.EncodeMapLen(3))
			w.str("type", "BlockRemoved")
			w.do(enc.EncodeString("block_hashes"))
			w.do(enc.EncodeArrayLen(len(ev.Removed.EngineHashes)))
			for _, h := range ev.Removed.EngineHashes {
				w.do(enc.EncodeUint(h))
			}
			w.str("medium", medium(ev.Removed.Medium))
		case ev.Cleared:
			w.do(enc.EncodeMapLen(1))
			w.str("type", "AllBlocksCleared")
		default:
			return nil, fmt.Errorf("%w: event %d is empty", ErrInvalidEvent, i)
		}
	}
	w.do(enc.EncodeUint(uint64(dpRank)))
	if w.err != nil {
		return nil, w.err
	}
	return buf.Bytes(), nil
}

// encodeSaltKeys writes a salted store's extra_keys as vLLM does
// (vllm/v1/core/kv_cache_utils.py generate_block_hash_extra_keys at
// vllm-project/vllm@bbf906a88ba1a39104884c88c9811a4f968e4659: the
// cache_salt is an extra key of the request's first block only, the one
// with no parent): [salt] for a chain's first block, nil for the others
// (their salt is the parent's, which the decoder remembers).
func encodeSaltKeys(w *errWriter, st *Stored) {
	enc := w.enc
	w.do(enc.EncodeString("extra_keys"))
	w.do(enc.EncodeArrayLen(len(st.Blocks)))
	for i := range st.Blocks {
		if i == 0 && st.ParentHash == nil {
			w.do(enc.EncodeArrayLen(1))
			w.do(enc.EncodeString(st.CacheSalt))
		} else {
			w.do(enc.EncodeNil())
		}
	}
}

// medium is the vLLM medium of a kvgate event's medium: GPU for device
// memory, CPU, DISK or EXTERNAL for the lower tiers.
func medium(m string) string {
	t, _ := TierOf(m)
	if t == TierGPU {
		return "GPU"
	}
	return strings.ToUpper(t.String())
}

// EngineFrames returns the three ZMQ frames of a vLLM event message.
func EngineFrames(topic string, seq uint64, payload []byte) [][]byte {
	s := make([]byte, 8)
	binary.BigEndian.PutUint64(s, seq)
	return [][]byte{[]byte(topic), s, payload}
}

type errWriter struct {
	enc *msgpack.Encoder
	err error
}

func (w *errWriter) do(err error) {
	if w.err == nil {
		w.err = err
	}
}

func (w *errWriter) str(k, v string) {
	w.do(w.enc.EncodeString(k))
	w.do(w.enc.EncodeString(v))
}
