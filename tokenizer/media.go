package tokenizer

import (
	"strings"
)

// MediaSpan places one media part of a chat in the chat's token ids: its
// placeholder tokens are ids[Offset : Offset+Length], and Hash is the
// part's content hash (ChatRequest.MMHashes).
type MediaSpan struct {
	Hash           string
	Offset, Length int
}

// EncodeChatMedia is EncodeChat that also places the request's media
// parts (req.MMHashes, in order) in the ids it returns, for block keys
// that tell different media behind the same placeholder tokens apart (as
// vLLM's extra_keys do). A request without media gets EncodeChat's ids
// and no spans.
//
// The local backends find each placeholder (DefaultImagePlaceholder,
// DefaultAudioPlaceholder) in the rendered text and take the tokens of the
// segments it lies in: exactly the placeholder's tokens when the model has
// it as an added token (which is how vision models' tokenizers have it),
// otherwise the placeholder's tokens plus the text they are merged with.
// Where the media cannot be placed one by one (the remote backend, whose
// engine renders the text; placeholders that the template dropped or
// that a text part wrote too), every part spans from the first
// placeholder found (the start, if none) to the end: the text before it
// still matches, and different media never do. Safe for concurrent use.
func (m *Model) EncodeChatMedia(req *ChatRequest) ([]uint32, []MediaSpan, error) {
	if len(req.MMHashes) == 0 {
		ids, err := m.EncodeChat(req)
		return ids, nil, err
	}
	var (
		ids   []uint32
		found []tokenRange // the placeholders' tokens, in text order
	)
	switch tok := m.tok.(type) {
	case *remote:
		var err error
		if ids, err = tok.encodeChat(req); err != nil {
			return nil, nil, err
		}
	case estimate:
		text := sanitizeUTF8(estimateChatText(req))
		ids, _ = tok.Encode(text)
		for _, p := range placeholders(text) {
			// Each 4-byte chunk is a token.
			found = append(found, tokenRange{p.from / 4, (p.to + 3) / 4})
		}
	default:
		text, err := m.RenderChat(req)
		if err != nil {
			return nil, nil, err
		}
		seg, ok := tok.(segmenter)
		if !ok {
			if ids, err = tok.Encode(text); err != nil {
				return nil, nil, err
			}
			break
		}
		// The segments' ids, concatenated, are the text's ids (as the chat
		// cache relies on); each segment's token range is known as it is
		// encoded. No cache: a media request is rarely repeated whole.
		text = sanitizeUTF8(text)
		ph := placeholders(text)
		ids = make([]uint32, 0, len(text)/3+1)
		var segs []segment
		seg.segments(text, func(s segment) { segs = append(segs, s) })
		k := 0 // the first placeholder not wholly behind
		for i, s := range segs {
			// Segments are contiguous: each ends where the next starts (an
			// added token's segment carries no text).
			from, to := s.start, len(text)
			if i+1 < len(segs) {
				to = segs[i+1].start
			}
			t0 := len(ids)
			ids = seg.appendSegment(ids, s)
			t1 := len(ids)
			for j := k; j < len(ph) && ph[j].from < to; j++ {
				switch {
				case ph[j].to <= from:
				case j < len(found):
					found[j].to = t1 // runs on from an earlier segment
				case j == len(found):
					found = append(found, tokenRange{t0, t1})
				}
			}
			for k < len(ph) && ph[k].to <= to {
				k++
			}
		}
	}
	m.count(ids)
	return ids, mediaSpans(req.MMHashes, found, len(ids)), nil
}

// tokenRange is ids[from:to] (or bytes, in placeholders' answer).
type tokenRange struct{ from, to int }

// placeholders returns the byte ranges of the media placeholders in text,
// in order.
func placeholders(text string) []tokenRange {
	var out []tokenRange
	for off := 0; off < len(text); {
		i := strings.IndexByte(text[off:], '<')
		if i < 0 {
			break
		}
		at := off + i
		rest := text[at:]
		switch {
		case strings.HasPrefix(rest, DefaultImagePlaceholder):
			out = append(out, tokenRange{at, at + len(DefaultImagePlaceholder)})
			off = at + len(DefaultImagePlaceholder)
		case strings.HasPrefix(rest, DefaultAudioPlaceholder):
			out = append(out, tokenRange{at, at + len(DefaultAudioPlaceholder)})
			off = at + len(DefaultAudioPlaceholder)
		default:
			off = at + 1
		}
	}
	return out
}

// mediaSpans pairs the media hashes with the placeholder runs found: one
// by one when there are as many runs as hashes; otherwise every hash
// spans from the first run (0 if none) to the end of n ids.
func mediaSpans(hashes []string, found []tokenRange, n int) []MediaSpan {
	out := make([]MediaSpan, len(hashes))
	if len(found) == len(hashes) {
		for i, h := range hashes {
			out[i] = MediaSpan{Hash: h, Offset: found[i].from, Length: found[i].to - found[i].from}
		}
		return out
	}
	from := 0
	if len(found) > 0 {
		from = found[0].from
	}
	for i, h := range hashes {
		out[i] = MediaSpan{Hash: h, Offset: from, Length: n - from}
	}
	return out
}
