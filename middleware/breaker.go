package middleware

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/ratebudget/ratebudget"
)

// Breaker configures the circuit breaker in front of a limiter that does I/O (see
// [WithBreaker]). While the breaker is open no decision goes to the store: the failure
// policy answers at once.
//
// It opens on either of two signals:
//   - a stall: no call has had a reply from the store (an answer or an error reply) for
//     Stall since a call that got none started, or a few calls in a row could not reach
//     the store at all (a refused or lost connection);
//   - a failure ratio: over the last 10s, at least 20 decisions were made and at least
//     half of them failed.
//
// An open breaker probes the store off the request path when the limiter has a method
// Ping(context.Context) error (the lua limiter's sends PING on a connection of its own):
// a probe every 25ms, each bounded by the decision deadline ([WithTimeout]), for as
// long as requests keep coming (it stops after a second without any, and starts again
// with the next request); the first probe answered closes the breaker, so a store that
// answers again is used again within about 25ms plus one probe's round trip. For a
// limiter without Ping, one decision goes to the store as the probe once 25ms have
// passed, and its success closes the breaker.
//
// A stall is measured from replies, not from elapsed deadlines alone, and the ratio
// needs 20 decisions, so that a healthy store's breaker stays closed when a starved host
// reads its replies late. Every zero field takes its default.
type Breaker struct {
	// Stall is how long the store may go without replying to any call, counted from the
	// start of the first call left without a reply, before the breaker opens. Default
	// 100ms; at least 1ms. It should exceed the longest time the host may go without
	// running the process (a starved host reads replies late, not never).
	Stall time.Duration
	// OnChange, if not nil, is called with true when the breaker opens and with false
	// when it closes again. It runs while the breaker holds its lock, on the goroutine
	// of the request or probe that changed it: keep it fast, and do not call back into
	// the middleware.
	OnChange func(open bool)
	// Disabled turns the breaker off: every decision goes to the store.
	Disabled bool
}

// breakerTuning is the breaker's failure ratio rule and probe interval, fixed at
// defaultBreakerTuning as [Breaker] states them (tests of the package tune them).
type breakerTuning struct {
	// window is the rolling interval over which calls are counted for failureRatio, in
	// steps of a tenth of it.
	window time.Duration
	// minCalls is the number of decisions within window below which failureRatio never
	// opens the breaker.
	minCalls int
	// failureRatio is the share of failed decisions within window, in (0, 1], at which
	// the breaker opens.
	failureRatio float64
	// cooldown is the wait between probes of an open breaker.
	cooldown time.Duration
}

// Defaults of [Breaker], as its documentation states them.
const (
	defaultBreakerStall = 100 * time.Millisecond
	// lostConnections is how many calls in a row, with no reply between them, may fail
	// to reach the store (a refused dial, a connection lost) before the breaker opens.
	// A refused connection is the store's answer that it is not there; a starved host
	// never causes one. Kept small so that a client's pool does not reach its own dial
	// circuit (go-redis: PoolSize failed dials), which would hold it for up to a second
	// after the store is back.
	lostConnections = 3
	// probeIdle is how long the prober runs on without any request to the middleware.
	probeIdle = time.Second
)

var defaultBreakerTuning = breakerTuning{
	window:       10 * time.Second,
	minCalls:     20,
	failureRatio: 0.5,
	cooldown:     25 * time.Millisecond,
}

// withDefaults fills b's zero fields and validates the rest.
func (b Breaker) withDefaults() (Breaker, error) {
	if b.Stall == 0 {
		b.Stall = defaultBreakerStall
	}
	if b.Stall < time.Millisecond {
		return b, configErr("WithBreaker", "Stall must be at least 1ms, got "+b.Stall.String())
	}
	return b, nil
}

// WithBreaker configures the circuit breaker in front of a limiter that does I/O (see
// [Breaker]; the zero value gives every default). The in-process memory.Limiter has
// no breaker.
func WithBreaker(b Breaker) Option {
	return func(c *config) error {
		b, err := b.withDefaults()
		if err != nil {
			return err
		}
		c.breaker = b
		return nil
	}
}

// pinger is a limiter that can ask its store whether it answers, without deciding.
type pinger interface {
	Ping(ctx context.Context) error
}

// breaker guards a limiter that does I/O. Its state is under mu: decisions take it
// twice (before and after the call), probes once each.
type breaker struct {
	cfg     Breaker
	tune    breakerTuning
	ping    func(context.Context) error // nil: a decision is the probe
	timeout time.Duration               // each probe's deadline
	now     func() time.Time

	mu   sync.Mutex
	open bool
	// buckets count the decisions of the last tune.window, a tenth of it each; cur is the
	// bucket of the interval that started at curStart.
	buckets  [10]struct{ ok, failed int }
	cur      int
	curStart time.Time
	// replied is when a call last had a reply. unanswered is the start of the first
	// call left without one since then, or the reply's time when that call started
	// before it (zero when every call since had a reply); lost counts the calls since
	// the last reply that could not reach the store.
	replied    time.Time
	unanswered time.Time
	lost       int
	// While open: probing is set while a probe runs (the prober goroutine, or the one
	// decision let through when there is no ping), nextProbe is when a decision may be
	// the probe, lastAsked when a decision last found the breaker open.
	probing   bool
	nextProbe time.Time
	lastAsked time.Time
}

// errNotCounted marks a call whose result says nothing about the store.
var errNotCounted = errors.New("not counted")

var errBreakerOpen = errors.New("circuit breaker open: store not called")

