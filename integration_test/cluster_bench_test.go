package integration_test

import (
	"context"
	"hash/fnv"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/lua"
)

// BenchmarkClusterServiceBudget: a service-wide budget on a three-master Redis
// Cluster, decided for 64 concurrent callers of distinct identities, as one key (one
// slot, one master, every decision there) and partitioned into 16 sub-budgets of a
// sixteenth of the limit each, an identity's by a stable hash of it (sixteen slots,
// spread over the masters). Both in one run, so that the ratio is fair; the figures are
// in docs/CLUSTER.md.
func BenchmarkClusterServiceBudget(b *testing.B) {
	const callers, parts = 64, 16
	c, nodes := redistest.StartCluster(b, 3)
	l, err := lua.New(c, lua.WithPrefix(uniquePrefix(b)))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	parallelism := (callers + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0)
	const limit = 1 << 40 // never refuses: the benchmark measures the store's throughput
	var seq atomic.Int64
	bench := func(name string, check func(id string) ratebudget.Check) {
		b.Run(name, func(b *testing.B) {
			before := make([]float64, len(nodes))
			for i, n := range nodes {
				before[i] = cpuSeconds(b, n)
			}
			start := time.Now()
			defer func() {
				// The busiest master's CPU share: one key's master is the ceiling.
				busiest := 0.0
				for i, n := range nodes {
					busiest = max(busiest, cpuSeconds(b, n)-before[i])
				}
				b.ReportMetric(100*busiest/time.Since(start).Seconds(), "busiest-master-cpu-%")
			}()
			b.SetParallelism(parallelism)
			b.RunParallel(func(pb *testing.PB) {
				checks := []ratebudget.Check{check("client-" + strconv.FormatInt(seq.Add(1), 10))}
				for pb.Next() {
					if _, err := l.Allow(ctx, checks); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
	whole := ratebudget.Rule{Name: "service", Limit: limit, Window: time.Minute}
	part := ratebudget.Rule{Name: "service", Limit: limit / parts, Window: time.Minute}
	for range 2 { // alternated, twice
		bench("one-key", func(string) ratebudget.Check { return ratebudget.Check{Rule: whole, Cost: 1} })
		bench("16-parts", func(id string) ratebudget.Check {
			h := fnv.New32a()
			h.Write([]byte(id))
			return ratebudget.Check{Rule: part, Identity: "part-" + strconv.Itoa(int(h.Sum32()%parts)), Cost: 1}
		})
	}
}

// cpuSeconds is the server's CPU time so far (INFO cpu: user and system).
func cpuSeconds(tb testing.TB, s *redistest.Server) float64 {
	tb.Helper()
	info, err := s.Client(tb).InfoMap(context.Background(), "cpu").Result()
	if err != nil {
		tb.Fatal(err)
	}
	u, _ := strconv.ParseFloat(info["CPU"]["used_cpu_user"], 64)
	sy, _ := strconv.ParseFloat(info["CPU"]["used_cpu_sys"], 64)
	return u + sy
}
