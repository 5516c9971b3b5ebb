package policy

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// waitReport is how long a test waits for a reload's report: far above the 500 ms poll,
// for a loaded machine. The tests never wait when nothing is late.
const waitReport = 20 * time.Second

type report struct {
	p   *Policy
	err error
}

// watched starts a Watcher of path polling every interval, its reports on the channel.
func watched(t *testing.T, path string, every time.Duration) (*Watcher, <-chan report) {
	t.Helper()
	ch := make(chan report, 16)
	w, err := watch(path, every, func(p *Policy, err error) { ch <- report{p, err} })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w, ch
}

func next(t *testing.T, ch <-chan report) report {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(waitReport):
		t.Fatalf("no reload reported within %v", waitReport)
	}
	return report{}
}

// limited is a policy whose one rule admits limit requests a minute.
func limited(limit int) []byte {
	return fmt.Appendf(nil, "rules:\n  - {name: a, identity: ip, time: {limit: %d, window: 1m}}\n", limit)
}

func limitOf(p *Policy) int64 { return p.classes[0].limits[0].Limit }

// writeAtomic replaces path's content the way an editor or a deploy does: a new file
// renamed over the old one.
func writeAtomic(t *testing.T, path string, data []byte) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func TestWatchRename(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.yaml")
	writeAtomic(t, path, limited(5))
	w, ch := watched(t, path, pollEvery)
	if got := limitOf(w.Policy()); got != 5 {
		t.Fatalf("limit = %d, want 5", got)
	}
	writeAtomic(t, path, limited(7))
	r := next(t, ch)
	if r.err != nil || limitOf(r.p) != 7 {
		t.Fatalf("reload = %v, %v; want the policy of limit 7", r.p, r.err)
	}
	if w.Policy() != r.p {
		t.Errorf("Policy() is not the reported policy")
	}
}

// TestWatchConfigMapSwap updates the file the way Kubernetes updates a mounted ConfigMap:
// policy.yaml -> ..data/policy.yaml, and ..data a link renamed from one timestamped
// directory to the next, the old one removed.
func TestWatchConfigMapSwap(t *testing.T) {
	dir := t.TempDir()
	publish := func(version string, data []byte) {
		t.Helper()
		ts := filepath.Join(dir, "..2026_12_05_"+version)
		if err := os.Mkdir(ts, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(ts, "policy.yaml"), data, 0o644); err != nil {
			t.Fatal(err)
		}
		tmp := filepath.Join(dir, "..data_tmp")
		if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	publish("1", limited(5))
	path := filepath.Join(dir, "policy.yaml")
	if err := os.Symlink(filepath.Join("..data", "policy.yaml"), path); err != nil {
		t.Fatal(err)
	}
	w, ch := watched(t, path, pollEvery)
	publish("2", limited(9))
	if err := os.RemoveAll(filepath.Join(dir, "..2026_12_05_1")); err != nil {
		t.Fatal(err)
	}
	if r := next(t, ch); r.err != nil || limitOf(r.p) != 9 {
		t.Fatalf("reload = %v, %v; want the policy of limit 9", r.p, r.err)
	}
	if got := limitOf(w.Policy()); got != 9 {
		t.Errorf("limit in effect = %d, want 9", got)
	}
}

// TestWatchReload reloads on demand (a SIGHUP), with polling out of the way.
func TestWatchReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.yaml")
	writeAtomic(t, path, limited(5))
	w, ch := watched(t, path, time.Hour)
	if err := os.WriteFile(path, limited(6), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := w.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := limitOf(w.Policy()); got != 6 {
		t.Errorf("after Reload, limit = %d, want 6", got)
	}
	if r := next(t, ch); r.err != nil || r.p != w.Policy() {
		t.Errorf("reported %v, %v; want the policy in effect", r.p, r.err)
	}
	// An unchanged file reloads too: the operator asked.
	if err := w.Reload(); err != nil {
		t.Fatal(err)
	}
	if r := next(t, ch); r.err != nil || limitOf(r.p) != 6 {
		t.Errorf("reported %v, %v; want the policy of limit 6", r.p, r.err)
	}
}

// TestWatchBadFileKeepsPolicy: an invalid file is reported and the last good policy
// stays in effect, through the poll and through Reload; a valid file then takes effect.
func TestWatchBadFileKeepsPolicy(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.yaml")
	writeAtomic(t, path, limited(5))
	w, ch := watched(t, path, pollEvery)
	good := w.Policy()
	writeAtomic(t, path, []byte("rules:\n  - {name: a, identity: ip, time: {limit: -1, window: 1m}}\n"))
	r := next(t, ch)
	var pe *Error
	if !errors.As(r.err, &pe) || r.p != nil || pe.Path != "rules[0].time.limit" {
		t.Fatalf("reported %v, %v; want a *Error at rules[0].time.limit", r.p, r.err)
	}
	if w.Policy() != good {
		t.Errorf("a bad file replaced the policy in effect")
	}
	if err := w.Reload(); !errors.As(err, &pe) {
		t.Errorf("Reload = %v, want the *Error", err)
	}
	if r := next(t, ch); r.err == nil || w.Policy() != good {
		t.Errorf("after Reload of a bad file: reported %v, policy kept %v", r.err, w.Policy() == good)
	}
	writeAtomic(t, path, limited(8))
	if r := next(t, ch); r.err != nil || limitOf(w.Policy()) != 8 {
		t.Errorf("reported %v; limit in effect %d, want 8", r.err, limitOf(w.Policy()))
	}
}

// TestWatchMissingFile: a file that disappears is reported and the policy stays; when
// it is back, it takes effect.
func TestWatchMissingFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.yaml")
	writeAtomic(t, path, limited(5))
	w, ch := watched(t, path, pollEvery)
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if r := next(t, ch); !errors.Is(r.err, os.ErrNotExist) || limitOf(w.Policy()) != 5 {
		t.Fatalf("reported %v; want os.ErrNotExist and the policy kept", r.err)
	}
	writeAtomic(t, path, limited(5))
	if r := next(t, ch); r.err != nil || limitOf(r.p) != 5 {
		t.Errorf("reported %v, %v; want the policy back", r.p, r.err)
	}
}

func TestWatchRefusesBadStart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if _, err := Watch(path, nil); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Watch of a missing file = %v, want os.ErrNotExist", err)
	}
	writeAtomic(t, path, []byte("rules: 5\n"))
	var pe *Error
	if _, err := Watch(path, nil); !errors.As(err, &pe) {
		t.Errorf("Watch of a bad file = %v, want a *Error", err)
	}
}
