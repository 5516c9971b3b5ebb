package integration_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"github.com/redis/go-redis/v9"
	"github.com/testcontainers/testcontainers-go"
	tcredis "github.com/testcontainers/testcontainers-go/modules/redis"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/keyfuncs"
	"github.com/ratebudget/ratebudget/middleware"
)

// faultRedis is a Redis container of one test's own, for faults (stop, pause, restart,
// memory limits) that would disturb the container the other tests share.
type faultRedis struct {
	ctr  *tcredis.RedisContainer
	addr atomic.Pointer[string] // "host:port"; the mapped port changes on restart
}

func startFaultRedis(t *testing.T) *faultRedis {
	t.Helper()
	requireRedis(t) // the engine works (or the test skips/fails as the others do)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ctr, image, err := runRedisContainer(ctx)
	testcontainers.CleanupContainer(t, ctr)
	if err != nil {
		t.Fatalf("starting a dedicated %s: %v", image, err)
	}
	f := &faultRedis{ctr: ctr}
	f.readAddr(t)
	return f
}

func (f *faultRedis) readAddr(t *testing.T) {
	t.Helper()
	url, err := f.ctr.ConnectionString(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	opts, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	f.addr.Store(&opts.Addr)
}

func (f *faultRedis) Addr() string { return *f.addr.Load() }

// client returns a client of this container built from opts (its Addr is replaced),
// closed when the test ends.
func (f *faultRedis) client(t *testing.T, opts *redis.Options) *redis.Client {
	t.Helper()
	o := *opts
	o.Addr = f.Addr()
	c := redis.NewClient(&o)
	t.Cleanup(func() { c.Close() })
	return c
}

// dialer dials the container's current address, so a client that uses it keeps working
// after a restart moves the mapped port.
func (f *faultRedis) dialer(timeout time.Duration) func(ctx context.Context, network, _ string) (net.Conn, error) {
	return func(ctx context.Context, network, _ string) (net.Conn, error) {
		d := net.Dialer{Timeout: timeout}
		return d.DialContext(ctx, network, f.Addr())
	}
}

// control is a client for the test's own commands (INFO, CONFIG, GET), never faulted.
func (f *faultRedis) control(t *testing.T) *redis.Client {
	return f.client(t, clientOptions("", 2))
}

func (f *faultRedis) stop(t *testing.T) {
	t.Helper()
	d := 10 * time.Second
	if err := f.ctr.Stop(ctxT(t), &d); err != nil {
		t.Fatal(err)
	}
}

// start starts a stopped container again and re-reads its address.
func (f *faultRedis) start(t *testing.T) {
	t.Helper()
	if err := f.ctr.Start(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	f.readAddr(t)
}

// pause freezes the container (docker pause: the cgroup freezer). TCP still connects
// and takes the bytes; nothing answers: a hung store. It is unpaused before the
// container is terminated.
func (f *faultRedis) pause(t *testing.T) {
	t.Helper()
	dc := dockerClient(t)
	if _, err := dc.ContainerPause(ctxT(t), f.ctr.GetContainerID(), client.ContainerPauseOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // runs before the container's own cleanup (LIFO)
		_, _ = dc.ContainerUnpause(context.Background(), f.ctr.GetContainerID(), client.ContainerUnpauseOptions{})
	})
}

func (f *faultRedis) unpause(t *testing.T) {
	t.Helper()
	if _, err := dockerClient(t).ContainerUnpause(ctxT(t), f.ctr.GetContainerID(), client.ContainerUnpauseOptions{}); err != nil {
		t.Fatal(err)
	}
}

func dockerClient(t *testing.T) *testcontainers.DockerClient {
	t.Helper()
	dc, err := testcontainers.NewDockerClientWithOpts(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dc.Close() })
	return dc
}

// recommendedOptions are the client settings the README recommends for the limiter:
// no command retries (a re-sent script spends twice), the context's deadline on the
// socket, short timeouts, and one dial attempt (go-redis's default of 5 attempts 100ms
// apart makes a refused connection cost the whole decision deadline).
func recommendedOptions() *redis.Options {
	o := clientOptions("", 8)
	o.DialerRetries = 1
	return o
}

