package main

import (
	"strings"
	"testing"
)

func TestRun(t *testing.T) {
	in := `goos: linux
pkg: github.com/ratebudget/ratebudget/lua
BenchmarkProcess/ping-2         	   30000	      9598 ns/op	     188 B/op	       6 allocs/op
BenchmarkProcess/fixed-2        	   30000	     18691 ns/op	         0.5236 x-ping	     370 B/op	      10 allocs/op
PASS
ok  	github.com/ratebudget/ratebudget/lua	16.910s
`
	var out strings.Builder
	if err := run(strings.NewReader(in), &out); err != nil {
		t.Fatal(err)
	}
	want := `
github.com/ratebudget/ratebudget/lua
benchmark                 ns/op  B/op  allocs/op  x-ping
--------------------------------------------------------
BenchmarkProcess/ping-2    9598   188          6       -
BenchmarkProcess/fixed-2  18691   370         10  0.5236
`
	if out.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", out.String(), want)
	}
	if err := run(strings.NewReader("--- FAIL: BenchmarkX\n"), &out); err == nil {
		t.Fatal("a failure was not reported")
	}
}

// A benchmark that skips (a Redis benchmark without redis-server) is named with its
// reason, not dropped: `go test -v -bench` prints the reason before the SKIP line.
func TestRunSkip(t *testing.T) {
	in := `pkg: github.com/ratebudget/ratebudget/lua
BenchmarkSingleCaller
    single_bench_test.go:30: redistest: no redis-server binary in $PATH (set REDIS_SERVER)
--- SKIP: BenchmarkSingleCaller
BenchmarkKey
BenchmarkKey-2   	 1000000	       120 ns/op
PASS
`
	var out strings.Builder
	if err := run(strings.NewReader(in), &out); err != nil {
		t.Fatal(err)
	}
	want := `--- SKIP: BenchmarkSingleCaller
    single_bench_test.go:30: redistest: no redis-server binary in $PATH (set REDIS_SERVER)

github.com/ratebudget/ratebudget/lua
benchmark       ns/op
---------------------
BenchmarkKey-2    120
`
	if out.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", out.String(), want)
	}
}
