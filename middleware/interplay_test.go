package middleware_test

import (
	"bufio"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	chimw "github.com/go-chi/chi/v5/middleware"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/headers"
	"github.com/ratebudget/ratebudget/internal/bound"
	"github.com/ratebudget/ratebudget/keyfuncs"
	"github.com/ratebudget/ratebudget/memory"
	"github.com/ratebudget/ratebudget/middleware"
)

// The tests of this file mount the middleware with the middlewares a chi service stacks
// around it, in each order that makes sense, over real servers.

// chain wraps h in mws, the first outermost.
func chain(h http.Handler, mws ...func(http.Handler) http.Handler) http.Handler {
	for i := len(mws) - 1; i >= 0; i-- {
		h = mws[i](h)
	}
	return h
}

// quietLogger is chi's request logger writing nowhere: its wrapper
// (middleware.WrapResponseWriter) around the writer, and a log entry for Recoverer's
// panics (which then print no stack).
var quietLogger = chimw.RequestLogger(&chimw.DefaultLogFormatter{Logger: log.New(io.Discard, "", 0), NoColor: true})

// response is what a client got: status, the headers a refusal is made of, and the body
// as sent and decoded.
type response struct {
	code     int
	header   http.Header
	encoding string
	body     string
}

// get sends GET url with accept as Accept and gzip offered, and decodes a gzip body.
func get(t *testing.T, client *http.Client, url, accept string, h2 bool) response {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("Accept", accept)
	req.Header.Set("Accept-Encoding", "gzip")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if h2 != (resp.ProtoMajor == 2) {
		t.Fatalf("response over %s", resp.Proto)
	}
	var body io.Reader = resp.Body
	enc := resp.Header.Get("Content-Encoding")
	if enc == "gzip" {
		zr, err := gzip.NewReader(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		body = zr
	}
	b, err := io.ReadAll(body)
	if err != nil {
		t.Fatal(err)
	}
	h := http.Header{}
	for _, k := range []string{"Retry-After", "Cache-Control", "Content-Type", "X-Content-Type-Options",
		"X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset", "Ratelimit", "Ratelimit-Policy"} {
		if v, ok := resp.Header[k]; ok {
			h[k] = v
		}
	}
	return response{code: resp.StatusCode, header: h, encoding: enc, body: string(b)}
}

// The 429 and the 503 keep their status, headers (Retry-After, the metadata,
// Cache-Control: no-store) and body through chi's Compress and Recoverer, in every order:
// a compression middleware outside compresses a text/plain refusal (chi's default types
// leave application/problem+json as it is) and drops nothing but Content-Length, with
// either style of metadata.
func TestRefusalsThroughCompressAndRecoverer(t *testing.T) {
	t.Parallel()
	type mw = func(http.Handler) http.Handler
	down := limiterFunc(func(context.Context, []ratebudget.Check) (ratebudget.Decision, error) {
		return ratebudget.Decision{}, &ratebudget.StoreError{Class: ratebudget.ClassConnection, Err: errors.New("connection refused")}
	})
	orders := []struct {
		name       string
		compressed bool // a compression middleware is outside the limiting one
		build      func(limit mw) http.Handler
	}{
		{"alone", false, func(limit mw) http.Handler { return limit(ok) }},
		{"Recoverer, Compress, limit", true, func(limit mw) http.Handler { return chain(ok, chimw.Recoverer, chimw.Compress(5), limit) }},
		{"Compress, Recoverer, limit", true, func(limit mw) http.Handler { return chain(ok, chimw.Compress(5), chimw.Recoverer, limit) }},
		{"limit, Compress, Recoverer", false, func(limit mw) http.Handler { return chain(ok, limit, chimw.Compress(5), chimw.Recoverer) }},
	}
	protos(t, func(t *testing.T, h2 bool) {
		for _, style := range []headers.Style{headers.XRateLimit, headers.IETF} {
			field := map[headers.Style]string{headers.XRateLimit: "X-Ratelimit-Remaining", headers.IETF: "Ratelimit"}[style]
			for _, accept := range []string{"text/plain", "application/json"} {
				var want [2]response // 429, 503 of the middleware alone
				for i, o := range orders {
					refused := mustNew(t, newMemory(t, newClock()), []middleware.Rule{{Rule: rule("r", 1, time.Minute), Identity: global}}, middleware.WithHeaders(style))
					url, client, _ := realServer(t, o.build(refused), h2)
					if got := get(t, client, url, accept, h2); got.code != 200 {
						t.Fatalf("%s, %s: first request %d", style, o.name, got.code)
					}
					r429 := get(t, client, url, accept, h2)
					unavailable := mustNew(t, down, []middleware.Rule{{Rule: rule("r", 1, time.Minute), Identity: global}}, middleware.WithHeaders(style))
					url, client, _ = realServer(t, o.build(unavailable), h2)
					r503 := get(t, client, url, accept, h2)
					if i == 0 {
						want = [2]response{r429, r503}
						if r429.code != 429 || r429.header.Get("Retry-After") == "" || r429.header.Get("Cache-Control") != "no-store" || r429.header.Get(field) == "" {
							t.Fatalf("%s alone: %+v", style, r429)
						}
						if r503.code != 503 || r503.header.Get("Retry-After") == "" || r503.header.Get("Cache-Control") != "no-store" {
							t.Fatalf("%s alone: %+v", style, r503)
						}
						continue
					}
					for k, got := range []response{r429, r503} {
						w := want[k]
						wantEnc := ""
						if o.compressed && accept == "text/plain" {
							wantEnc = "gzip"
						}
						if got.code != w.code || got.body != w.body || got.encoding != wantEnc || !equalHeader(got.header, w.header) {
							t.Errorf("%s, %s, Accept %s:\n got %d %q %v %q\nwant %d %q %v %q", style, o.name, accept, got.code, got.encoding, got.header, got.body, w.code, wantEnc, w.header, w.body)
						}
					}
				}
			}
		}
	})
}

func equalHeader(a, b http.Header) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if strings.Join(v, "\n") != strings.Join(b[k], "\n") {
			return false
		}
	}
	return true
}