// defaultOptions are go-redis's defaults (3 retries, 5s dial and read timeouts) but for
// ContextTimeoutEnabled, which lua.New requires. The middleware's deadline must hold
// even with them.
func defaultOptions() *redis.Options { return &redis.Options{ContextTimeoutEnabled: true} }

// scriptCalls counts, with a go-redis hook, the script commands a client processes:
// one per Process call (EVALSHA, and EVAL after a NOSCRIPT). go-redis's own retries
// happen below the hook and are not counted here.
type scriptCalls struct{ evalsha, eval atomic.Int64 }

func countScripts(c *redis.Client) *scriptCalls {
	s := &scriptCalls{}
	c.AddHook(s)
	return s
}

func (s *scriptCalls) total() int64 { return s.evalsha.Load() + s.eval.Load() }

func (s *scriptCalls) DialHook(next redis.DialHook) redis.DialHook { return next }
func (s *scriptCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (s *scriptCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		switch strings.ToLower(cmd.Name()) {
		case "evalsha":
			s.evalsha.Add(1)
		case "eval":
			s.eval.Add(1)
		}
		return next(ctx, cmd)
	}
}

// serverScriptCalls reads INFO commandstats: the evalsha and eval commands the server
// received and answered, executed (calls, including those answered with an error such
// as NOSCRIPT or OOM) or rejected before execution (rejected_calls).
func serverScriptCalls(t *testing.T, c *redis.Client) (evalsha, eval int64) {
	t.Helper()
	info, err := c.Info(ctxT(t), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	count := func(stats string) (n int64) {
		for _, kv := range strings.Split(stats, ",") {
			k, v, _ := strings.Cut(kv, "=")
			if k == "calls" || k == "rejected_calls" {
				x, _ := strconv.ParseInt(v, 10, 64)
				n += x
			}
		}
		return n
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "cmdstat_evalsha:"); ok {
			evalsha = count(v)
		}
		if v, ok := strings.CutPrefix(line, "cmdstat_eval:"); ok {
			eval = count(v)
		}
	}
	return evalsha, eval
}

// events records the middleware's events.
type events struct {
	mu  sync.Mutex
	all []middleware.Event
}

func (e *events) observe(ev middleware.Event) {
	ev.Request = nil // not retained
	e.mu.Lock()
	e.all = append(e.all, ev)
	e.mu.Unlock()
}

func (e *events) since(n int) []middleware.Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]middleware.Event(nil), e.all[n:]...)
}

func (e *events) len() int { e.mu.Lock(); defer e.mu.Unlock(); return len(e.all) }

// transitions records breaker transitions as "closed>open" and "open>closed".
type transitions struct {
	mu  sync.Mutex
	all []string
}

func (tr *transitions) observe(open bool) {
	tr.mu.Lock()
	if open {
		tr.all = append(tr.all, "closed>open")
	} else {
		tr.all = append(tr.all, "open>closed")
	}
	tr.mu.Unlock()
}

func (tr *transitions) get() []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append([]string(nil), tr.all...)
}

var okHandler = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })

// faultHandler is the real middleware on a lua.Limiter of c (a fresh prefix), one
// global rule of limit per minute, with the decision deadline given.
func faultHandler(t *testing.T, c *redis.Client, limit int64, deadline time.Duration, opts ...middleware.Option) (http.Handler, *events, string) {
	t.Helper()
	prefix := uniquePrefix(t)
	lim, err := luaNew(c, prefix)
	if err != nil {
		t.Fatal(err)
	}
	ev := &events{}
	opts = append([]middleware.Option{middleware.WithTimeout(deadline), middleware.WithObserver(ev.observe)}, opts...)
	mw, err := middleware.New(lim, []middleware.Rule{{
		Rule:     faultRule(limit),
		Identity: keyfuncs.Global(),
	}}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return mw(okHandler), ev, prefix
}

func faultRule(limit int64) ratebudget.Rule {
	return ratebudget.Rule{Name: "fault", Limit: limit, Window: time.Minute}
}

// faultKey is the Redis key of the global budget of faultHandler under prefix: its
// identity is "~global", the one keyfuncs.Global gives every request.
func faultKey(t *testing.T, prefix string, limit int64) string {
	return keyOf(prefix, ratebudget.Check{Rule: faultRule(limit), Identity: "~global", Cost: 1})
}

// serve sends one request to h and fails the test if it takes longer than bound: the
// decision deadline plus a margin generous enough for a loaded 2-core machine under
// -race, and far below what go-redis's own timeouts and retries would take.
func serve(t *testing.T, h http.Handler, bound time.Duration) (*httptest.ResponseRecorder, time.Duration) {
	t.Helper()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("GET", "/", nil)
	start := time.Now()
	h.ServeHTTP(rec, req)
	el := time.Since(start)
	if el > bound {
		t.Errorf("request took %v, want at most %v (decision deadline + margin)", el, bound)
	}
	return rec, el
}

// warm sends requests until one is admitted by Redis (a cold pool under -race can miss a
// short deadline once), and fails after a few tries.
func warm(t *testing.T, h http.Handler, ev *events) {
	t.Helper()
	for range 10 {
		n := ev.len()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
		if got := ev.since(n); rec.Code == 200 && len(got) == 1 && got[0].Result == middleware.Allowed && !got[0].Fallback {
			return
		}
	}
	t.Fatal("no decision from Redis in 10 tries before the fault")
}

func storeErr(t *testing.T, e middleware.Event) *ratebudget.StoreError {
	t.Helper()
	var se *ratebudget.StoreError
	if !errors.As(e.Err, &se) {
		t.Fatalf("event %v: error %v, want a *ratebudget.StoreError", e.Result, e.Err)
	}
	return se
}

// proxy is an in-process TCP proxy in front of Redis that can lose the replies to script
// calls: the request reaches Redis and runs, the reply is read from Redis and dropped,
// and both connections are closed. Other replies (the connection handshake) pass.
type proxy struct {
	ln       net.Listener
	upstream string
	drop     atomic.Bool
	hold     atomic.Bool   // delay replies to script calls until release is closed
	release  chan struct{} // closed by the test
	dropped  atomic.Int64  // replies dropped
	sent     chan struct{} // one value (non-blocking) per script request forwarded
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    []net.Conn
}

func startProxy(t *testing.T, upstream string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, upstream: upstream, release: make(chan struct{}), sent: make(chan struct{}, 64)}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *proxy) Addr() string { return p.ln.Addr().String() }

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.upstream)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		var pending atomic.Bool // a script request is waiting for its reply
		p.wg.Add(2)
		go func() { // client -> Redis
			defer p.wg.Done()
			defer s.Close()
			buf := make([]byte, 32<<10)
			for {
				n, err := c.Read(buf)
				if n > 0 {
					script := isScript(buf[:n])
					if script {
						pending.Store(true) // before Redis can answer
					}
					if _, werr := s.Write(buf[:n]); werr != nil {
						return
					}
					if script {
						select {
						case p.sent <- struct{}{}:
						default:
						}
					}
				}
				if err != nil {
					return
				}
			}
		}()
		go func() { // Redis -> client
			defer p.wg.Done()
			defer c.Close()
			buf := make([]byte, 32<<10)
			for {
				n, err := s.Read(buf)
				if n > 0 {
					if pending.Load() && p.hold.Load() {
						<-p.release
					}
					if pending.Load() && p.drop.Load() {
						// Redis ran the script and answered; the client never hears of it.
						p.dropped.Add(1)
						s.Close()
						return
					}
					pending.Store(false)
					if _, werr := c.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
	}
}

func isScript(b []byte) bool {
	l := bytes.ToLower(b)
	return bytes.Contains(l, []byte("\r\nevalsha\r\n")) || bytes.Contains(l, []byte("\r\neval\r\n"))
}
