package memory_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/bound"
	"github.com/ratebudget/ratebudget/internal/cputime"
	"github.com/ratebudget/ratebudget/memory"
)

// footprintRule is a per-client rule whose window outlasts any measurement, so that every
// budget created is still held when it is counted.
var footprintRule = ratebudget.Rule{Name: "per-client", Algorithm: ratebudget.FixedWindow, Limit: 100, Window: time.Hour}

// rotatingIPv4 returns the i-th identity of a rotating client population: an IPv4 address
// as a key function would produce it, a fresh string each time.
func rotatingIPv4(i int) string {
	u := uint32(i)*2654435761 + 0x0a000000
	return strconv.Itoa(int(u>>24)) + "." + strconv.Itoa(int(u>>16&0xff)) + "." +
		strconv.Itoa(int(u>>8&0xff)) + "." + strconv.Itoa(int(u&0xff))
}

// vmRSS reads this process's resident set size in bytes from /proc/self/status, or 0
// where that file does not exist.
func vmRSS(t *testing.T) int64 {
	t.Helper()
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	return 0
}

// TestMemoryFootprint measures what rotating identities cost the in-process limiter. It
// runs only when RATEBUDGET_FOOTPRINT is set to a number of identities N (and, optionally,
// RATEBUDGET_FOOTPRINT_MAX to a WithMaxBudgets value): it admits one request of each of N
// rotating identities under one per-client rule, and logs the budgets held, the growth of
// the live heap (after a collection) and of the resident set, per 100,000 identities.
//
//	RATEBUDGET_FOOTPRINT=1000000 go test -count=1 -run Footprint -v .
func TestMemoryFootprint(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("RATEBUDGET_FOOTPRINT"))
	if n <= 0 {
		t.Skip("set RATEBUDGET_FOOTPRINT to a number of identities to measure")
	}
	var opts []memory.Option
	if v := os.Getenv("RATEBUDGET_FOOTPRINT_MAX"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("RATEBUDGET_FOOTPRINT_MAX=%s: %v", v, err)
		}
		opts = append(opts, memory.WithMaxBudgets(n))
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	rss0 := vmRSS(t)
	m, err := memory.New(opts...)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	checks := []ratebudget.Check{{Rule: footprintRule, Scope: "/api/jobs", Cost: 1}}
	start := time.Now()
	for i := range n {
		checks[0].Identity = rotatingIPv4(i)
		if d, err := m.Allow(ctx, checks); err != nil || !d.Allowed {
			t.Fatalf("identity %d: %+v %v", i, d, err)
		}
	}
	elapsed := time.Since(start)
	rss1 := vmRSS(t)
	runtime.GC()
	runtime.ReadMemStats(&after)
	held := m.Len()
	per := func(b int64) string { return fmt.Sprintf("%.1f MB", float64(b)/float64(n)*100_000/1e6) }
	t.Logf("%d identities, %d budgets held, %v per decision", n, held, elapsed/time.Duration(n))
	t.Logf("per 100,000 identities: live heap +%s (%d B per budget held), RSS +%s",
		per(int64(after.HeapAlloc)-int64(before.HeapAlloc)),
		(int64(after.HeapAlloc)-int64(before.HeapAlloc))/int64(max(held, 1)),
		per(rss1-rss0))
	runtime.KeepAlive(m)
}

// cpuTime returns the CPU time this process has used, every thread included (the garbage
// collector's too), so that a benchmark on a shared machine can report CPU time per
// operation besides wall time; or -1 where it cannot be read (see cputime.Process).
func cpuTime(b *testing.B) time.Duration {
	d, err := cputime.Process()
	if errors.Is(err, errors.ErrUnsupported) {
		return -1
	}
	if err != nil {
		b.Fatal(err)
	}
	return d
}

// reportCPU reports the CPU time per operation since start as "cpu-ns/op", where it can
// be read (start is not negative).
func reportCPU(b *testing.B, start time.Duration) {
	if start < 0 {
		return
	}
	b.ReportMetric(float64(cpuTime(b)-start)/float64(b.N), "cpu-ns/op")
}

// BenchmarkMemoryAllowAtSize: one check of an identity the limiter already tracks, picked
// at random among entries budgets, each lookup with a fresh copy of the identity string
// (as a key function would make), the real clock.
func BenchmarkMemoryAllowAtSize(b *testing.B) {
	for _, entries := range []int{1_000, 100_000, 1_000_000} {
		b.Run(fmt.Sprintf("entries=%d", entries), func(b *testing.B) {
			if entries > 10_000 && testing.Short() {
				b.Skip("large fill skipped in -short mode")
			}
			// A cap with room for the shards' uneven shares: nothing is evicted.
			m, err := memory.New(memory.WithMaxBudgets(2 * entries))
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			checks := []ratebudget.Check{{Rule: benchRule, Scope: "/api/jobs", Cost: 1}}
			for i := range entries {
				checks[0].Identity = rotatingIPv4(i)
				if d, err := m.Allow(ctx, checks); err != nil || !d.Allowed {
					b.Fatalf("%+v %v", d, err)
				}
			}
			if m.Len() != entries {
				b.Fatalf("Len %d, want %d", m.Len(), entries)
			}
			const lookups = 1 << 16
			ids := make([]string, lookups)
			rng := rand.New(rand.NewPCG(1, 2))
			for i := range ids {
				ids[i] = rotatingIPv4(rng.IntN(entries))
			}
			runtime.GC()
			i := 0
			b.ReportAllocs()
			b.ResetTimer()
			cpu := cpuTime(b)
			for b.Loop() {
				checks[0].Identity = ids[i%lookups]
				i++
				if d, err := m.Allow(ctx, checks); err != nil || !d.Allowed {
					b.Fatalf("%+v %v", d, err)
				}
			}
			reportCPU(b, cpu)
		})
	}
}

