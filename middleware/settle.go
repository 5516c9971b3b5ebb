package middleware

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"runtime"
	"sync"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/delivery"
)

// settlement is what an admitted request's return settles: one target per limiter call
// that reserved. Leases are renewed while the handler runs, by a timer that shares mu
// with the final settle.
type settlement struct {
	mu   sync.Mutex
	done bool
	req  *http.Request // the request, for the events of failed settles
	// mark numbers the deliveries of the request's events (the stack's, nil when one
	// layer has observers).
	mark *delivery.Mark
	// parts is every layer of the request (the stack's): its observers see every
	// target's failures, as they see the decision.
	parts   []part
	targets []target
	ttl     time.Duration // the shortest lease TTL of the targets; 0 when none holds a lease
	timer   *time.Timer
	body    bool // a rule counts the bytes read from a body without a length
}

// target is one reserved decision: its checks, tickets and each check's rule.
type target struct {
	s       settler
	m       *mw // whose timeout bounds the settle
	checks  []ratebudget.Check
	tickets []ratebudget.Ticket
	rules   []*compiledRule
}

// serveSettled runs next and settles every target once it returns, also when it panics
// (the panic goes on) and when the client has gone away (the settle does not use the
// request's cancellation). Leases are renewed at half their TTL while next runs.
func serveSettled(w http.ResponseWriter, r *http.Request, se *settlement, next http.Handler) {
	rec := &recorder{ResponseWriter: w}
	if se.body && r.Body != nil && r.Body != http.NoBody {
		rec.awaitsBody = r.ContentLength > 0 && expectsContinue(r)
		if r.ContentLength < 0 || rec.awaitsBody {
			// On a copy: net/http reads its own request's Body after the handler (to
			// close or reuse the connection, not to ask for a body never asked for).
			r = r.WithContext(r.Context())
			r.Body = &countingBody{ReadCloser: r.Body, rec: rec}
		}
	}
	ctx := context.WithoutCancel(r.Context())
	if se.ttl > 0 {
		// Under mu: a short TTL's first renewal can run before AfterFunc has returned,
		// and it reads se.timer (to schedule the next one) under mu.
		se.mu.Lock()
		se.timer = time.AfterFunc(se.ttl/2, func() { se.renew(ctx) })
		se.mu.Unlock()
	}
	rw := rec.writer() // with the optional interfaces of w, and no others
	returned := false
	defer func() {
		rec.late = rec.code == 0 && r.Context().Err() == context.DeadlineExceeded
		if returned {
			se.finish(ctx, r, rec)
			return
		}
		// A panic, looked at and sent on (its stack is still the handler's), or
		// runtime.Goexit (nothing to recover).
		p := recover()
		rec.panicked = true
		rec.aborted = p == any(http.ErrAbortHandler)
		se.finish(ctx, r, rec)
		if p != nil {
			panic(p)
		}
	}()
	next.ServeHTTP(rw, r)
	returned = true
}

// renew extends every lease of the settlement, unless it has been settled, and schedules
// the next renewal. It runs on the timer's goroutine, where nothing would recover a
// panic (a client hook's, an observer's): one would end the process, where the same
// panic in the decision or the settle only ends its request. A panic stops the
// renewals, which leaves the leases to expire after their TTL, as a failed renewal
// may, and is logged, under mu so that the line is written before the request ends.
func (se *settlement) renew(ctx context.Context) {
	se.mu.Lock()
	defer se.mu.Unlock()
	if se.done {
		return
	}
	defer func() {
		if p := recover(); p != nil {
			logRenewalPanic(ctx, se.req, p)
		}
	}()
	for i := range se.targets {
		t := &se.targets[i]
		if !t.holdsLease() {
			continue
		}
		tctx, cancel := t.m.settleContext(ctx)
		start := time.Now()
		err := t.s.Renew(tctx, t.checks, t.tickets)
		cancel()
		if err != nil && !errors.Is(err, ratebudget.ErrLeaseLost) { // a lost lease cannot be taken back
			se.failed(t, err, time.Since(start))
		}
	}
	se.timer.Reset(se.ttl / 2)
}