func newBreaker(b Breaker, tune breakerTuning, timeout time.Duration, ping func(context.Context) error) *breaker {
	return &breaker{cfg: b, tune: tune, ping: ping, timeout: timeout, now: time.Now}
}

// allow reports whether a decision may go to the store; when it may, done must be
// called with the call's health: nil for an answer, a non-nil error for a store failure,
// errNotCounted for a call that says nothing about the store.
func (b *breaker) allow() (done func(error), err error) {
	b.mu.Lock()
	now := b.now()
	if !b.open && !b.unanswered.IsZero() && now.Sub(b.unanswered) >= b.cfg.Stall {
		b.trip(now) // no reply for Stall, and a call has failed waiting for one
	}
	probe := false
	if b.open {
		b.lastAsked = now
		switch {
		case b.ping != nil:
			if !b.probing {
				b.probing = true
				go b.probe()
			}
		case !b.probing && !now.Before(b.nextProbe):
			b.probing, probe = true, true
		}
		if !probe {
			b.mu.Unlock()
			return nil, &ratebudget.StoreError{Class: ratebudget.ClassBreakerOpen, Err: errBreakerOpen}
		}
	}
	b.mu.Unlock()
	start := now
	return func(err error) { b.done(start, probe, err) }, nil
}

// done records a decision's health: start is when it was let through, probe whether
// it was the probe of an open breaker.
func (b *breaker) done(start time.Time, probe bool, err error) {
	var se *ratebudget.StoreError
	replied := err == nil || errors.As(err, &se) && (se.Class == ratebudget.ClassServer || se.Class == ratebudget.ClassReply)
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	if probe {
		b.probed(now, err)
		return
	}
	if err == errNotCounted {
		return
	}
	bk := b.bucket(now)
	if err == nil {
		bk.ok++
	} else {
		bk.failed++
	}
	switch {
	case replied:
		b.replied, b.unanswered, b.lost = now, time.Time{}, 0
	default:
		b.unreplied(start, se != nil && se.Class == ratebudget.ClassConnection)
	}
	if b.open {
		return // a call let through before the breaker opened
	}
	if b.lost >= lostConnections || now.Sub(b.unanswered) >= b.cfg.Stall && !b.unanswered.IsZero() || b.failing() {
		b.trip(now)
	}
}

// probed records the result of the decision let through as the probe of an open
// breaker (there is no ping): an answer closes it, a store failure waits the
// cooldown before the next probe. b.mu is held.
func (b *breaker) probed(now time.Time, err error) {
	b.probing = false
	switch {
	case err == nil:
		b.close(now)
	case err != errNotCounted:
		b.nextProbe = now.Add(b.tune.cooldown)
	}
}

// unreplied records a call let through at start that got no reply from the store;
// unreachable when it could not connect. b.mu is held.
func (b *breaker) unreplied(start time.Time, unreachable bool) {
	from := start
	if b.replied.After(from) {
		from = b.replied // another call had a reply while this one waited
	}
	if b.unanswered.IsZero() || from.Before(b.unanswered) {
		b.unanswered = from
	}
	if unreachable {
		b.lost++
	}
}

// failing reports whether the decisions of the window fail at the tuning's
// failureRatio, with at least minCalls of them. b.mu is held.
func (b *breaker) failing() bool {
	ok, failed := 0, 0
	for _, c := range b.buckets {
		ok, failed = ok+c.ok, failed+c.failed
	}
	n := ok + failed
	return n >= b.tune.minCalls && float64(failed) >= b.tune.failureRatio*float64(n)
}

// bucket returns the bucket counting decisions that end at now, clearing those whose
// interval has left the window.
func (b *breaker) bucket(now time.Time) *struct{ ok, failed int } {
	step := b.tune.window / 10
	if b.curStart.IsZero() {
		b.curStart = now
	}
	for n := 0; now.Sub(b.curStart) >= step; n++ {
		if n == len(b.buckets) { // the whole window has passed
			b.buckets = [10]struct{ ok, failed int }{}
			b.curStart = now
			break
		}
		b.cur = (b.cur + 1) % len(b.buckets)
		b.buckets[b.cur] = struct{ ok, failed int }{}
		b.curStart = b.curStart.Add(step)
	}
	return &b.buckets[b.cur]
}

// trip opens the breaker. b.mu is held.
func (b *breaker) trip(now time.Time) {
	b.open = true
	b.nextProbe = now.Add(b.tune.cooldown)
	b.lastAsked = now
	if b.ping != nil && !b.probing {
		b.probing = true
		go b.probe()
	}
	if b.cfg.OnChange != nil {
		b.cfg.OnChange(true)
	}
}

// close closes the breaker with a clean count. b.mu is held.
func (b *breaker) close(now time.Time) {
	b.open = false
	b.buckets = [10]struct{ ok, failed int }{}
	b.curStart = now
	b.replied, b.unanswered, b.lost = now, time.Time{}, 0
	if b.cfg.OnChange != nil {
		b.cfg.OnChange(false)
	}
}

// probe pings the store until it answers, which closes the breaker, or until no
// decision has come for probeIdle. It runs on a goroutine of its own, one at a time
// (b.probing).
func (b *breaker) probe() {
	for {
		ctx, cancel := context.WithTimeout(context.Background(), b.timeout)
		err := b.ping(ctx)
		cancel()
		b.mu.Lock()
		now := b.now()
		if !b.open {
			b.probing = false
			b.mu.Unlock()
			return
		}
		if err == nil {
			b.probing = false
			b.close(now)
			b.mu.Unlock()
			return
		}
		if now.Sub(b.lastAsked) >= probeIdle {
			b.probing = false // the next decision starts it again
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
		time.Sleep(b.tune.cooldown)
	}
}
