package middleware_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/bound"
	"github.com/ratebudget/ratebudget/internal/limitertest"
	"github.com/ratebudget/ratebudget/middleware"
)

// spent reports how much of rule's global budget is spent, by a probe: a reservation of
// one unit, whose Remaining tells, given back at once.
func spent(t *testing.T, lim limitertest.Settler, rule ratebudget.Rule) int64 {
	t.Helper()
	checks := []ratebudget.Check{{Rule: rule, Identity: globalID, Cost: 1}}
	tickets := make([]ratebudget.Ticket, 1)
	d, err := lim.Reserve(context.Background(), checks, tickets, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !d.Allowed {
		return rule.Limit // all of it (or more: in debt)
	}
	if err := lim.Settle(context.Background(), checks, tickets, nil); err != nil {
		t.Fatal(err)
	}
	return rule.Limit - d.Remaining - 1
}

// realServer serves h over HTTP/1.1 or, with h2, HTTP/2 over TLS, and returns a client
// for it. served receives once per request after the middleware in h has returned,
// settled, also when it panicked.
func realServer(t *testing.T, h http.Handler, h2 bool) (url string, client *http.Client, served chan struct{}) {
	t.Helper()
	served = make(chan struct{}, 16)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() { served <- struct{}{} }()
		h.ServeHTTP(w, r)
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the panics of TestPanicOverRealServers
	if h2 {
		srv.EnableHTTP2 = true
		srv.StartTLS()
	} else {
		srv.Start()
	}
	t.Cleanup(srv.Close)
	client = srv.Client()
	client.Transport.(*http.Transport).DisableCompression = true
	return srv.URL, client, served
}

// leaveMidBody requests url, reads the first n bytes of the answer, then goes away (the
// request's context canceled) and waits for the handler to return.
func leaveMidBody(t *testing.T, client *http.Client, url string, served <-chan struct{}, n int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(resp.Body, make([]byte, n)); err != nil {
		t.Fatal(err)
	}
	cancel()
	resp.Body.Close()
	<-served
}

// protos runs f over HTTP/1.1 and HTTP/2.
func protos(t *testing.T, f func(t *testing.T, h2 bool)) {
	for _, h2 := range []bool{false, true} {
		name := "http1"
		if h2 {
			name = "http2"
		}
		t.Run(name, func(t *testing.T) { t.Parallel(); f(t, h2) })
	}
}

// fetch sends one request and returns the response's status and body.
func fetch(t *testing.T, client *http.Client, req *http.Request, h2 bool) (int, []byte) {
	t.Helper()
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if h2 != (resp.ProtoMajor == 2) {
		t.Fatalf("response over %s", resp.Proto)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, body
}

// Byte rules: what CountResponseBytes charges over a real server for each way a
// handler writes, and what a shadow rule spends the same way.
func TestResponseBytesOverRealServers(t *testing.T) {
	t.Parallel()
	const payload = 100_000 // above net/http's buffers and the sniffing length
	body := strings.Repeat("x", payload)
	file := filepath.Join(t.TempDir(), "payload")
	if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		method string
		h      http.HandlerFunc
		status int
		want   int64 // bytes charged
	}{
		{"write", "GET", func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, body) }, 200, payload},
		{"flush via ResponseController", "GET", func(w http.ResponseWriter, r *http.Request) {
			for i := 0; i < 10; i++ {
				_, _ = io.WriteString(w, body[:payload/10])
				if err := http.NewResponseController(w).Flush(); err != nil {
					t.Errorf("flush: %v", err)
				}
			}
		}, 200, payload},
		{"flush via http.Flusher", "GET", func(w http.ResponseWriter, r *http.Request) {
			f, ok := w.(http.Flusher)
			if !ok {
				t.Errorf("%T is no http.Flusher", w)
				return
			}
			for i := 0; i < 10; i++ {
				_, _ = io.WriteString(w, body[:payload/10])
				f.Flush()
			}
		}, 200, payload},
		{"io.Copy from a file", "GET", func(w http.ResponseWriter, r *http.Request) {
			f, err := os.Open(file)
			if err != nil {
				t.Error(err)
				return
			}
			defer f.Close()
			if rf, ok := w.(io.ReaderFrom); ok {
				_, err = rf.ReadFrom(f)
			} else {
				_, err = io.Copy(w, f)
			}
			if err != nil {
				t.Error(err)
			}
		}, 200, payload},
		{"http.ServeFile", "GET", func(w http.ResponseWriter, r *http.Request) { http.ServeFile(w, r, file) }, 200, payload},
		{"HEAD writing the body", "HEAD", func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, body) }, 200, 0},
		{"HEAD of http.ServeFile", "HEAD", func(w http.ResponseWriter, r *http.Request) { http.ServeFile(w, r, file) }, 200, 0},
		{"204 writing a body", "GET", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusNoContent)
			_, _ = io.WriteString(w, body)
		}, 204, 0},
		{"304 writing a body", "GET", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusNotModified)
			_, _ = io.WriteString(w, body)
		}, 304, 0},
	}
	for _, shadow := range []bool{false, true} {
		for _, c := range cases {
			name := c.name
			if shadow {
				name += "/shadow"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				protos(t, func(t *testing.T, h2 bool) {
					lim := newMemory(t, newClock())
					out := rule("out", 1_000_000, time.Minute)
					h := mustNew(t, lim, []middleware.Rule{{Rule: out, Identity: global, Shadow: shadow, Counts: middleware.CountResponseBytes(1)}})(c.h)
					url, client, served := realServer(t, h, h2)
					req, _ := http.NewRequest(c.method, url, nil)
					code, got := fetch(t, client, req, h2)
					<-served
					if code != c.status {
						t.Fatalf("status %d, want %d", code, c.status)
					}
					if c.method == "GET" && c.status == 200 && len(got) != payload {
						t.Fatalf("%d bytes received, want %d", len(got), payload)
					}
					if n := spent(t, lim, out); n != c.want {
						t.Errorf("%d bytes charged, want %d", n, c.want)
					}
				})
			})
		}
	}
}