// A handler that panics is a failure under chi's Recoverer, outside the limiting
// middleware or inside it: the client gets Recoverer's 500, CountSuccesses gives the
// cost back, the lease is released and only the bytes written are charged.
func TestPanicUnderRecoverer(t *testing.T) {
	t.Parallel()
	boom := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { panic("bug") })
	protos(t, func(t *testing.T, h2 bool) {
		for _, outside := range []bool{true, false} {
			lim := newMemory(t, newClock())
			okRule := rule("ok", 10, time.Minute)
			out := rule("out", 1000, time.Minute)
			slots := ratebudget.Rule{Name: "slots", Algorithm: ratebudget.InFlight, Limit: 1, Window: time.Minute}
			limit := mustNew(t, lim, []middleware.Rule{
				{Rule: okRule, Identity: global, Counts: middleware.CountSuccesses(nil)},
				{Rule: out, Identity: global, Counts: middleware.CountResponseBytes(100)},
				{Rule: slots, Identity: global},
			})
			h := chain(boom, quietLogger, chimw.Recoverer, limit)
			if !outside {
				h = chain(boom, limit, quietLogger, chimw.Recoverer)
			}
			url, client, served := realServer(t, h, h2)
			req, _ := http.NewRequest("GET", url, nil)
			code, _ := fetch(t, client, req, h2)
			<-served
			if code != 500 {
				t.Fatalf("Recoverer outside %v: status %d, want 500", outside, code)
			}
			for _, c := range []struct {
				r    ratebudget.Rule
				want int64
			}{{okRule, 0}, {out, 0}, {slots, 0}} {
				if n := spent(t, lim, c.r); n != c.want {
					t.Errorf("Recoverer outside %v: %s: %d charged, want %d", outside, c.r.Name, n, c.want)
				}
			}
		}
	})
}

