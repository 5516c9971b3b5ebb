package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget/internal/redistest"
)

// startDemoCtx is startDemo with the context run is given.
func startDemoCtx(t *testing.T, ctx context.Context, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
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

// demoPolicy copies the shipped policy.yaml into a directory of the test's own, with
// each pair of old, new in edits replaced, and returns its path.
func demoPolicy(t *testing.T, edits ...string) string {
	t.Helper()
	src, err := os.ReadFile("policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "policy.yaml")
	writePolicy(t, path, string(src), edits...)
	return path
}

// writePolicy writes src, with edits applied, to path by an atomic rename.
func writePolicy(t *testing.T, path, src string, edits ...string) {
	t.Helper()
	for i := 0; i+1 < len(edits); i += 2 {
		if !strings.Contains(src, edits[i]) {
			t.Fatalf("policy.yaml has no %q", edits[i])
		}
		src = strings.Replace(src, edits[i], edits[i+1], 1)
	}
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// codes sends n GET /api/hello with key, alternating between bases, and returns the
// statuses, space-separated.
func codes(t *testing.T, n int, key string, bases ...string) string {
	t.Helper()
	var out []string
	for i := range n {
		resp := get(t, "GET", bases[i%len(bases)]+"/api/hello", map[string]string{"X-API-Key": key})
		resp.Body.Close()
		out = append(out, http.StatusText(resp.StatusCode))
	}
	return strings.Join(out, ", ")
}

func repeat(n int, s string) string { return strings.TrimSuffix(strings.Repeat(s+", ", n), ", ") }

// page returns the body of GET url.
func page(t *testing.T, url string) string {
	t.Helper()
	_, body := fetch(t, url)
	return string(body)
}

const ok, tooMany = "OK", "Too Many Requests"

// The shipped policy: demo-free gets 5 a minute, demo-pro goes on, an unknown key is on
// free with a budget of its own; GET / shows the policy, /metrics its reloads.
func TestPolicyPlans(t *testing.T) {
	base := startDemo(t, "-policy", demoPolicy(t))
	if got, want := codes(t, 6, "demo-free", base), repeat(5, ok)+", "+tooMany; got != want {
		t.Errorf("demo-free: %s; want %s", got, want)
	}
	if got, want := codes(t, 6, "demo-pro", base), repeat(6, ok); got != want {
		t.Errorf("demo-pro: %s; want %s", got, want)
	}
	if got, want := codes(t, 6, "who-knows", base), repeat(5, ok)+", "+tooMany; got != want {
		t.Errorf("an unknown key: %s; want %s", got, want)
	}
	body := page(t, base+"/")
	if !strings.Contains(body, "loaded 20") || !strings.Contains(body, "demo-free: free") {
		t.Errorf("GET / does not show the policy and when it was loaded:\n%s", body)
	}
	body = page(t, base+"/metrics")
	if !strings.Contains(body, `ratebudget_policy_reloads_total{result="error"} 0`) {
		t.Errorf("/metrics has no ratebudget_policy_reloads_total")
	}
}

// A bad edit is logged, counted, and leaves the policy in effect.
func TestPolicyBadReloadKeepsPolicy(t *testing.T) {
	path := demoPolicy(t)
	reloaded := make(chan error, 4)
	base := startDemoCtx(t, context.WithValue(context.Background(), reloadedKey{}, (chan<- error)(reloaded)), "-policy", path)
	src, _ := os.ReadFile(path)
	writePolicy(t, path, string(src), "hello: {limit: 5}", "hello: {limit: -5}")
	select {
	case err := <-reloaded:
		if err == nil || !strings.Contains(err.Error(), "plans.free.hello.limit") {
			t.Fatalf("reload: %v; want the error at plans.free.hello.limit", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no reload within 20s")
	}
	if got, want := codes(t, 6, "demo-free", base), repeat(5, ok)+", "+tooMany; got != want {
		t.Errorf("demo-free after a bad edit: %s; want %s", got, want)
	}
	if body := page(t, base+"/metrics"); !strings.Contains(body, `ratebudget_policy_reloads_total{result="error"} 1`) {
		t.Errorf("/metrics does not count the failed reload")
	}
}

// Two demo servers on one Redis reload one file: once both have reloaded, demo-free is
// admitted exactly up to the raised limit, counting what it spent before.
func TestPolicyReloadTwoServersOneRedis(t *testing.T) {
	srv := redistest.Start(t)
	url := "redis://" + srv.Addr + "/0"
	path := demoPolicy(t)
	ra, rb := make(chan error, 4), make(chan error, 4)
	start := func(ch chan error) string {
		ctx := context.WithValue(context.Background(), reloadedKey{}, (chan<- error)(ch))
		return startDemoCtx(t, ctx, "-policy", path, "-redis", url, "-store-timeout", "2s")
	}
	a, b := start(ra), start(rb)
	if got, want := codes(t, 6, "demo-free", a, b), repeat(5, ok)+", "+tooMany; got != want {
		t.Fatalf("demo-free at 5: %s; want %s", got, want)
	}
	src, _ := os.ReadFile(path)
	writePolicy(t, path, string(src), "hello: {limit: 5}", "hello: {limit: 8}")
	for _, ch := range []chan error{ra, rb} {
		select {
		case err := <-ch:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("a server did not reload within 20s")
		}
	}
	if got, want := codes(t, 6, "demo-free", a, b), repeat(3, ok)+", "+repeat(3, tooMany); got != want {
		t.Errorf("demo-free at 8: %s; want %s", got, want)
	}
}
