package policies

import "slices"

// Reads is what of a Request a policy reads beyond its model, prompt
// length and candidates: the fields the global router fills from its
// request headers (x-kvgate-session-id, x-kvgate-priority,
// x-kvgate-ttft-ms, x-kvgate-itl-ms) and the headers a policy matches by
// name. The global router tells a caller when a header it sent is read
// by nothing of the running configuration (globalrouter/unreadhdr.go).
type Reads struct {
	Session, Priority, TTFT, ITL bool
	// Headers are the request headers read by name, lower-case.
	Headers []string
}

// Reader is implemented by the built-in policies that read any of Reads;
// a built-in policy that does not implement it reads none of them, and a
// policy registered from Go (not built in) may read any.
type Reader interface {
	Reads() Reads
}

var (
	_ Reader = SessionAffinity{}
	_ Reader = (*Priority)(nil)
	_ Reader = (*SLOGrid)(nil)
	_ Reader = (*HeaderMatch)(nil)
)

// Reads implements Reader.
func (SessionAffinity) Reads() Reads { return Reads{Session: true} }

// Reads implements Reader: the tiers and the shedding rule both order by
// priority.
func (*Priority) Reads() Reads { return Reads{Priority: true} }

// Reads implements Reader: the TTFT target with a prefill grid, the ITL
// target with a decode grid.
func (g *SLOGrid) Reads() Reads { return Reads{TTFT: g.prefill != nil, ITL: g.decode != nil} }

// Reads implements Reader: the headers of every pool's rules, sorted.
func (h *HeaderMatch) Reads() Reads {
	var out []string
	for _, rules := range h.rules {
		for name := range rules {
			if !slices.Contains(out, name) {
				out = append(out, name)
			}
		}
	}
	slices.Sort(out)
	return Reads{Headers: out}
}