// gzipped compresses what its handler writes.
func gzipped(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Encoding", "gzip")
		zw := gzip.NewWriter(w)
		defer zw.Close()
		next.ServeHTTP(gzipWriter{ResponseWriter: w, zw: zw}, r)
	})
}

type gzipWriter struct {
	http.ResponseWriter
	zw *gzip.Writer
}

func (g gzipWriter) Write(b []byte) (int, error) { return g.zw.Write(b) }

// A compression middleware outside the limiting one leaves the rule charged the bytes
// its handler wrote, uncompressed; inside, the compressed bytes that were sent.
func TestResponseBytesAndCompression(t *testing.T) {
	t.Parallel()
	protos(t, func(t *testing.T, h2 bool) {
		body := strings.Repeat("compressible ", 10_000)
		handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, body) })
		for _, outside := range []bool{true, false} {
			lim := newMemory(t, newClock())
			out := rule("out", 1_000_000, time.Minute)
			mw := mustNew(t, lim, []middleware.Rule{{Rule: out, Identity: global, Counts: middleware.CountResponseBytes(1)}})
			h := mw(gzipped(handler))
			if outside {
				h = gzipped(mw(handler))
			}
			url, client, served := realServer(t, h, h2)
			req, _ := http.NewRequest("GET", url, nil)
			_, got := fetch(t, client, req, h2)
			<-served
			want := int64(len(got)) // compressed
			if outside {
				want = int64(len(body))
			}
			if n := spent(t, lim, out); n != want || len(got) >= len(body) {
				t.Errorf("compression outside %v: %d charged, %d received compressed; want %d", outside, n, len(got), want)
			}
		}
	})
}

