package wire_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/internal/wire"
)

func newConn(t *testing.T, addr string, opt wire.Options) *wire.Conn {
	t.Helper()
	opt.Dial = func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	}
	c := wire.New(opt)
	t.Cleanup(func() { c.Close() })
	return c
}

func do(ctx context.Context, c *wire.Conn, args ...any) (any, error) {
	cmd := redis.NewCmd(ctx, args...)
	err := c.Process(ctx, cmd)
	if err != nil {
		return nil, err
	}
	return cmd.Val(), nil
}

// TestConcurrentRepliesInOrder: 64 callers each increment their own counter 200 times
// on one connection; every caller sees exactly 1, 2, ..., 200, so no reply went to the
// wrong caller.
func TestConcurrentRepliesInOrder(t *testing.T) {
	srv := redistest.Start(t)
	c := newConn(t, srv.Addr, wire.Options{})
	ctx := context.Background()
	const callers, n = 64, 200
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for g := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("order:%d", g)
			for i := int64(1); i <= n; i++ {
				v, err := do(ctx, c, "incr", key)
				if err != nil || v != i {
					errs <- fmt.Errorf("caller %d: INCR %d = %v, %v", g, i, v, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestReplyKinds: integers, bulk and simple strings, nil, arrays and an error reply,
// which stays the command's own (a redis.Error) and leaves the connection usable.
func TestReplyKinds(t *testing.T) {
	srv := redistest.Start(t)
	c := newConn(t, srv.Addr, wire.Options{})
	ctx := context.Background()
	if v, err := do(ctx, c, "set", "s", "hello"); err != nil || v != "OK" {
		t.Fatalf("SET = %v, %v", v, err)
	}
	if v, err := do(ctx, c, "get", "s"); err != nil || v != "hello" {
		t.Fatalf("GET = %v, %v", v, err)
	}
	if _, err := do(ctx, c, "get", "missing"); !errors.Is(err, redis.Nil) {
		t.Fatalf("GET missing: %v, want redis.Nil", err)
	}
	v, err := do(ctx, c, "eval", "return {1, -2, 'x', {3}}", 0)
	want := []any{int64(1), int64(-2), "x", []any{int64(3)}}
	if err != nil || fmt.Sprint(v) != fmt.Sprint(want) {
		t.Fatalf("EVAL = %#v, %v, want %#v", v, err, want)
	}
	_, err = do(ctx, c, "incr", "s")
	var rErr redis.Error
	if !errors.As(err, &rErr) || !strings.Contains(err.Error(), "not an integer") {
		t.Fatalf("INCR on a string: %v, want a server error", err)
	}
	if v, err := do(ctx, c, "incr", "n"); err != nil || v != int64(1) {
		t.Fatalf("after an error reply: INCR = %v, %v", v, err)
	}
	big := strings.Repeat("b", 100<<10) // larger than the read buffer
	if _, err := do(ctx, c, "set", "big", big); err != nil {
		t.Fatal(err)
	}
	if v, err := do(ctx, c, "get", "big"); err != nil || v != big {
		t.Fatalf("GET big: %d bytes, %v", len(fmt.Sprint(v)), err)
	}
}

// TestInts: an integer-array reply is read without go-redis values; any other shape
// is an error for that call only, and the connection stays in step.
func TestInts(t *testing.T) {
	srv := redistest.Start(t)
	c := newConn(t, srv.Addr, wire.Options{})
	ctx := context.Background()
	key, n := "k", int64(7)
	got, err := c.Ints(ctx, 0, []any{"eval", "return {1, -2, tonumber(ARGV[1])}", 1, &key, &n}, nil)
	if err != nil || fmt.Sprint(got) != "[1 -2 7]" {
		t.Fatalf("Ints = %v, %v, want [1 -2 7]", got, err)
	}
	for _, tc := range []struct{ script, want string }{
		{"return {1, 'x', 3}", "element 1"},
		{"return {1, {2}, 3}", "element 1"},
		{"return 5", "reply is int64"},
		{"return redis.error_reply('ERR nope')", "ERR nope"},
		{"return nil", "redis: nil"},
	} {
		_, err := c.Ints(ctx, 0, []any{"eval", tc.script, 0}, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", tc.script, err, tc.want)
		}
		// The next reply is still the next call's.
		if got, err := c.Ints(ctx, 0, []any{"eval", "return {42}", 0}, nil); err != nil || fmt.Sprint(got) != "[42]" {
			t.Fatalf("after %s: %v, %v", tc.script, got, err)
		}
	}
	var rErr redis.Error
	if _, err := c.Ints(ctx, 0, []any{"evalsha", strings.Repeat("0", 40), 0}, nil); !errors.As(err, &rErr) || !strings.HasPrefix(err.Error(), "NOSCRIPT") {
		t.Fatalf("unknown script: %v, want a NOSCRIPT server error", err)
	}
}

// TestIntsTimeout: a timeout bounds the wait like a context deadline, and the
// connection stays usable after the frozen server thaws.
func TestIntsTimeout(t *testing.T) {
	srv := redistest.Start(t)
	c := newConn(t, srv.Addr, wire.Options{ReplyTimeout: time.Minute})
	ctx := context.Background()
	if _, err := c.Ints(ctx, time.Second, []any{"eval", "return {1}", 0}, nil); err != nil {
		t.Fatal(err)
	}
	srv.Freeze(t)
	start := time.Now()
	_, err := c.Ints(ctx, 100*time.Millisecond, []any{"eval", "return {2}", 0}, nil)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("frozen: %v, want context.DeadlineExceeded", err)
	}
	if el := time.Since(start); el < 100*time.Millisecond {
		t.Fatalf("returned after %v, before the timeout", el)
	}
	srv.Thaw(t)
	if got, err := c.Ints(ctx, time.Second, []any{"eval", "return {3}", 0}, nil); err != nil || fmt.Sprint(got) != "[3]" {
		t.Fatalf("after thaw: %v, %v", got, err)
	}
}

// TestSilentServerBoundsDial: a server that accepts connections but never answers the
// handshake holds a caller no longer than its timeout, with or without a context
// deadline, and no longer than ReplyTimeout without either.
func TestSilentServerBoundsDial(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			defer nc.Close() // read nothing, answer nothing
		}
	}()
	c := newConn(t, ln.Addr().String(), wire.Options{Password: "pw", ReplyTimeout: 300 * time.Millisecond})
	returns := func(name string, f func() error) {
		t.Helper()
		errc := make(chan error, 1)
		go func() { errc <- f() }()
		select {
		case err := <-errc:
			if err == nil {
				t.Errorf("%s: no error from a silent server", name)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: still waiting for a silent server after 5s", name)
		}
	}
	returns("Ints with a timeout", func() error {
		_, err := c.Ints(context.Background(), 100*time.Millisecond, []any{"ping"}, nil)
		return err
	})
	returns("Ints with a context deadline", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_, err := c.Ints(ctx, 0, []any{"ping"}, nil)
		return err
	})
	returns("Process without a deadline", func() error {
		_, err := do(context.Background(), c, "ping")
		return err
	})
}

// TestAuthAndDB: each new connection authenticates (AUTH user password) and selects
// its database; a wrong password is a server error and nothing is run.
func TestAuthAndDB(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	check := srv.Client(t)
	if err := check.Do(ctx, "acl", "setuser", "alice", "on", ">s3cret", "~*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	c := newConn(t, srv.Addr, wire.Options{Username: "alice", Password: "s3cret", DB: 3})
	if v, err := do(ctx, c, "acl", "whoami"); err != nil || v != "alice" {
		t.Fatalf("ACL WHOAMI = %v, %v", v, err)
	}
	if _, err := do(ctx, c, "set", "k", "v"); err != nil {
		t.Fatal(err)
	}
	db3 := redis.NewClient(&redis.Options{Addr: srv.Addr, DB: 3})
	defer db3.Close()
	if v, err := db3.Get(ctx, "k").Result(); err != nil || v != "v" {
		t.Fatalf("key in DB 3: %q, %v", v, err)
	}
	bad := newConn(t, srv.Addr, wire.Options{Username: "alice", Password: "wrong"})
	_, err := do(ctx, bad, "set", "k2", "v")
	var rErr redis.Error
	if !errors.As(err, &rErr) || !strings.Contains(err.Error(), "WRONGPASS") {
		t.Fatalf("wrong password: %v, want a WRONGPASS server error", err)
	}
	if n, _ := db3.Exists(ctx, "k2").Result(); n != 0 {
		t.Fatal("a command ran on an unauthenticated connection")
	}
	if n, _ := check.Exists(ctx, "k2").Result(); n != 0 {
		t.Fatal("a command ran on an unauthenticated connection")
	}
}

// TestFrozenServer: while the server is frozen a command ends with its context; the
// connection survives the freeze, the abandoned command's reply goes to nobody else,
// and the next command gets its own reply.
func TestFrozenServer(t *testing.T) {
	srv := redistest.Start(t)
	c := newConn(t, srv.Addr, wire.Options{ReplyTimeout: time.Minute})
	ctx := context.Background()
	if _, err := do(ctx, c, "ping"); err != nil {
		t.Fatal(err)
	}
	srv.Freeze(t)
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, err := do(short, c, "incr", "frozen"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("frozen: %v, want the context's deadline", err)
	}
	srv.Thaw(t)
	if v, err := do(ctx, c, "incr", "other"); err != nil || v != int64(1) {
		t.Fatalf("after thaw: INCR other = %v, %v, want 1", v, err)
	}
	if v, err := do(ctx, c, "get", "frozen"); err != nil || v != "1" {
		t.Fatalf("the abandoned INCR: GET = %v, %v, want it to have run once", v, err)
	}
}

// TestReplyTimeout: a connection that owes a reply for longer than ReplyTimeout is
// closed with a timeout error, even for a caller without a deadline; the next command
// dials again.
func TestReplyTimeout(t *testing.T) {
	srv := redistest.Start(t)
	c := newConn(t, srv.Addr, wire.Options{ReplyTimeout: 200 * time.Millisecond})
	ctx := context.Background()
	if _, err := do(ctx, c, "ping"); err != nil {
		t.Fatal(err)
	}
	srv.Freeze(t)
	_, err := do(ctx, c, "ping")
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("frozen server, no caller deadline: %v, want a timeout error", err)
	}
	srv.Thaw(t)
	if v, err := do(ctx, c, "ping"); err != nil || v != "PONG" {
		t.Fatalf("after thaw: %v, %v", v, err)
	}
}

// TestKilledServer: a killed server fails the command with a connection error; a dial
// to nothing is a dial error (nothing was sent).
func TestKilledServer(t *testing.T) {
	srv := redistest.Start(t)
	c := newConn(t, srv.Addr, wire.Options{})
	ctx := context.Background()
	if _, err := do(ctx, c, "ping"); err != nil {
		t.Fatal(err)
	}
	srv.Kill(t)
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := do(ctx, c, "ping")
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" {
			break // the old connection is gone and a new one was refused
		}
		if err == nil {
			t.Fatal("PING answered by a killed server")
		}
		if time.Now().After(deadline) {
			t.Fatalf("still %v, want a dial error", err)
		}
	}
}