// CountResponseBytes charges the bytes that pass through the limiting middleware: with
// chi's Compress outside it, the bytes the handler wrote; inside it, the compressed
// bytes sent (Compress finishes its stream before it returns).
func TestResponseBytesAndChiCompress(t *testing.T) {
	t.Parallel()
	body := strings.Repeat("compressible text ", 5000)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		for i := 0; i < 10; i++ {
			_, _ = io.WriteString(w, body[:len(body)/10])
			_ = http.NewResponseController(w).Flush()
		}
	})
	protos(t, func(t *testing.T, h2 bool) {
		for _, outside := range []bool{true, false} {
			lim := newMemory(t, newClock())
			out := rule("out", 1_000_000, time.Minute)
			limit := mustNew(t, lim, []middleware.Rule{{Rule: out, Identity: global, Counts: middleware.CountResponseBytes(1)}})
			h := chain(handler, chimw.Compress(5), limit)
			if !outside {
				h = chain(handler, limit, chimw.Compress(5))
			}
			url, client, served := realServer(t, h, h2)
			req, _ := http.NewRequest("GET", url, nil)
			req.Header.Set("Accept-Encoding", "gzip")
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			raw, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			<-served
			if resp.Header.Get("Content-Encoding") != "gzip" || len(raw) >= len(body) {
				t.Fatalf("Compress outside %v: %q, %d bytes: not compressed", outside, resp.Header.Get("Content-Encoding"), len(raw))
			}
			want := int64(len(raw))
			if outside {
				want = int64(len(body))
			}
			if n := spent(t, lim, out); n != want {
				t.Errorf("Compress outside %v: %d bytes charged, want %d (%d written, %d sent)", outside, n, want, len(body), len(raw))
			}
		}
	})
}

// echoUpgrade is a WebSocket-style handler: it switches protocols on the hijacked
// connection and echoes lines until the client closes it. With status, it sends the 101
// through WriteHeader before hijacking (as github.com/coder/websocket does), else on the
// raw connection (as github.com/gorilla/websocket does).
func echoUpgrade(t *testing.T, status bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		hj, ok := w.(http.Hijacker)
		if !ok {
			http.Error(w, "cannot hijack", http.StatusNotImplemented)
			return
		}
		w.Header().Set("Upgrade", "echo")
		w.Header().Set("Connection", "Upgrade")
		if status {
			w.WriteHeader(http.StatusSwitchingProtocols)
		}
		conn, buf, err := hj.Hijack()
		if err != nil {
			t.Errorf("hijack: %v", err)
			return
		}
		defer conn.Close()
		if !status {
			_, _ = buf.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
		}
		_ = buf.Flush()
		for {
			line, err := buf.ReadString('\n')
			if err != nil {
				return
			}
			_, _ = buf.WriteString(line)
			_ = buf.Flush()
		}
	}
}

// dialUpgrade sends an upgrade request to addr on a new connection and returns the
// connection and the response's head.
func dialUpgrade(t *testing.T, addr string) (net.Conn, *bufio.Reader, *http.Response) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	_, _ = io.WriteString(conn, "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	return conn, br, resp
}

// A WebSocket-style upgrade under a settled rule, with chi's Logger, Recoverer and
// Compress outside the limiting middleware or inside it: the client gets 101, the lease
// is held while the upgraded connection is served (another upgrade is refused with 429)
// and released when the handler returns; CountSuccesses charges the request (an upgrade
// is a success) and CountResponseBytes its estimate (the bytes on the raw connection are
// not seen).
func TestUpgradeUnderChiStack(t *testing.T) {
	t.Parallel()
	for _, outside := range []bool{true, false} {
		for _, status := range []bool{true, false} {
			lim := newMemory(t, newClock())
			okRule := rule("ok", 10, time.Minute)
			out := rule("out", 1000, time.Minute)
			slots := ratebudget.Rule{Name: "slots", Algorithm: ratebudget.InFlight, Limit: 1, Window: time.Minute}
			limit := mustNew(t, lim, []middleware.Rule{
				{Rule: okRule, Identity: global, Counts: middleware.CountSuccesses(nil)},
				{Rule: out, Identity: global, Counts: middleware.CountResponseBytes(7)},
				{Rule: slots, Identity: global},
			})
			h := chain(echoUpgrade(t, status), quietLogger, chimw.Recoverer, chimw.Compress(5), limit)
			if !outside {
				h = chain(echoUpgrade(t, status), limit, quietLogger, chimw.Recoverer, chimw.Compress(5))
			}
			url, _, served := realServer(t, h, false)
			addr := strings.TrimPrefix(url, "http://")
			conn, br, resp := dialUpgrade(t, addr)
			if resp.StatusCode != 101 {
				t.Fatalf("outside %v, WriteHeader %v: status %d, want 101", outside, status, resp.StatusCode)
			}
			_, _ = io.WriteString(conn, "ping\n")
			if line, err := br.ReadString('\n'); err != nil || line != "ping\n" {
				t.Fatalf("echo: %q, %v", line, err)
			}
			_, _, second := dialUpgrade(t, addr)
			<-served
			if second.StatusCode != 429 || second.Header.Get("Retry-After") != "1" {
				t.Errorf("outside %v, WriteHeader %v: a second upgrade while the first is served: %d, Retry-After %q; want 429, 1",
					outside, status, second.StatusCode, second.Header.Get("Retry-After"))
			}
			conn.Close()
			<-served
			for _, c := range []struct {
				r    ratebudget.Rule
				want int64
			}{{okRule, 1}, {out, 7}, {slots, 0}} {
				if n := spent(t, lim, c.r); n != c.want {
					t.Errorf("outside %v, WriteHeader %v: %s: %d charged, want %d", outside, status, c.r.Name, n, c.want)
				}
			}
		}
	}
}

