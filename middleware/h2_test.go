package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/bound"
	"github.com/ratebudget/ratebudget/internal/limitertest"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/keyfuncs"
	"github.com/ratebudget/ratebudget/lua"
	"github.com/ratebudget/ratebudget/middleware"
)

// spentBy is spent for identity id.
func spentBy(t *testing.T, lim limitertest.Settler, rule ratebudget.Rule, id string) int64 {
	t.Helper()
	checks := []ratebudget.Check{{Rule: rule, Identity: id, Cost: 1}}
	tickets := make([]ratebudget.Ticket, 1)
	d, err := lim.Reserve(context.Background(), checks, tickets, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !d.Allowed {
		return rule.Limit
	}
	if err := lim.Settle(context.Background(), checks, tickets, nil); err != nil {
		t.Fatal(err)
	}
	return rule.Limit - d.Remaining - 1
}

// h2Server serves h over HTTP/2, over TLS or, with clear, over h2c (prior knowledge),
// and returns a client whose requests share one connection, and the number of
// connections the server accepted.
func h2Server(t *testing.T, h http.Handler, clear bool) (url string, client *http.Client, conns *atomic.Int64) {
	t.Helper()
	conns = new(atomic.Int64)
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	if clear {
		var p http.Protocols
		p.SetUnencryptedHTTP2(true)
		srv.Config.Protocols = &p
		srv.Start()
		// One client connection, not a Transport's pool: on a loaded machine the pool
		// was seen to dial a connection for each request of the burst below.
		tr := &http.Transport{Protocols: &p, DisableCompression: true}
		cc, err := tr.NewClientConn(context.Background(), "http", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cc.Close() })
		client = &http.Client{Transport: cc}
	} else {
		srv.EnableHTTP2 = true
		srv.StartTLS()
		client = srv.Client()
		client.Transport.(*http.Transport).DisableCompression = true
	}
	t.Cleanup(srv.Close)
	return srv.URL, client, conns
}

// Many concurrent streams of one HTTP/2 connection, two clients on it (X-Client): each
// client's in-flight limit of k admits exactly k of its n streams while they run, the
// others are refused at once, without waiting for the admitted ones, and every lease
// is released once they return. Over TLS and h2c, on Memory and on Redis.
func TestStreamsOfOneConnection(t *testing.T) {
	t.Parallel()
	const n, k = 24, 5
	limiters := map[string]func(t *testing.T) limitertest.Settler{
		"memory": func(t *testing.T) limitertest.Settler { return newMemory(t, newClock()) },
		"redis": func(t *testing.T) limitertest.Settler {
			lim, err := lua.New(redistest.Start(t).Client(t), lua.WithPrefix("streams"))
			if err != nil {
				t.Fatal(err)
			}
			return lim
		},
	}
	for name, newLim := range limiters {
		for _, clear := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/h2c=%v", name, clear), func(t *testing.T) {
				t.Parallel()
				lim := newLim(t)
				slots := ratebudget.Rule{Name: "slots", Algorithm: ratebudget.InFlight, Limit: k, Window: time.Minute}
				calls := rule("calls", 2*k, time.Minute)
				release := make(chan struct{})
				h := mustNew(t, lim, []middleware.Rule{
					{Rule: slots, Identity: keyfuncs.Header("X-Client")},
					{Rule: calls, Identity: keyfuncs.Header("X-Client"), Counts: middleware.CountSuccesses(nil)},
				}, middleware.WithTimeout(10*time.Second))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					w.WriteHeader(http.StatusOK)
					_ = http.NewResponseController(w).Flush()
					if r.Header.Get("X-Client") != "warm" {
						<-release
					}
				}))
				url, client, conns := h2Server(t, h, clear)
				// One request first, so that every stream goes on its connection.
				req, _ := http.NewRequest("GET", url, nil)
				req.Header.Set("X-Client", "warm")
				if code, _ := fetch(t, client, req, true); code != 200 {
					t.Fatalf("warm-up: %d", code)
				}
				type result struct {
					client string
					code   int
					resp   *http.Response
				}
				results := make(chan result, 2*n)
				for _, id := range []string{"a", "b"} {
					for range n {
						go func() {
							req, _ := http.NewRequest("GET", url, nil)
							req.Header.Set("X-Client", id)
							resp, err := client.Do(req)
							if err != nil {
								t.Error(err)
								results <- result{id, 0, nil}
								return
							}
							if resp.ProtoMajor != 2 {
								t.Errorf("a response over %s", resp.Proto)
							}
							results <- result{id, resp.StatusCode, resp}
						}()
					}
				}
				admitted := map[string]int{}
				var open []*http.Response
				for range 2 * n {
					r := <-results
					switch r.code {
					case 200:
						admitted[r.client]++
						open = append(open, r.resp)
					case 429:
						_, _ = io.ReadAll(r.resp.Body)
						r.resp.Body.Close()
					case 0:
					default:
						t.Errorf("client %s: status %d", r.client, r.code)
						r.resp.Body.Close()
					}
				}
				// Every refusal came while the admitted streams were still running.
				if admitted["a"] != k || admitted["b"] != k {
					t.Errorf("admitted %v of %d streams each, want %d each", admitted, n, k)
				}
				close(release)
				for _, resp := range open {
					_, _ = io.ReadAll(resp.Body)
					resp.Body.Close()
				}
				if c := conns.Load(); c != 1 {
					t.Errorf("%d connections, want 1", c)
				}
				// A response's end comes after its handler returned and was settled.
				for _, id := range []string{"a", "b"} {
					if s := spentBy(t, lim, slots, id); s != 0 {
						t.Errorf("client %s: %d leases held after every stream ended, want 0", id, s)
					}
					if s := spentBy(t, lim, calls, id); s != k {
						t.Errorf("client %s: %d calls charged, want the %d admitted", id, s, k)
					}
				}
			})
		}
	}
}

