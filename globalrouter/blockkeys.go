package globalrouter

import (
	"github.com/kvgate/kvgate/kvevents"
	"github.com/kvgate/kvgate/tokenizer"
)

// MediaEncoder is a Tokenizer that also places a chat's media parts in
// the ids it returns (*tokenizer.Model implements it; see
// tokenizer.Model.EncodeChatMedia). Safe for concurrent use.
type MediaEncoder interface {
	EncodeChatMedia(req *tokenizer.ChatRequest) ([]uint32, []tokenizer.MediaSpan, error)
}

// EncodeChat returns the ids the router hashes for a chat and the
// multimodal items its block keys carry: each media part's content hash
// (ChatRequest.MMHashes) mapped with kvevents.MMHash, over the part's
// placeholder tokens. The mapping is the one the event decoder applies to
// the item identifiers in an engine's extra_keys, so a request's item
// and an engine's stored item are one key exactly when the engine's
// identifier is the request's content hash (a client-given uuid, or the
// SHA-256 a frontend passes as the item's uuid); hashing the hex digest
// differently (say, taking its first 8 bytes) would give one image two
// keys. A tokenizer that cannot place media (not a MediaEncoder) gets
// every item over the whole prompt: different media never match.
func EncodeChat(tok Tokenizer, chat *tokenizer.ChatRequest) ([]uint32, []kvevents.MMSpan, error) {
	if len(chat.MMHashes) == 0 {
		ids, err := tok.EncodeChat(chat)
		return ids, nil, err
	}
	me, ok := tok.(MediaEncoder)
	if !ok {
		ids, err := tok.EncodeChat(chat)
		if err != nil {
			return nil, nil, err
		}
		mm := make([]kvevents.MMSpan, len(chat.MMHashes))
		for i, h := range chat.MMHashes {
			mm[i] = kvevents.MMSpan{Hash: kvevents.MMHash(h), Length: len(ids)}
		}
		return ids, mm, nil
	}
	ids, spans, err := me.EncodeChatMedia(chat)
	if err != nil {
		return nil, nil, err
	}
	return ids, MMSpans(spans), nil
}

// MMSpans maps media spans to the multimodal items of block keys.
func MMSpans(spans []tokenizer.MediaSpan) []kvevents.MMSpan {
	if len(spans) == 0 {
		return nil
	}
	mm := make([]kvevents.MMSpan, len(spans))
	for i, s := range spans {
		mm[i] = kvevents.MMSpan{Hash: kvevents.MMHash(s.Hash), Offset: s.Offset, Length: s.Length}
	}
	return mm
}

// BlockKeys returns the local block hashes of a request's ids at
// blockSize: seeded by the adapter and the request's cache_salt
// (kvevents.ChainSeed, as Dynamo and the engines' events), multimodal
// items in the blocks they overlap. The index matches them against the
// engine's stored blocks, whose salt and items come from extra_keys.
func BlockKeys(tokens []uint32, blockSize int, lora, salt string, mm []kvevents.MMSpan) ([]uint64, error) {
	return kvevents.RequestHashes(tokens, blockSize, lora, salt, mm)
}
