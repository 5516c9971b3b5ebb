package policy

import (
	"crypto/sha256"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// pollEvery is how often a Watcher reads its file.
const pollEvery = 500 * time.Millisecond

// Watcher keeps the policy of a file current while the program runs. It reads the file
// by its path every 500 milliseconds, opening it anew each time (no descriptor or inode
// is kept), so that it sees an edit in place, an atomic rename over the file, and the
// symbolic-link swap with which Kubernetes updates a mounted ConfigMap (a subPath mount
// is a copy that Kubernetes never updates: mount the directory). When the content
// differs from the last read (by its SHA-256), the file is parsed: a valid policy takes
// effect at once, an invalid one is reported and the last good policy stays in effect;
// the same invalid content is reported once. [Watcher.Reload] reads the file at once, for
// a SIGHUP.
//
// The policy in effect is replaced atomically: a caller that reads [Watcher.Policy] once
// per request decides the request under one policy, never a mix. A Watcher is safe for
// concurrent use.
type Watcher struct {
	path     string
	onReload func(*Policy, error)
	current  atomic.Pointer[Policy]
	mu       sync.Mutex // one read at a time, reports in order; guards sum
	sum      [sha256.Size]byte
	stop     chan struct{}
	done     chan struct{}
	stopOnce sync.Once
}

// Watch loads the policy file at path and watches it (see [Watcher]) until
// [Watcher.Close]. A file that cannot be read or parsed is an error here: there is no
// policy to start with. onReload, if not nil, is called after each later read whose
// content changed and after each Reload: with the new policy and a nil error when it
// took effect, with a nil policy and the error (a *[Error] for an invalid file) when
// the last good policy stays. The calls are made one at a time, in the order of the
// reads, from the Watcher's goroutine or from Reload's caller; onReload must not call
// Reload or Close.
func Watch(path string, onReload func(*Policy, error)) (*Watcher, error) {
	return watch(path, pollEvery, onReload)
}

// watch is Watch with the poll interval given (tests).
func watch(path string, every time.Duration, onReload func(*Policy, error)) (*Watcher, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	p, err := Parse(path, data)
	if err != nil {
		return nil, err
	}
	w := &Watcher{path: path, onReload: onReload, sum: sha256.Sum256(data), stop: make(chan struct{}), done: make(chan struct{})}
	w.current.Store(p)
	go w.poll(every)
	return w, nil
}

// Policy returns the policy in effect. It never returns nil.
func (w *Watcher) Policy() *Policy { return w.current.Load() }

// Reload reads and parses the file now, whether or not its content changed, and returns
// what onReload is given: nil when the file's policy took effect, the error when the last
// good policy stays in effect.
func (w *Watcher) Reload() error {
	return w.read(true)
}

// Close stops watching the file; the policy in effect stays. It returns once the
// Watcher's goroutine has ended, and always nil.
func (w *Watcher) Close() error {
	w.stopOnce.Do(func() { close(w.stop) })
	<-w.done
	return nil
}

func (w *Watcher) poll(every time.Duration) {
	defer close(w.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-t.C:
			_ = w.read(false) // reported to onReload
		}
	}
}

// read reads the file and, when forced or when its content changed since the last read,
// parses it, puts a valid policy in effect and reports.
func (w *Watcher) read(force bool) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	data, err := os.ReadFile(w.path)
	var p *Policy
	if err == nil {
		sum := sha256.Sum256(data)
		if sum == w.sum && !force {
			return nil
		}
		w.sum = sum
		p, err = Parse(w.path, data)
	} else {
		// An unreadable file is reported once, until it can be read again.
		if w.sum == ([sha256.Size]byte{}) && !force {
			return nil
		}
		w.sum = [sha256.Size]byte{}
	}
	if err == nil {
		w.current.Store(p)
	}
	if w.onReload != nil {
		w.onReload(p, err)
	}
	return err
}