// Server-Sent Events under CountResponseBytes and an InFlight rule, behind chi's
// Compress (which leaves text/event-stream as it is) and Logger: every event reaches
// the client when it is flushed, the lease is held while the stream runs (another
// request is refused), and once the client has gone the bytes the handler's writes
// returned are charged and the lease is released.
func TestServerSentEvents(t *testing.T) {
	t.Parallel()
	protos(t, func(t *testing.T, h2 bool) {
		lim := newMemory(t, newClock())
		out := ratebudget.Rule{Name: "out", Limit: bound.MaxLimit / 4, Window: time.Minute}
		slots := ratebudget.Rule{Name: "slots", Algorithm: ratebudget.InFlight, Limit: 1, Window: time.Minute}
		limit := mustNew(t, lim, []middleware.Rule{
			{Rule: out, Identity: global, Counts: middleware.CountResponseBytes(1)},
			{Rule: slots, Identity: global},
		})
		var accepted atomic.Int64
		events := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			f, ok := w.(http.Flusher)
			if !ok {
				http.Error(w, "streaming unsupported", http.StatusNotImplemented)
				return
			}
			w.Header().Set("Content-Type", "text/event-stream")
			w.Header().Set("Cache-Control", "no-cache")
			for i := 0; ; i++ {
				n, err := io.WriteString(w, "data: event "+strings.Repeat("e", i%7)+"\n\n")
				accepted.Add(int64(n))
				f.Flush()
				if err != nil || r.Context().Err() != nil {
					return
				}
			}
		})
		url, client, served := realServer(t, chain(events, quietLogger, chimw.Compress(5), limit), h2)
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
		req.Header.Set("Accept-Encoding", "gzip")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 200 || resp.Header.Get("Content-Encoding") != "" {
			t.Fatalf("%d, Content-Encoding %q", resp.StatusCode, resp.Header.Get("Content-Encoding"))
		}
		br := bufio.NewReader(resp.Body)
		for i := 0; i < 100; i++ {
			if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: event") {
				t.Fatalf("event %d: %q, %v", i, line, err)
			}
			_, _ = br.ReadString('\n')
		}
		req2, _ := http.NewRequest("GET", url, nil)
		if code, _ := fetch(t, client, req2, h2); code != 429 {
			t.Errorf("a second request while the stream runs: %d, want 429", code)
		}
		<-served
		cancel()
		resp.Body.Close()
		<-served
		if n := spent(t, lim, out); n != accepted.Load() {
			t.Errorf("%d bytes charged, the handler's writes returned %d", n, accepted.Load())
		}
		if n := spent(t, lim, slots); n != 0 {
			t.Errorf("%d leases held after the stream ended", n)
		}
	})
}