// TestIdleClose: a connection that owed nothing for IdleTimeout is closed (the server
// sees one client fewer), and the next command dials again.
func TestIdleClose(t *testing.T) {
	srv := redistest.Start(t)
	check := srv.Client(t)
	ctx := context.Background()
	clients := func() int {
		n, err := check.ClientList(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		return strings.Count(n, "\n")
	}
	base := clients()
	c := newConn(t, srv.Addr, wire.Options{IdleTimeout: 100 * time.Millisecond})
	if _, err := do(ctx, c, "ping"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for clients() > base {
		if time.Now().After(deadline) {
			t.Fatal("the idle connection was not closed")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if v, err := do(ctx, c, "ping"); err != nil || v != "PONG" {
		t.Fatalf("after the idle close: %v, %v", v, err)
	}
}

// TestClose: after Close nothing is sent and the error is go-redis's ErrClosed.
func TestClose(t *testing.T) {
	srv := redistest.Start(t)
	c := newConn(t, srv.Addr, wire.Options{})
	ctx := context.Background()
	if _, err := do(ctx, c, "ping"); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if _, err := do(ctx, c, "ping"); !errors.Is(err, redis.ErrClosed) {
		t.Fatalf("after Close: %v, want redis.ErrClosed", err)
	}
}

// TestCloseUnderLoad: closing the connection while 32 callers keep it busy ends every
// call, each with its own reply or an error, never another call's reply.
func TestCloseUnderLoad(t *testing.T) {
	srv := redistest.Start(t)
	c := newConn(t, srv.Addr, wire.Options{})
	ctx := context.Background()
	var wg sync.WaitGroup
	var ok, failed atomic.Int64
	bad := make(chan string, 32)
	for g := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := int64(g)
			for range 300 {
				got, err := c.Ints(ctx, time.Second, []any{"eval", "return {tonumber(ARGV[1])}", 0, &n}, nil)
				switch {
				case err != nil:
					failed.Add(1)
				case len(got) != 1 || got[0] != n:
					bad <- fmt.Sprintf("caller %d got %v", g, got)
					return
				default:
					ok.Add(1)
				}
			}
		}()
	}
	for deadline := time.Now().Add(10 * time.Second); ok.Load() < 500 && time.Now().Before(deadline); {
		runtime.Gosched() // close once the connection is busy
	}
	c.Close()
	wg.Wait()
	close(bad)
	for b := range bad {
		t.Error(b)
	}
	if failed.Load() == 0 {
		t.Errorf("no call failed after Close (%d succeeded)", ok.Load())
	}
}

// TestProtocolErrors: a server speaking garbage fails the command without a panic.
func TestProtocolErrors(t *testing.T) {
	for _, reply := range []string{"?what\r\n", "$5\r\nab", ":12x\r\n", "*99999999999\r\n", "+no crlf\n"} {
		t.Run(fmt.Sprintf("%q", reply), func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			go func() {
				nc, err := ln.Accept()
				if err != nil {
					return
				}
				defer nc.Close()
				if _, err := bufio.NewReader(nc).ReadString('\n'); err != nil {
					return
				}
				nc.Write([]byte(reply))
				time.Sleep(100 * time.Millisecond) // let the client read it before EOF
			}()
			c := newConn(t, ln.Addr().String(), wire.Options{})
			if v, err := do(context.Background(), c, "ping"); err == nil {
				t.Fatalf("reply %q: got %v, want an error", reply, v)
			}
		})
	}
}