// BenchmarkMemoryAllowNewIdentity: every decision is the first of a new identity (a
// rotating population), into a limiter with the default options that has already seen
// 1,000,000 identities (and so is at its cap, the default 100,000).
func BenchmarkMemoryAllowNewIdentity(b *testing.B) {
	if testing.Short() {
		b.Skip("large fill skipped in -short mode")
	}
	const entries = 1_000_000
	m, err := memory.New()
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	checks := []ratebudget.Check{{Rule: benchRule, Scope: "/api/jobs", Cost: 1}}
	next := 0
	for ; next < entries; next++ {
		checks[0].Identity = rotatingIPv4(next)
		if d, err := m.Allow(ctx, checks); err != nil || !d.Allowed {
			b.Fatalf("%+v %v", d, err)
		}
	}
	runtime.GC()
	b.ReportAllocs()
	b.ResetTimer()
	cpu := cpuTime(b)
	for b.Loop() {
		checks[0].Identity = "new-" + strconv.Itoa(next)
		next++
		if d, err := m.Allow(ctx, checks); err != nil || !d.Allowed {
			b.Fatalf("%+v %v", d, err)
		}
	}
	reportCPU(b, cpu)
}

// BenchmarkMemorySweepLatency: the latency of single decisions while the budgets of a
// past flood expire. budgets identities are admitted under a one-second rule, then the
// clock (WithClock) moves past their windows and a sweep interval, so that every shard
// holds its share of expired budgets and is due for a sweep; then 40,000 decisions of
// steady traffic (10,000 identities under a rule of one hour, each decided four times,
// new budgets first) are timed one by one. Over every decision of every iteration it
// reports the slowest ("max-ns"), the 99.9th and 99th percentiles and the median of the
// decisions' wall time, the mean ("ns/decision"), and where the thread's CPU time can be
// read (Linux) the same of each decision's CPU time ("cpu-max-ns" ...), which a loaded
// machine does not inflate by preempting the benchmark, and the decisions that used more
// than 100 µs of CPU per iteration ("slow/op"). Once the traffic ends, only its own
// budgets may be held: the flood's must all have been reclaimed.
//
//	go test -run '^$' -bench MemorySweepLatency -benchtime 3x .
func BenchmarkMemorySweepLatency(b *testing.B) {
	for _, budgets := range []int{100_000, 640_000} {
		b.Run(fmt.Sprintf("budgets=%d", budgets), func(b *testing.B) {
			if budgets > 100_000 && testing.Short() {
				b.Skip("large fill skipped in -short mode")
			}
			const decisions, live = 40_000, 10_000
			flood := ratebudget.Rule{Name: "flood", Limit: 1, Window: time.Second}
			traffic := ratebudget.Rule{Name: "traffic", Limit: bound.MaxLimit, Window: time.Hour}
			ids := make([]string, live)
			for i := range ids {
				ids[i] = rotatingIPv4(budgets + i)
			}
			ctx := context.Background()
			wall := make([]time.Duration, 0, b.N*decisions)
			cpu := make([]time.Duration, 0, b.N*decisions)
			runtime.LockOSThread() // for threadCPU
			defer runtime.UnlockOSThread()
			_, cpuOK := threadCPU()
			slow := 0
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				clk := newFakeClock()
				// A cap with room for the shards' uneven shares: nothing is evicted.
				m, err := memory.New(memory.WithClock(clk.Now), memory.WithMaxBudgets(2*budgets))
				if err != nil {
					b.Fatal(err)
				}
				checks := []ratebudget.Check{{Rule: flood, Cost: 1}}
				for i := range budgets {
					checks[0].Identity = rotatingIPv4(i)
					if d, err := m.Allow(ctx, checks); err != nil || !d.Allowed {
						b.Fatalf("%+v %v", d, err)
					}
				}
				clk.Advance(time.Second + 10*time.Second) // the windows and the default sweep interval
				checks[0].Rule = traffic
				runtime.GC()
				b.StartTimer()
				for i := range decisions {
					checks[0].Identity = ids[i%live]
					c0, _ := threadCPU()
					start := time.Now()
					d, err := m.Allow(ctx, checks)
					el := time.Since(start)
					c1, _ := threadCPU()
					if err != nil || !d.Allowed {
						b.Fatalf("%+v %v", d, err)
					}
					wall = append(wall, el)
					cpu = append(cpu, c1-c0)
					if c1-c0 > 100*time.Microsecond {
						slow++
					}
				}
				b.StopTimer()
				if n := m.Len(); n != live {
					b.Fatalf("Len %d after the traffic, want its %d budgets: the flood's were not all reclaimed", n, live)
				}
			}
			var sum time.Duration
			for _, d := range wall {
				sum += d
			}
			report := func(prefix string, lat []time.Duration) {
				slices.Sort(lat)
				at := func(q float64) float64 { return float64(lat[min(len(lat)-1, int(q*float64(len(lat))))]) }
				b.ReportMetric(float64(lat[len(lat)-1]), prefix+"max-ns")
				b.ReportMetric(at(0.999), prefix+"p99.9-ns")
				b.ReportMetric(at(0.99), prefix+"p99-ns")
				b.ReportMetric(at(0.5), prefix+"p50-ns")
			}
			report("", wall)
			b.ReportMetric(float64(sum)/float64(len(wall)), "ns/decision")
			if cpuOK {
				report("cpu-", cpu)
				b.ReportMetric(float64(slow)/float64(b.N), "slow/op")
			}
		})
	}
}