// httputil.ReverseProxy as the handler of settled rules: the proxied body's bytes are
// charged, a backend that cannot be reached (502) is not charged by CountSuccesses, a
// proxied event stream is flushed through to the client while its lease is held, and a
// proxied upgrade holds its lease until the connection closes.
func TestReverseProxyAsTheHandler(t *testing.T) {
	t.Parallel()
	const size = 50_000
	streaming := make(chan struct{}, 1)
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/data":
			_, _ = io.WriteString(w, strings.Repeat("d", size))
		case "/events":
			w.Header().Set("Content-Type", "text/event-stream")
			for i := 0; i < 3; i++ {
				_, _ = io.WriteString(w, "data: x\n\n")
				_ = http.NewResponseController(w).Flush()
			}
			streaming <- struct{}{}
			<-r.Context().Done()
		case "/ws":
			echoUpgrade(t, false)(w, r)
		}
	}))
	t.Cleanup(backend.Close)
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()
	proxyTo := func(s *httptest.Server) http.Handler {
		u, _ := url.Parse(s.URL)
		p := httputil.NewSingleHostReverseProxy(u)
		p.ErrorLog = log.New(io.Discard, "", 0)
		return p
	}
	type env struct {
		lim                *memory.Limiter
		okRule, out, slots ratebudget.Rule
	}
	newEnv := func(t *testing.T) (env, func(http.Handler) http.Handler) {
		e := env{lim: newMemory(t, newClock()), okRule: rule("ok", 10, time.Minute), out: rule("out", 1_000_000, time.Minute),
			slots: ratebudget.Rule{Name: "slots", Algorithm: ratebudget.InFlight, Limit: 1, Window: time.Minute}}
		return e, mustNew(t, e.lim, []middleware.Rule{
			{Rule: e.okRule, Identity: global, Counts: middleware.CountSuccesses(nil)},
			{Rule: e.out, Identity: global, Counts: middleware.CountResponseBytes(1)},
			{Rule: e.slots, Identity: global},
		})
	}
	check := func(t *testing.T, e env, ok, out int64) {
		t.Helper()
		for _, c := range []struct {
			r    ratebudget.Rule
			want int64
		}{{e.okRule, ok}, {e.out, out}, {e.slots, 0}} {
			if n := spent(t, e.lim, c.r); n != c.want {
				t.Errorf("%s: %d charged, want %d", c.r.Name, n, c.want)
			}
		}
	}
	protos(t, func(t *testing.T, h2 bool) {
		e, limit := newEnv(t)
		url, client, served := realServer(t, limit(proxyTo(backend)), h2)
		req, _ := http.NewRequest("GET", url+"/data", nil)
		if code, body := fetch(t, client, req, h2); code != 200 || len(body) != size {
			t.Fatalf("proxied: %d, %d bytes", code, len(body))
		}
		<-served
		check(t, e, 1, size)

		e, limit = newEnv(t)
		url, client, served = realServer(t, limit(proxyTo(gone)), h2)
		req, _ = http.NewRequest("GET", url+"/data", nil)
		if code, _ := fetch(t, client, req, h2); code != 502 {
			t.Fatalf("backend gone: %d, want 502", code)
		}
		<-served
		check(t, e, 0, 0)
	})
	t.Run("events", func(t *testing.T) {
		e, limit := newEnv(t)
		url, client, served := realServer(t, limit(proxyTo(backend)), false)
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, "GET", url+"/events", nil)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		<-streaming
		if got, err := io.ReadAll(io.LimitReader(resp.Body, 3*int64(len("data: x\n\n")))); err != nil || strings.Count(string(got), "data: x") != 3 {
			t.Fatalf("events through the proxy: %q, %v", got, err)
		}
		req2, _ := http.NewRequest("GET", url+"/data", nil)
		if code, _ := fetch(t, client, req2, false); code != 429 {
			t.Errorf("while the stream runs: %d, want 429", code)
		}
		<-served
		cancel()
		resp.Body.Close()
		<-served
		if n := spent(t, e.lim, e.slots); n != 0 {
			t.Errorf("%d leases held after the stream ended", n)
		}
		if n := spent(t, e.lim, e.out); n != 3*int64(len("data: x\n\n")) {
			t.Errorf("%d bytes charged, want the 3 events", n)
		}
	})
	t.Run("upgrade", func(t *testing.T) {
		e, limit := newEnv(t)
		url, _, served := realServer(t, limit(proxyTo(backend)), false)
		addr := strings.TrimPrefix(url, "http://")
		conn, br, resp := dialUpgrade(t, addr)
		if resp.StatusCode != 101 {
			t.Fatalf("proxied upgrade: %d", resp.StatusCode)
		}
		_, _ = io.WriteString(conn, "ping\n")
		if line, err := br.ReadString('\n'); err != nil || line != "ping\n" {
			t.Fatalf("echo: %q, %v", line, err)
		}
		if _, _, second := dialUpgrade(t, addr); second.StatusCode != 429 {
			t.Errorf("a second upgrade while the first is open: %d, want 429", second.StatusCode)
		}
		<-served
		conn.Close()
		<-served
		check(t, e, 1, 1)
	})
}