// every contract at once, for the client-gone tests: what each rule is charged.
type contracts struct {
	lim                               limitertest.Settler
	attempts, successes, in, out, hdr ratebudget.Rule
	slots                             ratebudget.Rule
}

func newContracts(t *testing.T, lim limitertest.Settler) (*contracts, func(http.Handler) http.Handler) {
	c := &contracts{
		lim:       lim,
		attempts:  rule("attempts", 10, time.Minute),
		successes: rule("successes", 10, time.Minute),
		in:        rule("in", bound.MaxLimit/4, time.Minute),
		out:       rule("out", bound.MaxLimit/4, time.Minute),
		hdr:       rule("hdr", 100, time.Minute),
		slots:     ratebudget.Rule{Name: "slots", Algorithm: ratebudget.InFlight, Limit: 1, Window: time.Minute},
	}
	return c, mustNew(t, c.lim, []middleware.Rule{
		{Rule: c.attempts, Identity: global},
		{Rule: c.successes, Identity: global, Counts: middleware.CountSuccesses(nil)},
		{Rule: c.in, Identity: global, Counts: middleware.CountRequestBytes()},
		{Rule: c.out, Identity: global, Counts: middleware.CountResponseBytes(3)},
		{Rule: c.hdr, Identity: global, Counts: middleware.CountResponseHeader(5, "X-Cost")},
		{Rule: c.slots, Identity: global},
	}, middleware.WithTimeout(10*time.Second))
}

// limiters runs f on Memory and on the Redis limiter.
func limiters(t *testing.T, f func(t *testing.T, lim func() limitertest.Settler)) {
	t.Run("memory", func(t *testing.T) {
		t.Parallel()
		f(t, func() limitertest.Settler { return newMemory(t, newClock()) })
	})
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		client := redistest.Start(t).Client(t)
		var n atomic.Int64
		f(t, func() limitertest.Settler {
			lim, err := lua.New(client, lua.WithPrefix(fmt.Sprint("gone", n.Add(1))))
			if err != nil {
				t.Fatal(err)
			}
			return lim
		})
	})
}

