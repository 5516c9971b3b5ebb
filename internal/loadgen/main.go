// Command loadgen sends GET requests to one URL from a number of concurrent clients for
// a while and reports what came back: counts by status, the slowest answer, and each
// change of status seen in time order (Unix milliseconds), so that a script can tell
// when a service stopped and started answering 200. It is a measuring tool for the
// demo server; it talks only to the URL it is given.
//
//	go run ./internal/loadgen -url http://127.0.0.1:8080/api/hello -c 16 -d 10s
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"sync"
	"time"
)

type sample struct {
	at     int64 // Unix ms when the answer came
	status int   // 0: transport error
	took   time.Duration
}

func main() {
	url := flag.String("url", "http://127.0.0.1:8080/api/hello", "URL to GET")
	conc := flag.Int("c", 16, "concurrent clients")
	dur := flag.Duration("d", 10*time.Second, "how long to send")
	timeout := flag.Duration("timeout", 2*time.Second, "per-request timeout")
	maxRuns := flag.Int("runs", 40, "print at most this many runs of one status")
	dump := flag.String("samples", "", "also write every answer to this file: Unix ms, status, milliseconds taken")
	flag.Parse()
	if *conc < 1 || *dur <= 0 {
		fmt.Fprintln(os.Stderr, "loadgen: -c must be at least 1 and -d positive")
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *dur)
	defer cancel()
	tr := &http.Transport{MaxIdleConnsPerHost: *conc}
	client := &http.Client{Transport: tr, Timeout: *timeout}
	var mu sync.Mutex
	var all []sample
	var wg sync.WaitGroup
	for range *conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []sample
			for ctx.Err() == nil {
				start := time.Now()
				st := 0
				if resp, err := client.Get(*url); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					st = resp.StatusCode
				}
				mine = append(mine, sample{at: time.Now().UnixMilli(), status: st, took: time.Since(start)})
			}
			mu.Lock()
			all = append(all, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	sort.Slice(all, func(i, j int) bool { return all[i].at < all[j].at })
	counts := map[int]int{}
	var slowest time.Duration
	for _, s := range all {
		counts[s.status]++
		slowest = max(slowest, s.took)
	}
	if *dump != "" {
		f, err := os.Create(*dump)
		if err != nil {
			fmt.Fprintln(os.Stderr, "loadgen:", err)
			os.Exit(1)
		}
		w := bufio.NewWriter(f)
		for _, s := range all {
			fmt.Fprintf(w, "%d %d %.3f\n", s.at, s.status, float64(s.took)/float64(time.Millisecond))
		}
		if err := w.Flush(); err != nil || f.Close() != nil {
			fmt.Fprintln(os.Stderr, "loadgen: writing", *dump, "failed")
			os.Exit(1)
		}
	}
	codes := make([]int, 0, len(counts))
	for c := range counts {
		codes = append(codes, c)
	}
	sort.Ints(codes)
	fmt.Printf("requests %d, slowest %v\n", len(all), slowest.Round(time.Millisecond))
	for _, c := range codes {
		fmt.Printf("status %d: %d\n", c, counts[c])
	}
	// Runs of one status, merged across clients in time order.
	prev, runStart, n, runs := -1, int64(0), 0, 0
	flush := func(end int64) {
		if prev >= 0 && runs < *maxRuns {
			fmt.Printf("run status %d from %d to %d (%d answers)\n", prev, runStart, end, n)
		}
		runs++
	}
	for _, s := range all {
		if s.status != prev {
			flush(s.at)
			prev, runStart, n = s.status, s.at, 0
		}
		n++
	}
	if len(all) > 0 {
		flush(all[len(all)-1].at)
	}
	if runs > *maxRuns {
		fmt.Printf("(%d runs in all)\n", runs)
	}
}