// chi's Throttle answers 429 when the server is at capacity. Outside the limiting
// middleware, a throttled request is never decided and spends nothing; inside it, the
// request was admitted and Throttle's 429 is a response below 500, which
// CountSuccesses(nil) charges: a predicate that leaves 429 out does not.
func TestChiThrottle(t *testing.T) {
	t.Parallel()
	notTooMany := func(status int) bool { return status < 500 && status != http.StatusTooManyRequests }
	for _, c := range []struct {
		name    string
		outside bool // Throttle outside the limiting middleware
		charged func(int) bool
		want    int64 // charged for the throttled request
	}{
		{"Throttle outside", true, nil, 0},
		{"Throttle inside", false, nil, 1},
		{"Throttle inside, 429 not charged", false, notTooMany, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			lim := newMemory(t, newClock())
			okRule := rule("ok", 10, time.Minute)
			limit := mustNew(t, lim, []middleware.Rule{{Rule: okRule, Identity: global, Counts: middleware.CountSuccesses(c.charged)}})
			busy, release := make(chan struct{}), make(chan struct{})
			slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				busy <- struct{}{}
				<-release
			})
			h := chain(slow, chimw.Throttle(1), limit)
			if !c.outside {
				h = chain(slow, limit, chimw.Throttle(1))
			}
			srv := httptest.NewServer(h)
			t.Cleanup(srv.Close)
			first := make(chan int)
			go func() {
				resp, err := srv.Client().Get(srv.URL)
				if err != nil {
					first <- 0
					return
				}
				resp.Body.Close()
				first <- resp.StatusCode
			}()
			<-busy
			resp, err := srv.Client().Get(srv.URL)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			close(release)
			if code := <-first; code != 200 || resp.StatusCode != 429 {
				t.Fatalf("first %d, throttled %d; want 200, 429", code, resp.StatusCode)
			}
			if n := spent(t, lim, okRule); n != 1+c.want {
				t.Errorf("%d charged, want %d (the first, and %d for the throttled one)", n, 1+c.want, c.want)
			}
		})
	}
}