// A handler that panics, http.ErrAbortHandler included, is settled: its bytes written
// are charged, its lease is released, and a status-charged rule gives its cost back (a
// panic is a 500), but for http.ErrAbortHandler after the status was written: that
// response was cut short and keeps its status.
func TestPanicOverRealServers(t *testing.T) {
	t.Parallel()
	protos(t, func(t *testing.T, h2 bool) {
		for _, c := range []struct {
			p         any
			write     bool  // the handler writes and flushes 10 bytes first
			successes int64 // charged
		}{
			{http.ErrAbortHandler, true, 1},
			{http.ErrAbortHandler, false, 0},
			{"bug", true, 0},
			{"bug", false, 0},
		} {
			lim := newMemory(t, newClock())
			out := rule("out", 1000, time.Minute)
			ok := rule("ok", 10, time.Minute)
			slots := ratebudget.Rule{Name: "slots", Algorithm: ratebudget.InFlight, Limit: 1, Window: time.Minute}
			h := mustNew(t, lim, []middleware.Rule{
				{Rule: out, Identity: global, Counts: middleware.CountResponseBytes(1)},
				{Rule: ok, Identity: global, Counts: middleware.CountSuccesses(nil)},
				{Rule: slots, Identity: global},
			})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if c.write {
					_, _ = io.WriteString(w, strings.Repeat("y", 10))
					http.NewResponseController(w).Flush()
				}
				panic(c.p)
			}))
			url, client, served := realServer(t, h, h2)
			req, _ := http.NewRequest("GET", url, nil)
			if resp, err := client.Do(req); err == nil {
				_, _ = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
			<-served
			written := int64(0)
			if c.write {
				written = 10
			}
			if n := spent(t, lim, out); n != written {
				t.Errorf("panic %v, written %v: %d bytes charged, want the %d written", c.p, c.write, n, written)
			}
			if n := spent(t, lim, ok); n != c.successes {
				t.Errorf("panic %v, written %v: %d successes charged, want %d", c.p, c.write, n, c.successes)
			}
			if n := spent(t, lim, slots); n != 0 {
				t.Errorf("panic %v, written %v: %d leases held, want 0", c.p, c.write, n)
			}
		}
	})
}

// A client that goes away while the handler writes: the bytes net/http accepted are
// charged, none of the writes it failed, and the lease is released.
func TestResponseBytesClientGone(t *testing.T) {
	t.Parallel()
	protos(t, func(t *testing.T, h2 bool) {
		lim := newMemory(t, newClock())
		out := ratebudget.Rule{Name: "out", Limit: bound.MaxLimit / 4, Window: time.Minute}
		slots := ratebudget.Rule{Name: "slots", Algorithm: ratebudget.InFlight, Limit: 1, Window: time.Minute}
		var accepted atomic.Int64
		chunk := []byte(strings.Repeat("z", 64<<10))
		h := mustNew(t, lim, []middleware.Rule{
			{Rule: out, Identity: global, Counts: middleware.CountResponseBytes(1)},
			{Rule: slots, Identity: global},
		})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			for {
				n, err := w.Write(chunk)
				accepted.Add(int64(n))
				if err != nil {
					return
				}
				if r.Context().Err() != nil && n == 0 {
					return
				}
			}
		}))
		url, client, served := realServer(t, h, h2)
		leaveMidBody(t, client, url, served, 1<<20)
		if n := spent(t, lim, out); n != accepted.Load() || n < 1<<20 {
			t.Errorf("%d bytes charged, the handler's writes accepted %d", n, accepted.Load())
		}
		if n := spent(t, lim, slots); n != 0 {
			t.Errorf("%d leases held, want 0", n)
		}
	})
}

// errAfter is a request body that yields n bytes, then fails once started is closed.
type errAfter struct {
	n       int
	started chan struct{}
}

func (e *errAfter) Read(p []byte) (int, error) {
	if e.n == 0 {
		<-e.started
		return 0, errors.New("client gone")
	}
	k := min(len(p), e.n)
	for i := range p[:k] {
		p[i] = 'b'
	}
	e.n -= k
	return k, nil
}