func (c *contracts) check(t *testing.T, what string, attempts, successes, in, out, hdr int64) {
	t.Helper()
	for _, w := range []struct {
		r    ratebudget.Rule
		want int64
	}{{c.attempts, attempts}, {c.successes, successes}, {c.in, in}, {c.out, out}, {c.hdr, hdr}, {c.slots, 0}} {
		if n := spent(t, c.lim, w.r); n != w.want {
			t.Errorf("%s: %s charged %d, want %d", what, w.r.Name, n, w.want)
		}
	}
}

// A client that resets its stream (HTTP/2) or closes its connection (HTTP/1.1) while
// it sends the body: every contract charges what it charges for a client that stays,
// given what the handler saw, and the lease is released.
func TestClientGoneMidRequestBody(t *testing.T) {
	t.Parallel()
	limiters(t, func(t *testing.T, newLim func() limitertest.Settler) {
		protos(t, func(t *testing.T, h2 bool) {
			for _, length := range []int64{-1, 1 << 20} {
				c, limit := newContracts(t, newLim())
				var read atomic.Int64
				var readErr atomic.Value
				got := make(chan struct{})
				h := limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					w.Header().Set("X-Cost", "7")
					n, err := io.ReadFull(r.Body, make([]byte, 1000))
					read.Add(int64(n))
					close(got)
					if err != nil {
						t.Errorf("first read: %v", err)
						return
					}
					m, err := io.Copy(io.Discard, r.Body)
					read.Add(m)
					readErr.Store(fmt.Sprint(err))
				}))
				url, client, served := realServer(t, h, h2)
				pr, pw := io.Pipe()
				ctx, cancel := context.WithCancel(context.Background())
				req, _ := http.NewRequestWithContext(ctx, "POST", url, pr)
				req.ContentLength = length
				go func() {
					// The body's first 64 KiB, then nothing: it never ends before the client
					// goes. (Written on until the pipe closed, a loaded machine could send all
					// 1 MiB, and get the handler's answer, before the cancel below ran.)
					for sent := 0; sent < 64<<10; sent += 4096 {
						if _, err := pw.Write(make([]byte, 4096)); err != nil {
							return
						}
					}
				}()
				go func() {
					<-got
					cancel()
					pw.CloseWithError(errors.New("client gone")) // else HTTP/1.1 may wait for the body
				}()
				if resp, err := client.Do(req); err == nil {
					resp.Body.Close()
					t.Errorf("length %d: a response (%d) to a request canceled mid-body", length, resp.StatusCode)
				}
				<-served
				t.Logf("length %d: read %d, then %v", length, read.Load(), readErr.Load())
				in := length
				if length < 0 {
					in = read.Load()
					if in < 1000 {
						t.Errorf("length %d: the handler read %d bytes", length, in)
					}
				}
				c.check(t, fmt.Sprintf("length %d", length), 1, 1, in, 0, 7)
			}
		})
	})
}

// A client that resets its stream (HTTP/2) or closes its connection (HTTP/1.1) while
// the response's body is sent: every contract charges the response as written up to
// then (a 200, the bytes net/http took, the cost header sent first), and the lease is
// released.
func TestClientGoneMidResponseBody(t *testing.T) {
	t.Parallel()
	limiters(t, func(t *testing.T, newLim func() limitertest.Settler) {
		protos(t, func(t *testing.T, h2 bool) {
			for _, how := range []string{"write", "flush", "readfrom"} {
				c, limit := newContracts(t, newLim())
				var accepted atomic.Int64
				chunk := []byte(strings.Repeat("z", 16<<10))
				h := limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					w.Header().Set("X-Cost", "7")
					rc := http.NewResponseController(w)
					for r.Context().Err() == nil {
						var n int64
						var err error
						switch how {
						case "readfrom":
							n, err = w.(io.ReaderFrom).ReadFrom(strings.NewReader(string(chunk)))
						default:
							var k int
							k, err = w.Write(chunk)
							n = int64(k)
							if err == nil && how == "flush" {
								err = rc.Flush()
							}
						}
						accepted.Add(n)
						if err != nil {
							return
						}
					}
				}))
				url, client, served := realServer(t, h, h2)
				leaveMidBody(t, client, url, served, 1<<20)
				if accepted.Load() < 1<<20 {
					t.Errorf("%s: %d bytes accepted", how, accepted.Load())
				}
				c.check(t, how, 1, 1, 0, accepted.Load(), 7)
			}
		})
	})
}

