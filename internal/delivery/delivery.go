// Package delivery tells apart the deliveries of a request's rate-limit events when the
// middleware shows each of them to the observers of several stacked layers, so that an
// observer given to more than one of those layers (one metrics collector for the whole
// service) can take each event once.
//
// The middleware gives the observers of such a request a copy of it whose context
// carries a [Mark] ([Request]), and calls [Mark.Next] before each event it shows them;
// an observer that must see each event once asks [First] with the event's request and
// itself as the taker. Events of a request seen by one layer's observers carry no mark:
// First is always true for them.
package delivery

import (
	"context"
	"net/http"
	"sync"
)

// Mark numbers the deliveries of one request's events, and records which takers have
// taken the current one. It is safe for concurrent use.
type Mark struct {
	mu    sync.Mutex
	n     uint64  // deliveries begun
	taken []taken // each taker's last delivery taken
	buf   [2]taken
}

type taken struct {
	by any
	n  uint64
}

// markCtx is the context of a marked request: the request's own, with a Mark (one
// allocation for both). First finds it as the request's context itself, without a walk
// up the context's parents: a request that carries no mark costs a type assertion.
type markCtx struct {
	context.Context
	mark Mark
}

// Request returns a shallow copy of r whose context is r's, carrying a new Mark, and
// the Mark.
func Request(r *http.Request) (*http.Request, *Mark) {
	c := &markCtx{Context: r.Context()}
	c.mark.taken = c.mark.buf[:0]
	return r.WithContext(c), &c.mark
}

// Next begins the delivery of another event: every taker may take it once.
func (m *Mark) Next() {
	m.mu.Lock()
	m.n++
	m.mu.Unlock()
}

// First reports whether taker (a comparable value, such as a pointer) takes the event
// being delivered with r (an event's request) for the first time, and records that it
// has. It is true when r is nil or is not a request that [Request] returned.
func First(r *http.Request, taker any) bool {
	if r == nil {
		return true
	}
	c, ok := r.Context().(*markCtx)
	if !ok {
		return true
	}
	m := &c.mark
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := range m.taken {
		if t := &m.taken[i]; t.by == taker {
			if t.n == m.n {
				return false
			}
			t.n = m.n
			return true
		}
	}
	m.taken = append(m.taken, taken{by: taker, n: m.n})
	return true
}