// logRenewalPanic logs the panic p of a lease renewal for r, with its stack, as
// http.Server logs a handler's.
func logRenewalPanic(ctx context.Context, r *http.Request, p any) {
	buf := make([]byte, 64<<10)
	buf = buf[:runtime.Stack(buf, false)]
	path := ""
	if r != nil {
		path = r.URL.Path
	}
	slog.Default().LogAttrs(ctx, slog.LevelError, "ratebudget: a lease renewal panicked; the request's leases are no longer renewed and expire after their TTL",
		slog.Any("panic", p), slog.String("path", path), slog.String("stack", string(buf)))
}

func (t *target) holdsLease() bool {
	for _, cr := range t.rules {
		if cr.rule.Algorithm == ratebudget.InFlight {
			return true
		}
	}
	return false
}

// finish settles every target at the costs of its rules' contracts. A failed settle
// leaves the reserved spend in place (an overcount) and lets leases expire; it is
// reported to the observers (SettleFailed). When a contract's callback panics,
// the targets not yet settled are settled at their reserved costs, so that their leases
// are released, and the panic goes on.
func (se *settlement) finish(ctx context.Context, r *http.Request, rec *recorder) {
	se.mu.Lock()
	defer se.mu.Unlock()
	se.done = true
	if se.timer != nil {
		se.timer.Stop()
	}
	next := 0 // the first target not settled
	defer func() {
		for ; next < len(se.targets); next++ { // only after a panic
			t := &se.targets[next]
			if costs := t.costs(r, rec, true); costs != nil {
				se.settle(ctx, t, costs)
			}
		}
	}()
	for next < len(se.targets) {
		t := &se.targets[next]
		costs := t.costs(r, rec, false)
		next++
		if costs != nil {
			se.settle(ctx, t, costs)
		}
	}
}

// costs returns the cost each check of t is settled at, the reserved cost when reserved
// is set, or nil when none of t's rules settles. The tickets of rules that count
// attempts are cleared: they have nothing to settle.
func (t *target) costs(r *http.Request, rec *recorder, reserved bool) []int64 {
	costs := make([]int64, len(t.checks))
	some := false
	for k, cr := range t.rules {
		if !cr.settles() {
			t.tickets[k] = ratebudget.Ticket{}
			continue
		}
		some = true
		if reserved {
			costs[k] = t.checks[k].Cost
			continue
		}
		costs[k] = cr.actual(r, &t.checks[k], rec)
	}
	if !some {
		return nil
	}
	return costs
}

// cancelAll gives back every target's spend in full: the request is answered without
// being served (a later limiter refused it, say; see stack.giveBack).
// Each target is removed before it is settled, so that none is settled twice when a
// settle panics and a deferred cancelAll runs again.
func (se *settlement) cancelAll(ctx context.Context) {
	ctx = context.WithoutCancel(ctx)
	for len(se.targets) > 0 {
		t := se.targets[0]
		se.targets = se.targets[1:]
		se.settle(ctx, &t, nil)
	}
}

// settle settles t at costs (nil: cancelled) under its layer's timeout, and reports a
// failure to the observers.
func (se *settlement) settle(ctx context.Context, t *target, costs []int64) {
	tctx, cancel := t.m.settleContext(ctx)
	start := time.Now()
	err := t.s.Settle(tctx, t.checks, t.tickets, costs)
	cancel()
	if err != nil {
		se.failed(t, err, time.Since(start))
	}
}

// failed shows the observers of every layer of the request that settling or renewing t
// failed with err after latency: an event of its own (SettleFailed), after the
// decision's.
func (se *settlement) failed(t *target, err error, latency time.Duration) {
	var sErr *ratebudget.StoreError
	if !errors.As(err, &sErr) {
		err = &ratebudget.StoreError{Class: ratebudget.ClassOther, Err: err}
	}
	ev := Event{Request: se.req, Result: SettleFailed, Err: err, Latency: latency}
	if se.mark != nil {
		se.mark.Next()
	}
	for i := range se.parts {
		se.parts[i].m.observe(&ev)
	}
}

// settleContext bounds a settle by the layer's timeout when its limiter does I/O.
func (m *mw) settleContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if !m.io {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, m.cfg.timeout)
}