// CountRequestBytes over real servers: a body without a length is charged the bytes
// read, also when the client goes away mid-body and when it is larger than the
// reservation; a declared length is charged in full; an http.MaxBytesReader inside
// stops the reading, and what was read is charged.
func TestRequestBytesOverRealServers(t *testing.T) {
	t.Parallel()
	protos(t, func(t *testing.T, h2 bool) {
		var read atomic.Int64
		started := make(chan struct{})
		handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Query().Has("gone") {
				close(started)
			}
			if r.URL.Query().Has("max") {
				r.Body = http.MaxBytesReader(w, r.Body, 100)
			}
			n, err := io.Copy(io.Discard, r.Body)
			read.Store(n)
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				w.WriteHeader(http.StatusRequestEntityTooLarge)
			}
		})
		cases := []struct {
			name   string
			query  string
			body   func() io.Reader
			length int64
			status int
			want   int64 // -1: the bytes the handler read, and the one past the limit
		}{
			{"declared", "", func() io.Reader { return strings.NewReader(strings.Repeat("a", 300)) }, 300, 200, 300},
			{"chunked", "", func() io.Reader { return io.MultiReader(strings.NewReader(strings.Repeat("a", 300))) }, -1, 200, 300},
			{"chunked above the reservation and the limit", "", func() io.Reader { return io.MultiReader(strings.NewReader(strings.Repeat("a", 1500))) }, -1, 200, 1500},
			{"MaxBytesReader, chunked", "?max", func() io.Reader { return io.MultiReader(strings.NewReader(strings.Repeat("a", 900))) }, -1, 413, -1},
		}
		for _, c := range cases {
			lim := newMemory(t, newClock())
			in := rule("in", 1000, time.Minute)
			h := mustNew(t, lim, []middleware.Rule{{Rule: in, Identity: global, Counts: middleware.CountRequestBytes()}})(handler)
			url, client, served := realServer(t, h, h2)
			req, _ := http.NewRequest("POST", url+c.query, c.body())
			req.ContentLength = c.length
			code, _ := fetch(t, client, req, h2)
			<-served
			want := c.want
			if want < 0 {
				want = read.Load() + 1 // MaxBytesReader reads one byte more, to see the body go over
			}
			if code != c.status {
				t.Errorf("%s: status %d, want %d", c.name, code, c.status)
			}
			if n := spent(t, lim, in); n != min(want, in.Limit) {
				t.Errorf("%s: %d bytes charged, want %d", c.name, n, want)
			}
		}

		// The client goes away mid-body: a body without a length is charged the bytes the
		// handler read.
		lim := newMemory(t, newClock())
		in := rule("in", 100_000, time.Minute)
		h := mustNew(t, lim, []middleware.Rule{{Rule: in, Identity: global, Counts: middleware.CountRequestBytes()}})(handler)
		url, client, served := realServer(t, h, h2)
		req, _ := http.NewRequest("POST", url+"?gone", &errAfter{n: 5000, started: started})
		req.ContentLength = -1
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
		}
		<-served
		if n := spent(t, lim, in); n != read.Load() || n > 5000 {
			t.Errorf("client gone mid-body: %d bytes charged, the handler read %d of at most 5000", n, read.Load())
		}
	})
}

// Expect: 100-continue with a Content-Length above a byte rule's capacity is refused
// with 413 before the body is asked for: the client never sends it, nothing is spent.
func TestRequestBytesExpectContinue(t *testing.T) {
	t.Parallel()
	protos(t, func(t *testing.T, h2 bool) {
		lim := newMemory(t, newClock())
		in := rule("in", 1000, time.Minute)
		var read atomic.Int64
		h := mustNew(t, lim, []middleware.Rule{{Rule: in, Identity: global, Counts: middleware.CountRequestBytes()}})(
			http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Query().Has("noread") {
					w.WriteHeader(http.StatusUnauthorized) // without asking for the body
					return
				}
				n, _ := io.Copy(io.Discard, r.Body)
				read.Store(n)
			}))
		url, client, served := realServer(t, h, h2)
		client.Transport.(*http.Transport).ExpectContinueTimeout = time.Minute
		var sent atomic.Bool
		big := &watchRead{r: strings.NewReader(strings.Repeat("a", 5000)), read: &sent}
		req, _ := http.NewRequest("PUT", url, big)
		req.ContentLength = 5000
		req.Header.Set("Expect", "100-continue")
		code, _ := fetch(t, client, req, h2)
		<-served
		if code != 413 || sent.Load() {
			t.Errorf("above capacity: %d, body sent %v; want 413 without the body", code, sent.Load())
		}
		req, _ = http.NewRequest("PUT", url, strings.NewReader(strings.Repeat("a", 500)))
		req.Header.Set("Expect", "100-continue")
		if code, _ := fetch(t, client, req, h2); code != 200 {
			t.Errorf("within capacity: %d", code)
		}
		<-served
		if n := spent(t, lim, in); n != 500 || read.Load() != 500 {
			t.Errorf("%d bytes charged, %d read; want 500", n, read.Load())
		}
		// A handler that answers without asking for the body: the client never sends it.
		// Over HTTP/1.1 it is charged nothing, with a length or without; over HTTP/2,
		// whose server hides the Expect header from handlers, a declared length is
		// charged in full, as for any body not read to the end.
		want := int64(500)
		for _, length := range []int64{300, -1} {
			sent.Store(false)
			req, _ = http.NewRequest("PUT", url+"?noread", &watchRead{r: strings.NewReader(strings.Repeat("a", 300)), read: &sent})
			req.ContentLength = length
			req.Header.Set("Expect", "100-continue")
			if code, _ := fetch(t, client, req, h2); code != 401 || sent.Load() {
				t.Errorf("length %d, not asked for: %d, body sent %v; want 401 without the body", length, code, sent.Load())
			}
			<-served
			if h2 && length > 0 {
				want += length
			}
			if n := spent(t, lim, in); n != want {
				t.Errorf("length %d: %d bytes charged after a body never asked for, want %d", length, n, want)
			}
		}
	})
}

