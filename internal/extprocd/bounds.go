package extprocd

import (
	"github.com/kvgate/kvgate/extproc"
	"github.com/kvgate/kvgate/lib/config"
)

// BoundsFlags registers the ext_proc stream bounds (extproc/bounds.go) on
// fs, into c: -max-streams, -stream-request-timeout, -stream-idle-timeout.
// kvgate extproc and kvgate up share them. An unset field takes the
// default; a negative one turns the bound off.
func BoundsFlags(fs *config.FlagSet, c *extproc.Config) {
	if c.MaxStreams == 0 {
		c.MaxStreams = extproc.DefaultMaxStreams
	}
	if c.RequestTimeout == 0 {
		c.RequestTimeout = extproc.DefaultRequestTimeout
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = extproc.DefaultIdleTimeout
	}
	fs.IntVar(&c.MaxStreams, "max-streams", c.MaxStreams,
		"concurrent ext_proc streams (one per HTTP request in flight); a new stream past it is refused with RESOURCE_EXHAUSTED (0: the default; negative: no bound)")
	fs.DurationVar(&c.RequestTimeout, "stream-request-timeout", c.RequestTimeout,
		"longest time from an ext_proc stream's open to its complete request (headers, and the body when routed); the stream then ends and frees its load (0: the default; negative: no bound)")
	fs.DurationVar(&c.IdleTimeout, "stream-idle-timeout", c.IdleTimeout,
		"longest time an ext_proc stream may receive nothing before its response starts (never applies to a response in progress: a generation streams for minutes); the stream then ends and frees its router load (0: the default; negative: no bound)")
}