// chi's RealIP in front of keyfuncs.ClientIP() (LimitByIP) lets each client name its
// own budget with X-Forwarded-For, as the documentation (and chi's deprecation of
// RealIP) warns; mounted after the limiting middleware it changes nothing: the client is
// the TCP peer.
func TestChiRealIPInFront(t *testing.T) {
	t.Parallel()
	realIP := chimw.RealIP //lint:ignore SA1019 the test shows the spoofing its deprecation warns of
	for _, c := range []struct {
		name    string
		inFront bool
		want    []int
	}{
		{"RealIP in front", true, []int{200, 200, 200}}, // each forged address a new budget
		{"RealIP after", false, []int{200, 429, 429}},
	} {
		limit, err := middleware.LimitByIP(newMemory(t, newClock()), 1, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		h := chain(ok, realIP, limit)
		if !c.inFront {
			h = chain(ok, limit, realIP)
		}
		srv := httptest.NewServer(h)
		for i, want := range c.want {
			req, _ := http.NewRequest("GET", srv.URL, nil)
			req.Header.Set("X-Forwarded-For", "198.51.100."+string(rune('1'+i)))
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != want {
				t.Errorf("%s, request %d: %d, want %d", c.name, i, resp.StatusCode, want)
			}
		}
		srv.Close()
	}
}

// keyfuncs.RoutePattern in a top-level r.Use looks the route up before chi routes: a
// path rewriter mounted before the limiting middleware (StripSlashes, CleanPath) is
// seen, so /users/1/ and //users/1 spend the budget of /users/{id}; one mounted after it
// is not, and such a path gets the scope of unmatched requests ("~unmatched"), one more
// budget per client. A subrouter's r.Use sees its mount pattern.
func TestRoutePatternWithPathRewriters(t *testing.T) {
	t.Parallel()
	var scopes []string
	scope := func(r *http.Request) (string, error) {
		s, err := keyfuncs.RoutePattern()(r)
		scopes = append(scopes, s)
		return s, err
	}
	for _, c := range []struct {
		name    string
		rewrite func(http.Handler) http.Handler
		path    string
	}{
		{"StripSlashes", chimw.StripSlashes, "/users/1/"},
		{"CleanPath", chimw.CleanPath, "//users/1"},
	} {
		for _, before := range []bool{true, false} {
			scopes = nil
			limit := mustNew(t, newMemory(t, newClock()), []middleware.Rule{{Rule: rule("route", 1, time.Minute), Identity: global, Scope: scope}})
			r := chi.NewRouter()
			if before {
				r.Use(c.rewrite, limit)
			} else {
				r.Use(limit, c.rewrite)
			}
			r.Get("/users/{id}", ok)
			r.Route("/api", func(r chi.Router) {
				r.Use(limit)
				r.Get("/users/{id}", ok)
			})
			codes := []int{do(r, "GET", "/users/1", nil).Code, do(r, "GET", c.path, nil).Code}
			want := []int{200, 429}
			wantScopes := []string{"/users/{id}", "/users/{id}"}
			if !before {
				want = []int{200, 200}
				wantScopes = []string{"/users/{id}", "~unmatched"}
			}
			if codes[0] != want[0] || codes[1] != want[1] || strings.Join(scopes, " ") != strings.Join(wantScopes, " ") {
				t.Errorf("%s before %v: %v, scopes %q; want %v, %q", c.name, before, codes, scopes, want, wantScopes)
			}
			scopes = nil
			if code := do(r, "GET", "/api/users/1", nil).Code; code != 200 || len(scopes) != 2 || scopes[1] != "/api/*" {
				t.Errorf("%s before %v: a subrouter's r.Use: %d, scopes %q; want 200 and the mount pattern", c.name, before, code, scopes)
			}
		}
	}
}

// http.MaxBytesReader mounted outside the limiting middleware bounds what the handler
// reads, and CountRequestBytes charges a body without a length the bytes the handler got.
func TestMaxBytesReaderOutside(t *testing.T) {
	t.Parallel()
	protos(t, func(t *testing.T, h2 bool) {
		lim := newMemory(t, newClock())
		in := rule("in", 1000, time.Minute)
		limit := mustNew(t, lim, []middleware.Rule{{Rule: in, Identity: global, Counts: middleware.CountRequestBytes()}})
		maxBytes := func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				r.Body = http.MaxBytesReader(w, r.Body, 100)
				next.ServeHTTP(w, r)
			})
		}
		var read atomic.Int64
		h := chain(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n, err := io.Copy(io.Discard, r.Body)
			read.Store(n)
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				w.WriteHeader(http.StatusRequestEntityTooLarge)
			}
		}), maxBytes, limit)
		url, client, served := realServer(t, h, h2)
		req, _ := http.NewRequest("POST", url, io.MultiReader(strings.NewReader(strings.Repeat("a", 900))))
		req.ContentLength = -1
		code, _ := fetch(t, client, req, h2)
		<-served
		if code != 413 || read.Load() != 100 {
			t.Fatalf("%d, %d read; want 413, 100", code, read.Load())
		}
		if n := spent(t, lim, in); n != 100 {
			t.Errorf("%d bytes charged, want the 100 the handler read", n)
		}
	})
}

