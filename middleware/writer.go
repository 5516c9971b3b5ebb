package middleware

import (
	"bufio"
	"net"
	"net/http"
)

// The handler of a settled rule gets the recorder in a type that has the optional
// interfaces of the writer it wraps, and no others: http.Flusher and http.Hijacker when
// http.ResponseController reaches a flush or a hijack through that writer (directly or
// through its Unwrap), http.Pusher when that writer is one (ResponseController has no
// push). A handler that asks w.(http.Flusher) under http.TimeoutHandler, which cannot
// flush, or w.(http.Hijacker) on HTTP/2, which cannot hijack, gets the answer it gets
// without the middleware. io.ReaderFrom is always there: without one below, a copy goes
// through Write, as io.Copy would do it. Every type is one pointer: boxed in an
// http.ResponseWriter, it allocates nothing.
type (
	recF   struct{ *recorder }
	recH   struct{ *recorder }
	recFH  struct{ *recorder }
	recP   struct{ *recorder }
	recFP  struct{ *recorder }
	recHP  struct{ *recorder }
	recFHP struct{ *recorder }
)

// writer returns rec as the handler's writer.
func (rec *recorder) writer() http.ResponseWriter {
	w := rec.ResponseWriter
	_, push := w.(http.Pusher)
	switch flush, hijack := reaches(w, canFlush), reaches(w, canHijack); {
	case flush && hijack && push:
		return recFHP{rec}
	case flush && hijack:
		return recFH{rec} // HTTP/1
	case flush && push:
		return recFP{rec} // HTTP/2
	case hijack && push:
		return recHP{rec}
	case flush:
		return recF{rec}
	case hijack:
		return recH{rec}
	case push:
		return recP{rec} // http.TimeoutHandler's writer
	}
	return rec
}

// maxUnwrap bounds the walk down a chain of Unwrap methods, against a writer that
// unwraps to itself.
const maxUnwrap = 64

// reaches reports whether has(w) holds for w or for a writer that w's Unwrap reaches,
// as http.ResponseController looks for a method.
func reaches(w http.ResponseWriter, has func(http.ResponseWriter) bool) bool {
	for range maxUnwrap {
		if has(w) {
			return true
		}
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return false
		}
		w = u.Unwrap()
	}
	return false
}

func canFlush(w http.ResponseWriter) bool {
	switch w.(type) {
	case http.Flusher, interface{ FlushError() error }:
		return true
	}
	return false
}

func canHijack(w http.ResponseWriter) bool {
	_, ok := w.(http.Hijacker)
	return ok
}

// flush passes a flush on, as http.ResponseController does: through the wrapped
// writers' Unwrap.
func (rec *recorder) flush() error {
	return http.NewResponseController(rec.ResponseWriter).Flush()
}

// hijack passes a hijack on, as http.ResponseController does, and records that the
// handler took the connection over.
func (rec *recorder) hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, rw, err := http.NewResponseController(rec.ResponseWriter).Hijack()
	if err == nil {
		rec.hijacked = true
	}
	return conn, rw, err
}

func (rec *recorder) push(target string, opts *http.PushOptions) error {
	return rec.ResponseWriter.(http.Pusher).Push(target, opts)
}

// Flush passes a flush on.
func (w recF) Flush() { _ = w.flush() }

// FlushError passes a flush on, with its error.
func (w recF) FlushError() error { return w.flush() }

// Flush passes a flush on.
func (w recFH) Flush() { _ = w.flush() }

// FlushError passes a flush on, with its error.
func (w recFH) FlushError() error { return w.flush() }

// Flush passes a flush on.
func (w recFP) Flush() { _ = w.flush() }

// FlushError passes a flush on, with its error.
func (w recFP) FlushError() error { return w.flush() }

// Flush passes a flush on.
func (w recFHP) Flush() { _ = w.flush() }

// FlushError passes a flush on, with its error.
func (w recFHP) FlushError() error { return w.flush() }

// Hijack passes a hijack on.
func (w recH) Hijack() (net.Conn, *bufio.ReadWriter, error) { return w.hijack() }

// Hijack passes a hijack on.
func (w recFH) Hijack() (net.Conn, *bufio.ReadWriter, error) { return w.hijack() }

// Hijack passes a hijack on.
func (w recHP) Hijack() (net.Conn, *bufio.ReadWriter, error) { return w.hijack() }

// Hijack passes a hijack on.
func (w recFHP) Hijack() (net.Conn, *bufio.ReadWriter, error) { return w.hijack() }

// Push passes a push on.
func (w recP) Push(target string, opts *http.PushOptions) error { return w.push(target, opts) }

// Push passes a push on.
func (w recFP) Push(target string, opts *http.PushOptions) error { return w.push(target, opts) }

// Push passes a push on.
func (w recHP) Push(target string, opts *http.PushOptions) error { return w.push(target, opts) }

// Push passes a push on.
func (w recFHP) Push(target string, opts *http.PushOptions) error { return w.push(target, opts) }
