package gateway

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// The gateway's edges, as Envoy's HTTP connection manager has them
// (issue 27 item 3).
const (
	// DefaultMaxRequestHeadersBytes is Envoy's max_request_headers_kb
	// default, 60 KiB (envoyproxy/envoy
	// api/envoy/extensions/filters/network/http_connection_manager/v3/http_connection_manager.proto,
	// "max_request_headers_kb ... defaults to 60 KiB"): past it Envoy answers
	// 431, and so does the gateway. The size is Envoy's HeaderMap byte size:
	// every header's name and value (the request line's path included).
	DefaultMaxRequestHeadersBytes = 60 << 10
	// DefaultBodyTimeout bounds reading a request body from the client:
	// past it the gateway answers 408 (Envoy's request_timeout answer) and
	// ends the request. Envoy has no such timer by default (request_timeout
	// is off; stream_idle_timeout, 300 s, ends a silent stream); 2 minutes
	// lets a 16 MiB body through at 1 Mbit/s and stops a slowloris client.
	DefaultBodyTimeout = 2 * time.Minute
)

// headerBytes is r's headers' size as Envoy counts it.
func headerBytes(r *http.Request) int {
	n := len(r.Method) + len(r.URL.RequestURI()) + len(r.Host)
	for k, vs := range r.Header {
		for _, v := range vs {
			n += len(k) + len(v)
		}
	}
	return n
}

// tooLarge answers 431, as Envoy does past max_request_headers_kb (its
// details http1.headers_too_large), with a body that says so.
func tooLarge(w http.ResponseWriter, limit int) {
	w.Header().Set("content-type", "text/plain")
	w.Header().Set("connection", "close")
	w.WriteHeader(http.StatusRequestHeaderFieldsTooLarge)
	_, _ = io.WriteString(w, "request headers too large: over "+itoa(limit)+" bytes\n")
}

func itoa(n int) string {
	var b [20]byte
	i := len(b)
	for n >= 10 {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
	}
	i--
	b[i] = byte('0' + n)
	return string(b[i:])
}

// deadlineBody reads a request body under the body timeout: the
// connection's read deadline is set when the body starts and cleared when
// it ends, so the bound covers the body only, never the response (a
// generation may stream for minutes after its request).
type deadlineBody struct {
	io.ReadCloser
	rc       *http.ResponseController
	deadline time.Time
	timedOut atomic.Bool
	done     atomic.Bool
}

func newDeadlineBody(w http.ResponseWriter, body io.ReadCloser, d time.Duration) *deadlineBody {
	b := &deadlineBody{ReadCloser: body, rc: http.NewResponseController(w), deadline: time.Now().Add(d)}
	if err := b.rc.SetReadDeadline(b.deadline); err != nil {
		b.rc, b.deadline = nil, time.Time{} // not supported by this ResponseWriter: no bound
	}
	return b
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && !b.done.Load() {
		b.done.Store(true)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			b.timedOut.Store(true)
		} else if b.rc != nil {
			_ = b.rc.SetReadDeadline(time.Time{})
		}
	}
	return n, err
}

// boundBody puts r's body under the body timeout (nil: no body or no
// bound).
func (g *Gateway) boundBody(w http.ResponseWriter, r *http.Request) *deadlineBody {
	if g.bodyTime <= 0 || r.Body == nil || r.Body == http.NoBody {
		return nil
	}
	b := newDeadlineBody(w, r.Body, g.bodyTime)
	r.Body = b
	return b
}

// expired reports whether the body timeout ended the body (b may be nil):
// its read failed on the deadline, or the deadline passed with the body
// unfinished (the failing read cancels the request's context before it
// returns, so the exchange may see the end first).
func (b *deadlineBody) expired() bool {
	if b == nil {
		return false
	}
	return b.timedOut.Load() || (!b.done.Load() && !b.deadline.IsZero() && time.Now().After(b.deadline))
}

// bodyTimedOut answers 408 and logs the cause when b's timeout ended the
// exchange, and says so.
func (g *Gateway) bodyTimedOut(w http.ResponseWriter, r *http.Request, b *deadlineBody) bool {
	if !b.expired() {
		return false
	}
	// The timeout cancels the request's context too: not a client gone.
	g.warn(context.Background(), "request body timeout", "path", r.URL.Path, "timeout", g.bodyTime)
	requestTimeout(w)
	return true
}

// requestTimeout answers 408, as Envoy does when request_timeout fires.
func requestTimeout(w http.ResponseWriter) {
	w.Header().Set("content-type", "text/plain")
	w.Header().Set("connection", "close")
	w.WriteHeader(http.StatusRequestTimeout)
	_, _ = io.WriteString(w, "request body timeout\n")
}

// rateLog writes at most one warning a second per cause, saying how many
// were suppressed since; a request the client cancelled is not a warning
// (debug only).
type rateLog struct {
	mu    sync.Mutex
	last  map[string]time.Time
	count map[string]int
}

func (g *Gateway) warn(ctx context.Context, cause string, args ...any) {
	if ctx.Err() != nil {
		g.log.Debug(cause+" (client gone)", args...)
		return
	}
	l := &g.rate
	now := time.Now()
	l.mu.Lock()
	if l.last == nil {
		l.last, l.count = map[string]time.Time{}, map[string]int{}
	}
	if now.Sub(l.last[cause]) < time.Second {
		l.count[cause]++
		l.mu.Unlock()
		return
	}
	suppressed := l.count[cause]
	l.last[cause], l.count[cause] = now, 0
	l.mu.Unlock()
	g.log.Warn(cause, append(args, "suppressed_since_last", suppressed)...)
}