// A chi service's usual stack (RequestID, Logger, Recoverer, Timeout, Compress) outside
// a group that limits per client IP: admissions, the 429 with its headers through the
// stack, and a panicking route not charged.
func TestUsualChiStack(t *testing.T) {
	t.Parallel()
	protos(t, func(t *testing.T, h2 bool) {
		lim := newMemory(t, newClock())
		perIP := rule("per-ip", 2, time.Minute)
		ip, err := keyfuncs.ClientIP()
		if err != nil {
			t.Fatal(err)
		}
		limit := mustNew(t, lim, []middleware.Rule{{Rule: perIP, Identity: ip, Counts: middleware.CountSuccesses(nil)}})
		r := chi.NewRouter()
		r.Use(chimw.RequestID, quietLogger, chimw.Recoverer, chimw.Timeout(time.Minute), chimw.Compress(5))
		r.Group(func(r chi.Router) {
			r.Use(limit)
			r.Get("/hello", func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/plain")
				_, _ = io.WriteString(w, strings.Repeat("hello ", 100))
			})
			r.Get("/boom", func(w http.ResponseWriter, r *http.Request) { panic("bug") })
		})
		url, client, served := realServer(t, r, h2)
		for i, c := range []struct {
			path string
			code int
		}{{"/boom", 500}, {"/hello", 200}, {"/hello", 200}, {"/hello", 429}} {
			got := get(t, client, url+c.path, "text/plain", h2)
			<-served
			if got.code != c.code {
				t.Fatalf("request %d to %s: %d, want %d", i, c.path, got.code, c.code)
			}
			if c.code == 429 && (got.header.Get("Retry-After") != "60" || got.header.Get("Cache-Control") != "no-store" ||
				got.header.Get("X-Ratelimit-Remaining") != "0" || got.encoding != "gzip" || !strings.Contains(got.body, "per-ip")) {
				t.Errorf("429 through the stack: %+v", got)
			}
		}
	})
}

// Settled layers across chi's Mount: a CountSuccesses layer in the parent's r.Use and
// an InFlight and byte-counting layer in the mounted subrouter's r.Use, directly (one
// decision) or with chi's Compress between them (two decisions, each settled on its
// own). A 503 and a panic under Recoverer are not charged as successes, every lease is
// released, and the bytes counted are the handler's, below Compress.
func TestSettledLayersAcrossMount(t *testing.T) {
	t.Parallel()
	protos(t, func(t *testing.T, h2 bool) {
		for _, between := range []bool{false, true} {
			lim := newMemory(t, newClock())
			okRule := rule("ok", 10, time.Minute)
			out := rule("out", 1000, time.Minute)
			slots := ratebudget.Rule{Name: "slots", Algorithm: ratebudget.InFlight, Limit: 1, Window: time.Minute}
			outer := mustNew(t, lim, []middleware.Rule{{Rule: okRule, Identity: global, Counts: middleware.CountSuccesses(nil)}})
			inner := mustNew(t, lim, []middleware.Rule{
				{Rule: slots, Identity: global},
				{Rule: out, Identity: global, Counts: middleware.CountResponseBytes(1)},
			})
			r := chi.NewRouter()
			r.Use(quietLogger, chimw.Recoverer, outer)
			sub := chi.NewRouter()
			if between {
				sub.Use(chimw.Compress(5))
			}
			sub.Use(inner)
			sub.Get("/ok", func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/plain")
				_, _ = io.WriteString(w, strings.Repeat("k", 500))
			})
			sub.Get("/fail", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) })
			sub.Get("/panic", func(w http.ResponseWriter, r *http.Request) { panic("bug") })
			r.Mount("/api", sub)
			url, client, served := realServer(t, r, h2)
			for _, c := range []struct {
				path string
				code int
			}{{"/api/ok", 200}, {"/api/fail", 503}, {"/api/panic", 500}} {
				if got := get(t, client, url+c.path, "text/plain", h2); got.code != c.code {
					t.Fatalf("Compress between %v: %s: %d, want %d", between, c.path, got.code, c.code)
				}
				<-served
			}
			for _, c := range []struct {
				r    ratebudget.Rule
				want int64
			}{{okRule, 1}, {out, 500}, {slots, 0}} {
				if n := spent(t, lim, c.r); n != c.want {
					t.Errorf("Compress between %v: %s: %d charged, want %d", between, c.r.Name, n, c.want)
				}
			}
		}
	})
}