type watchRead struct {
	r    io.Reader
	read *atomic.Bool
}

func (w *watchRead) Read(p []byte) (int, error) { w.read.Store(true); return w.r.Read(p) }

// A hijacked connection under every contract: each is charged its reservation and the
// lease is released when the handler returns.
func TestHijackOverARealServer(t *testing.T) {
	t.Parallel()
	lim := newMemory(t, newClock())
	out := rule("out", 1000, time.Minute)
	in := rule("in", 1000, time.Minute)
	succ := rule("succ", 10, time.Minute)
	hdr := rule("hdr", 100, time.Minute)
	slots := ratebudget.Rule{Name: "slots", Algorithm: ratebudget.InFlight, Limit: 1, Window: time.Minute}
	h := mustNew(t, lim, []middleware.Rule{
		{Rule: out, Identity: global, Counts: middleware.CountResponseBytes(7)},
		{Rule: in, Identity: global, Counts: middleware.CountRequestBytes()},
		{Rule: succ, Identity: global, Counts: middleware.CountSuccesses(nil)},
		{Rule: hdr, Identity: global, Counts: middleware.CountResponseHeader(5, "X-Cost")},
		{Rule: slots, Identity: global},
	})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Cost", "50")
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		_, _ = io.CopyN(io.Discard, buf, 20) // the body, from the raw connection
		_, _ = buf.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: close\r\n\r\nraw bytes")
		_ = buf.Flush()
	}))
	url, _, served := realServer(t, h, false)
	conn, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, _ = io.WriteString(conn, "POST / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: test\r\nContent-Length: 20\r\n\r\n"+strings.Repeat("c", 20))
	got, _ := io.ReadAll(conn)
	<-served
	if !bytes.HasPrefix(got, []byte("HTTP/1.1 101 ")) {
		t.Fatalf("hijacked response %q", got)
	}
	for _, c := range []struct {
		r    ratebudget.Rule
		want int64
	}{{out, 7}, {in, 20}, {succ, 1}, {hdr, 5}, {slots, 0}} {
		if n := spent(t, lim, c.r); n != c.want {
			t.Errorf("%s: %d charged, want %d", c.r.Name, n, c.want)
		}
	}
}

// readFromWriter is a response writer below the middleware that sees whether a copy
// reached its ReadFrom (net/http's own: sendfile from a file).
type readFromWriter struct {
	http.ResponseWriter
	calls *atomic.Int64
}

func (w readFromWriter) ReadFrom(src io.Reader) (int64, error) {
	w.calls.Add(1)
	return w.ResponseWriter.(io.ReaderFrom).ReadFrom(src)
}

