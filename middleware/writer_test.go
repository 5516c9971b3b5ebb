package middleware_test

import (
	"errors"
	"io"
	"net/http"
	"testing"
	"time"

	chimw "github.com/go-chi/chi/v5/middleware"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/middleware"
)

// caps is what a handler can do with its response writer: the interfaces it
// implements, and what http.ResponseController reaches through it.
type caps struct {
	Flusher, Hijacker, ReaderFrom, Pusher          bool
	Flush, ReadDeadline, WriteDeadline, FullDuplex string
}

func errText(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, http.ErrNotSupported):
		return "not supported"
	}
	return err.Error()
}

// probe is a handler that records what it can do with its writer into *got.
func probe(got *caps) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, got.Flusher = w.(http.Flusher)
		_, got.Hijacker = w.(http.Hijacker)
		_, got.ReaderFrom = w.(io.ReaderFrom)
		_, got.Pusher = w.(http.Pusher)
		rc := http.NewResponseController(w)
		got.ReadDeadline = errText(rc.SetReadDeadline(time.Now().Add(time.Minute)))
		got.WriteDeadline = errText(rc.SetWriteDeadline(time.Now().Add(time.Minute)))
		got.FullDuplex = errText(rc.EnableFullDuplex())
		_, _ = io.WriteString(w, "probed")
		got.Flush = errText(rc.Flush())
	}
}

// A handler below a settled rule (one that counts bytes or holds a lease) can do with
// its writer what it can without the middleware: the same interfaces (io.ReaderFrom
// aside, which the writer always has: a copy is the same through it), and
// http.ResponseController reaches the deadlines, full duplex and flushes below it. It
// gains no interface the writer below lacks: under http.TimeoutHandler, which cannot
// flush, a streaming handler must not be told it can, nor one on HTTP/2 that it can
// hijack the connection.
func TestSettledWriterKeepsCapabilities(t *testing.T) {
	t.Parallel()
	for _, env := range []struct {
		name   string
		h2     bool
		around []func(http.Handler) http.Handler // outside the middleware
		inside []func(http.Handler) http.Handler // between the middleware and the handler
	}{
		{name: "http1"},
		{name: "http2", h2: true},
		{name: "http1/TimeoutHandler outside", around: []func(http.Handler) http.Handler{timeoutHandler}},
		{name: "http2/TimeoutHandler outside", h2: true, around: []func(http.Handler) http.Handler{timeoutHandler}},
		{name: "http1/Logger outside", around: []func(http.Handler) http.Handler{quietLogger}},
		{name: "http2/Logger outside", h2: true, around: []func(http.Handler) http.Handler{quietLogger}},
		{name: "http1/Logger inside", inside: []func(http.Handler) http.Handler{quietLogger}},
		{name: "http2/Logger inside", h2: true, inside: []func(http.Handler) http.Handler{quietLogger}},
		{name: "http1/Compress outside", around: []func(http.Handler) http.Handler{chimw.Compress(5)}},
		{name: "http2/Compress outside", h2: true, around: []func(http.Handler) http.Handler{chimw.Compress(5)}},
		{name: "http1/Timeout, Recoverer, RequestID outside", around: []func(http.Handler) http.Handler{chimw.RequestID, chimw.Recoverer, chimw.Timeout(time.Minute)}},
	} {
		t.Run(env.name, func(t *testing.T) {
			t.Parallel()
			var want, got caps
			mws := append(append([]func(http.Handler) http.Handler{}, env.around...), env.inside...)
			url, client, served := realServer(t, chain(probe(&want), mws...), env.h2)
			req, _ := http.NewRequest("GET", url, nil)
			fetch(t, client, req, env.h2)
			<-served

			lim := newMemory(t, newClock())
			out := rule("out", 1_000_000, time.Minute)
			slots := ratebudget.Rule{Name: "slots", Algorithm: ratebudget.InFlight, Limit: 1, Window: time.Minute}
			limit := mustNew(t, lim, []middleware.Rule{
				{Rule: out, Identity: global, Counts: middleware.CountResponseBytes(1)},
				{Rule: slots, Identity: global},
			})
			mws = append(append(append([]func(http.Handler) http.Handler{}, env.around...), limit), env.inside...)
			url, client, served = realServer(t, chain(probe(&got), mws...), env.h2)
			req, _ = http.NewRequest("GET", url, nil)
			code, _ := fetch(t, client, req, env.h2)
			<-served
			if code != 200 {
				t.Fatalf("status %d", code)
			}
			// ReaderFrom aside: the middleware's writer always has it.
			want.ReaderFrom, got.ReaderFrom = false, false
			if got != want {
				t.Errorf("through the middleware\n %+v\nwithout it\n %+v", got, want)
			}
			if n := spent(t, lim, slots); n != 0 {
				t.Errorf("%d leases held after the handler returned", n)
			}
		})
	}
}

func timeoutHandler(h http.Handler) http.Handler {
	return http.TimeoutHandler(h, time.Minute, "timed out")
}