// http.ResponseController through a settled rule's writer does what it does without the
// middleware: flush, full duplex, read and write deadlines, over both protocols; and a
// full-duplex echo over it is charged both ways.
func TestResponseControllerThroughSettledWriter(t *testing.T) {
	t.Parallel()
	protos(t, func(t *testing.T, h2 bool) {
		calls := func(w http.ResponseWriter) string {
			rc := http.NewResponseController(w)
			return fmt.Sprint(rc.EnableFullDuplex(), rc.SetReadDeadline(time.Now().Add(time.Minute)),
				rc.SetWriteDeadline(time.Now().Add(time.Minute)), rc.Flush(),
				rc.SetReadDeadline(time.Time{}), rc.SetWriteDeadline(time.Time{}))
		}
		results := make(chan string, 2)
		for _, wrap := range []bool{false, true} {
			c, limit := newContracts(t, newMemory(t, newClock()))
			var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				results <- calls(w)
				buf := make([]byte, 4)
				for {
					if _, err := io.ReadFull(r.Body, buf); err != nil {
						return
					}
					if _, err := w.Write(buf); err != nil {
						return
					}
					if err := http.NewResponseController(w).Flush(); err != nil {
						return
					}
				}
			})
			if wrap {
				h = limit(h)
			}
			url, client, served := realServer(t, h, h2)
			pr, pw := io.Pipe()
			req, _ := http.NewRequest("POST", url, pr)
			req.ContentLength = -1
			go func() { _, _ = pw.Write([]byte("ping")) }()
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			for i := range 3 {
				got := make([]byte, 4)
				if _, err := io.ReadFull(resp.Body, got); err != nil || string(got) != "ping" {
					t.Fatalf("echo %d: %q, %v", i, got, err)
				}
				if i < 2 {
					go func() { _, _ = pw.Write([]byte("ping")) }()
				}
			}
			pw.Close()
			_, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
			<-served
			if wrap {
				c.check(t, "echo", 1, 1, 12, 12, 5)
			}
		}
		if bare, settled := <-results, <-results; bare != settled {
			t.Errorf("ResponseController without the middleware: %s; through it: %s", bare, settled)
		} else {
			t.Logf("%s", bare)
		}
	})
}

// A handler whose body does not match the Content-Length it declared: CountResponseBytes
// charges the bytes net/http took. Over HTTP/1.1 that is none of a write past the
// length, which net/http refuses whole; over HTTP/2 net/http takes (and sends) what is
// written before the header went out, and the client sees a stream error.
func TestResponseBytesContentLengthMismatch(t *testing.T) {
	t.Parallel()
	protos(t, func(t *testing.T, h2 bool) {
		for _, c := range []struct {
			declared string
			writes   []string
			want     int64
		}{
			{"10", []string{"abcdef", "ghijkl", "mn"}, 6},
			{"100", []string{"abcdef"}, 6},
			{"10", []string{strings.Repeat("x", 64<<10)}, 0},
		} {
			lim := newMemory(t, newClock())
			out := rule("out", 1<<20, time.Minute)
			var took atomic.Int64
			h := mustNew(t, lim, []middleware.Rule{{Rule: out, Identity: global, Counts: middleware.CountResponseBytes(1)}})(
				http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					w.Header().Set("Content-Length", c.declared)
					for _, s := range c.writes {
						n, _ := io.WriteString(w, s)
						took.Add(int64(n))
					}
				}))
			url, client, served := realServer(t, h, h2)
			req, _ := http.NewRequest("GET", url, nil)
			if resp, err := client.Do(req); err == nil {
				_, _ = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
			<-served
			if !h2 && took.Load() != c.want {
				t.Errorf("declared %s, %d writes: net/http took %d, want %d", c.declared, len(c.writes), took.Load(), c.want)
			}
			if n := spent(t, lim, out); n != took.Load() {
				t.Errorf("declared %s, %d writes: %d bytes charged, net/http took %d", c.declared, len(c.writes), n, took.Load())
			}
		}
	})
}
