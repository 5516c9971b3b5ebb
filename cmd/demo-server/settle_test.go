package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget/internal/redistest"
)

// fetch GETs url and returns the response and its body.
func fetch(t *testing.T, url string) (*http.Response, []byte) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, body
}

func codesOf(t *testing.T, url string, n int) []int {
	t.Helper()
	var codes []int
	for range n {
		codes = append(codes, get(t, "GET", url, nil).StatusCode)
	}
	return codes
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestDemoFlaky: -limit 3, five 500s then four 200s: 500 x5, 200 x3, 429 x1.
func TestDemoFlaky(t *testing.T) {
	base := startDemo(t, "-limit", "3")
	got := append(codesOf(t, base+"/api/flaky?status=500", 5), codesOf(t, base+"/api/flaky?status=200", 4)...)
	if want := []int{500, 500, 500, 500, 500, 200, 200, 200, 429}; !equalInts(got, want) {
		t.Fatalf("statuses %v, want %v", got, want)
	}
}

// TestDemoShadow: -shadow -limit 1: three requests are served, and /metrics counts the
// two that would have been refused.
func TestDemoShadow(t *testing.T) {
	base := startDemo(t, "-shadow", "-limit", "1")
	if got := codesOf(t, base+"/api/hello", 3); !equalInts(got, []int{200, 200, 200}) {
		t.Fatalf("statuses %v, want 200 x3", got)
	}
	_, body := fetch(t, base+"/metrics")
	// The whole line: not 20, nor 2.5.
	if !strings.Contains(string(body), "\n"+`ratebudget_shadow_refusals_total{rule="hello"} 2`+"\n") {
		t.Fatalf("metrics do not count 2 shadow refusals of hello:\n%s", body)
	}
}

// TestDemoDownload: -byte-limit 100 is charged the bytes written: 60, 60 (into debt),
// then refused.
func TestDemoDownload(t *testing.T) {
	base := startDemo(t, "-byte-limit", "100")
	resp, body := fetch(t, base+"/api/download?bytes=60")
	if resp.StatusCode != 200 || len(body) != 60 {
		t.Fatalf("first download: %d, %d bytes", resp.StatusCode, len(body))
	}
	if got := codesOf(t, base+"/api/download?bytes=60", 2); !equalInts(got, []int{200, 429}) {
		t.Fatalf("statuses %v, want 200 then 429", got)
	}
}

// TestDemoSlow: -inflight 2: while two /api/slow requests run a third is refused with
// Retry-After 1; once their clients go away, their slots are free again.
func TestDemoSlow(t *testing.T) {
	base := startDemo(t, "-inflight", "2")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i := range 2 {
		// The demo starts its answer at once: the headers say the request was admitted.
		req, _ := http.NewRequestWithContext(ctx, "GET", base+"/api/slow?ms=10000", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("slow request %d: %d", i, resp.StatusCode)
		}
	}
	resp := get(t, "GET", base+"/api/slow?ms=0", nil)
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("a third while two run: %d, Retry-After %q; want 429 and 1", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	cancel() // the two clients go away: their handlers return, their leases are released
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp := get(t, "GET", base+"/api/slow?ms=0", nil)
		if resp.StatusCode == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("slots not released after the clients went away: %d", resp.StatusCode)
		}
	}
	if got := codesOf(t, base+"/api/slow?ms=0", 3); !equalInts(got, []int{200, 200, 200}) {
		t.Fatalf("after release: %v", got)
	}
}

// TestDemoSlowAcrossServers: two demo servers on one Redis, -inflight 3: three slow
// requests spread over both hold every slot, a fourth is refused by either server, and
// the slots are free again once the clients go away.
func TestDemoSlowAcrossServers(t *testing.T) {
	srv := redistest.Start(t)
	url := "redis://" + srv.Addr + "/0"
	servers := []string{
		startDemo(t, "-redis", url, "-inflight", "3", "-store-timeout", "2s"),
		startDemo(t, "-redis", url, "-inflight", "3", "-store-timeout", "2s"),
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i := range 3 {
		req, _ := http.NewRequestWithContext(ctx, "GET", servers[i%2]+"/api/slow?ms=10000", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("slow request %d: %d", i, resp.StatusCode)
		}
	}
	for _, base := range servers {
		if resp := get(t, "GET", base+"/api/slow?ms=0", nil); resp.StatusCode != 429 {
			t.Fatalf("a fourth request on %s: %d, want 429", base, resp.StatusCode)
		}
	}
	cancel()
	deadline := time.Now().Add(10 * time.Second)
	for _, base := range servers {
		for {
			resp := get(t, "GET", base+"/api/slow?ms=0", nil)
			if resp.StatusCode == 200 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("slots not released after the clients went away: %d", resp.StatusCode)
			}
		}
	}
	if got := codesOf(t, servers[1]+"/api/slow?ms=0", 3); !equalInts(got, []int{200, 200, 200}) {
		t.Fatalf("after release: %v", got)
	}
}
