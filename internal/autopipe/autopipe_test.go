package autopipe_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget/internal/autopipe"
	"github.com/ratebudget/ratebudget/internal/redistest"
)

var incr = redis.NewScript(`return redis.call('INCRBY', KEYS[1], ARGV[1])`)

// run sends the script through p as EVALSHA, and as EVAL after NOSCRIPT.
func run(ctx context.Context, p interface {
	Process(context.Context, redis.Cmder) error
}, key string, n int64) *redis.Cmd {
	cmd := redis.NewCmd(ctx, "evalsha", incr.Hash(), 1, key, n)
	err := p.Process(ctx, cmd)
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		cmd = redis.NewCmd(ctx, "eval", `return redis.call('INCRBY', KEYS[1], ARGV[1])`, 1, key, n)
		err = p.Process(ctx, cmd)
	}
	if err != nil {
		cmd = redis.NewCmd(ctx) // the abandoned command may still be written: not touched
		cmd.SetErr(err)
	}
	return cmd
}

func calls(t testing.TB, c *redis.Client, name string) int64 {
	t.Helper()
	info, err := c.InfoMap(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	v := info["Commandstats"]["cmdstat_"+name]
	for _, f := range strings.Split(v, ",") {
		if len(f) > 6 && f[:6] == "calls=" {
			n, _ := strconv.ParseInt(f[6:], 10, 64)
			return n
		}
	}
	return 0
}

// Concurrent calls all run exactly once, each with its own reply.
func TestConcurrentCallsRunOnceEach(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	b := autopipe.New(c, 16, 1)
	ctx := context.Background()
	if err := incr.Load(ctx, c).Err(); err != nil {
		t.Fatal(err)
	}
	const workers, each = 64, 50
	var wg sync.WaitGroup
	start := make(chan struct{})
	seen := make([]bool, workers*each+1)
	var mu sync.Mutex
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for range each {
				v, err := run(ctx, b, "ap:n", 1).Int64()
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if v < 1 || v > workers*each || seen[v] {
					t.Errorf("reply %d repeated or out of range", v)
				}
				seen[v] = true
				mu.Unlock()
			}
		}()
	}
	close(start)
	wg.Wait()
	if n, _ := c.Get(ctx, "ap:n").Int(); n != workers*each {
		t.Fatalf("counter %d, want %d", n, workers*each)
	}
	if n := calls(t, c, "evalsha"); n != workers*each {
		t.Fatalf("%d EVALSHA, want %d", n, workers*each)
	}
}

// After SCRIPT FLUSH the NOSCRIPT reply reaches Script.Run, which falls back to EVAL.
func TestNoScriptHeals(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	b := autopipe.New(c, 16, 1)
	ctx := context.Background()
	if err := run(ctx, b, "ap:h", 1).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if v, err := run(ctx, b, "ap:h", 1).Int64(); err != nil || v != 2 {
		t.Fatalf("after SCRIPT FLUSH: %d %v, want 2 (spent exactly once)", v, err)
	}
}

// A caller whose context ends while Redis hangs returns at once; calls whose context
// ended before their batch formed are never sent.
func TestContextEndsTheWait(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	b := autopipe.New(c, 16, 1)
	ctx := context.Background()
	if err := incr.Load(ctx, c).Err(); err != nil {
		t.Fatal(err)
	}
	srv.Freeze(t)
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = run(short, b, "ap:c", 1).Err()
		}()
	}
	wg.Wait() // returns only because every caller's own context ended
	for i, err := range errs {
		if !errors.Is(err, context.DeadlineExceeded) && !isTimeout(err) {
			t.Errorf("call %d: %v, want a deadline error", i, err)
		}
	}
	srv.Thaw(t)
	done, cancel2 := context.WithCancel(ctx)
	cancel2()
	if err := run(done, b, "ap:c", 1).Err(); !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled call: %v", err)
	}
	// The hung call (at most one: later ones were dropped or are uncertain) may have run.
	if n, _ := c.Get(ctx, "ap:c").Int(); n > len(errs) {
		t.Fatalf("counter %d > %d calls", n, len(errs))
	}
}

func isTimeout(err error) bool {
	var ne interface{ Timeout() bool }
	return errors.As(err, &ne) && ne.Timeout()
}

// BenchmarkEvalSha compares 64 concurrent callers of a trivial script, sent directly and
// through the batcher, against PING on the same client.
func BenchmarkEvalSha(b *testing.B) {
	srv := redistest.Start(b)
	c := srv.Client(b)
	ctx := context.Background()
	if err := incr.Load(ctx, c).Err(); err != nil {
		b.Fatal(err)
	}
	bench := func(b *testing.B, f func() error) {
		b.ReportAllocs()
		b.SetParallelism(32) // 64 goroutines on 2 CPUs
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := f(); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	b.Run("ping", func(b *testing.B) { bench(b, func() error { return c.Ping(ctx).Err() }) })
	b.Run("direct", func(b *testing.B) { bench(b, func() error { return run(ctx, c, "ap:b", 1).Err() }) })
	for _, inflight := range []int{1, 2, 4} {
		bt := autopipe.New(c, 128, inflight)
		b.Run("batched-"+strconv.Itoa(inflight), func(b *testing.B) { bench(b, func() error { return run(ctx, bt, "ap:b", 1).Err() }) })
	}
}
