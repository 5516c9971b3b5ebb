package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// startDemo runs the demo server on a free loopback port until the test ends.
func startDemo(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- run(ctx, append([]string{"-addr", "127.0.0.1:0"}, args...), io.Discard, ready) }()
	select {
	case addr := <-ready:
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("demo-server: %v", err)
			}
		})
		return "http://" + addr
	case err := <-done:
		cancel()
		t.Fatalf("demo-server did not start: %v", err)
	}
	return ""
}

func get(t *testing.T, method, url string, hdr map[string]string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

func TestHelloTurnsInto429(t *testing.T) {
	base := startDemo(t, "-limit", "3", "-window", "10s")
	for _, want := range []string{"2", "1", "0"} {
		resp := get(t, "GET", base+"/api/hello", nil)
		if resp.StatusCode != 200 || resp.Header.Get("X-RateLimit-Remaining") != want {
			t.Fatalf("got %d remaining %q, want 200 %s", resp.StatusCode, resp.Header.Get("X-RateLimit-Remaining"), want)
		}
	}
	req, _ := http.NewRequest("GET", base+"/api/hello", nil)
	req.Header.Set("Accept", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 429 {
		t.Fatalf("4th: %d, want 429", resp.StatusCode)
	}
	ra, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	if err != nil || ra < 1 || ra > 10 {
		t.Errorf("Retry-After %q, want an integer in 1..10", resp.Header.Get("Retry-After"))
	}
	if resp.Header.Get("Cache-Control") != "no-store" || resp.Header.Get("Content-Type") != "application/problem+json" {
		t.Errorf("headers %v", resp.Header)
	}
	var p struct {
		Status int    `json:"status"`
		Policy string `json:"policy"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&p); err != nil || p.Status != 429 || p.Policy != "hello" {
		t.Errorf("problem %+v %v", p, err)
	}
	for range 5 {
		if resp := get(t, "GET", base+"/healthz", nil); resp.StatusCode != 200 {
			t.Fatalf("/healthz: %d", resp.StatusCode)
		}
	}
}

func TestAccountsJobsAndGuide(t *testing.T) {
	base := startDemo(t, "-limit", "2", "-window", "1m", "-algorithm", "token", "-headers", "both")
	// Per-account budgets: two accounts, two requests each, then the account is refused.
	for _, key := range []string{"key-a", "key-b"} {
		for i, want := range []int{200, 200, 429} {
			resp := get(t, "GET", base+"/api/accounts/7/report", map[string]string{"X-API-Key": key})
			if resp.StatusCode != want {
				t.Fatalf("%s request %d: %d, want %d", key, i, resp.StatusCode, want)
			}
		}
	}
	if resp := get(t, "GET", base+"/api/accounts/7/report", nil); resp.StatusCode != 400 {
		t.Errorf("no API key: %d, want 400", resp.StatusCode)
	}
	// Weighted cost: 2 units; cost 3 can never fit.
	if resp := get(t, "POST", base+"/api/jobs?cost=3", nil); resp.StatusCode != 413 {
		t.Errorf("cost 3 > 2: %d, want 413", resp.StatusCode)
	}
	resp := get(t, "POST", base+"/api/jobs?cost=2", nil)
	if resp.StatusCode != 202 || resp.Header.Get("RateLimit-Policy") != `"jobs";q=2;w=60` {
		t.Errorf("cost 2: %d %q", resp.StatusCode, resp.Header.Get("RateLimit-Policy"))
	}
	if resp := get(t, "POST", base+"/api/jobs?cost=1", nil); resp.StatusCode != 429 {
		t.Errorf("cost 1 after 2 of 2: %d, want 429", resp.StatusCode)
	}
	r, err := http.Get(base + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(r.Body)
	r.Body.Close()
	if !strings.Contains(string(body), "/api/accounts/{id}/report") {
		t.Errorf("guide: %s", body)
	}
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-algorithm", "sliding"}, {"-headers", "X"}, {"-store-error", "maybe"}, {"-limit", "0"}, {"-window", "1500us"},
		{"-trusted-proxies", "10.0.0.0/33"}, {"-coalesce", "1"}, {"-coalesce", "-1"}, {"-coalesce", "4097"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := run(ctx, append([]string{"-addr", "127.0.0.1:0"}, args...), io.Discard, nil)
		cancel()
		if err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}

func TestMetricsCountAllowedAndDenied(t *testing.T) {
	base := startDemo(t, "-limit", "1", "-window", "1m")
	get(t, "GET", base+"/api/hello", nil)
	get(t, "GET", base+"/api/hello", nil)
	r, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(r.Body)
	r.Body.Close()
	for _, want := range []string{
		`ratebudget_decisions_total{outcome="allowed",rule="hello"} 1`,
		`ratebudget_decisions_total{outcome="denied",rule="hello"} 1`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

func TestTrustedProxiesIdentity(t *testing.T) {
	base := startDemo(t, "-limit", "2", "-trusted-proxies", "127.0.0.1/32")
	for i, tc := range []struct {
		xff  string
		want int
	}{
		{"203.0.113.7", 200},
		{"203.0.113.7", 200},
		{"198.51.100.1, 203.0.113.7", 429}, // the spoofed left entry is not read
		{"203.0.113.8", 200},               // another client has its own budget
	} {
		if resp := get(t, "GET", base+"/api/hello", map[string]string{"X-Forwarded-For": tc.xff}); resp.StatusCode != tc.want {
			t.Fatalf("request %d (XFF %q): %d, want %d", i, tc.xff, resp.StatusCode, tc.want)
		}
	}
}

func TestForwardingHeadersIgnoredWithoutTrustedProxies(t *testing.T) {
	base := startDemo(t, "-limit", "2")
	spoofs := []map[string]string{
		{"X-Forwarded-For": "203.0.113.1"},
		{"X-Real-IP": "203.0.113.2"},
		{"True-Client-IP": "203.0.113.3"},
		{"Forwarded": "for=203.0.113.4"},
		{"X-Forwarded-For": "203.0.113.5, 198.51.100.9"},
	}
	codes := []int{}
	for _, h := range spoofs {
		codes = append(codes, get(t, "GET", base+"/api/hello", h).StatusCode)
	}
	want := []int{200, 200, 429, 429, 429} // one identity: the TCP peer
	for i := range want {
		if codes[i] != want[i] {
			t.Fatalf("rotating forwarding headers: %v, want %v", codes, want)
		}
	}
}