// A file copied to the response of a settled rule (io.Copy, http.ServeFile) reaches
// net/http's ReadFrom, which sends it with sendfile, as it does without the middleware,
// and its bytes are charged.
func TestResponseBytesKeepReadFrom(t *testing.T) {
	t.Parallel()
	const payload = 100_000
	file := filepath.Join(t.TempDir(), "payload")
	if err := os.WriteFile(file, []byte(strings.Repeat("f", payload)), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, serve := range []func(w http.ResponseWriter, r *http.Request){
		func(w http.ResponseWriter, r *http.Request) { http.ServeFile(w, r, file) },
		func(w http.ResponseWriter, r *http.Request) {
			f, err := os.Open(file)
			if err != nil {
				t.Error(err)
				return
			}
			defer f.Close()
			_, _ = io.Copy(w, f)
		},
	} {
		lim := newMemory(t, newClock())
		out := rule("out", 1_000_000, time.Minute)
		mw := mustNew(t, lim, []middleware.Rule{{Rule: out, Identity: global, Counts: middleware.CountResponseBytes(1)}})
		var calls atomic.Int64
		inner := mw(http.HandlerFunc(serve))
		url, client, served := realServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			inner.ServeHTTP(readFromWriter{ResponseWriter: w, calls: &calls}, r)
		}), false)
		req, _ := http.NewRequest("GET", url, nil)
		code, got := fetch(t, client, req, false)
		<-served
		if code != 200 || len(got) != payload {
			t.Fatalf("%d, %d bytes", code, len(got))
		}
		if calls.Load() == 0 {
			t.Errorf("the copy never reached the ReadFrom of the writer below the middleware")
		}
		if n := spent(t, lim, out); n != payload {
			t.Errorf("%d bytes charged, want %d", n, payload)
		}
	}
}

// A streaming handler that knows its cost only at the end sends it as a declared
// trailer: CountResponseHeader reads the header as the handler left it, after the body
// went out, and the client gets the same value.
func TestResponseHeaderAsTrailer(t *testing.T) {
	t.Parallel()
	protos(t, func(t *testing.T, h2 bool) {
		lim := newMemory(t, newClock())
		tokens := rule("tokens", 1000, time.Minute)
		h := mustNew(t, lim, []middleware.Rule{{Rule: tokens, Identity: global, Counts: middleware.CountResponseHeader(10, "X-Tokens-Used")}})(
			http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Trailer", "X-Tokens-Used")
				for i := 0; i < 3; i++ {
					_, _ = io.WriteString(w, "token ")
					_ = http.NewResponseController(w).Flush()
				}
				w.Header().Set("X-Tokens-Used", "37")
			}))
		url, client, served := realServer(t, h, h2)
		req, _ := http.NewRequest("POST", url, strings.NewReader("prompt"))
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		<-served
		if got := resp.Trailer.Get("X-Tokens-Used"); got != "37" {
			t.Errorf("trailer %q", got)
		}
		if n := spent(t, lim, tokens); n != 37 {
			t.Errorf("%d tokens charged, want 37", n)
		}
	})
}

// The cost may also come as an undeclared trailer (http.TrailerPrefix, set once the
// body went out, as gRPC sends its trailers): CountResponseHeader reads it there, in
// any case of the name, as the client does, and before a header of that name sent
// first.
func TestResponseHeaderAsUndeclaredTrailer(t *testing.T) {
	t.Parallel()
	protos(t, func(t *testing.T, h2 bool) {
		for _, c := range []struct {
			name   string
			key    string // the trailer's key in the handler's header map
			header string // X-Tokens-Used sent as a header first, if not ""
		}{
			{"canonical", http.TrailerPrefix + "X-Tokens-Used", ""},
			{"lower case", http.TrailerPrefix + "x-tokens-used", ""},
			{"after a header", http.TrailerPrefix + "X-Tokens-Used", "3"},
		} {
			lim := newMemory(t, newClock())
			tokens := rule("tokens", 1000, time.Minute)
			h := mustNew(t, lim, []middleware.Rule{{Rule: tokens, Identity: global, Counts: middleware.CountResponseHeader(10, "X-Tokens-Used")}})(
				http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if c.header != "" {
						w.Header().Set("X-Tokens-Used", c.header)
					}
					for i := 0; i < 3; i++ {
						_, _ = io.WriteString(w, "token ")
						_ = http.NewResponseController(w).Flush()
					}
					w.Header()[c.key] = []string{"37"}
				}))
			url, client, served := realServer(t, h, h2)
			req, _ := http.NewRequest("POST", url, strings.NewReader("prompt"))
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
			<-served
			if got := resp.Trailer.Get("X-Tokens-Used"); got != "37" {
				t.Errorf("%s: trailer %q", c.name, got)
			}
			if n := spent(t, lim, tokens); n != 37 {
				t.Errorf("%s: %d tokens charged, want the trailer's 37", c.name, n)
			}
		}
	})
}
