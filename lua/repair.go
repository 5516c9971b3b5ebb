package lua

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/timerule"
)

// A reservation (Reserve) has an id, drawn at random, and allow.lua leaves a marker for
// it in the slot of its budgets: the key "<prefix>:{<tag>}:~r:<id, 16 hex digits>", which
// no budget key can be ('~' is not allowed in a rule name), holding each check's ticket.
// A settle deletes the marker; a void of a reservation whose decision was lost gives the
// spend the marker names back, or, when the reservation has not run yet, leaves the
// tombstone "x" there, which makes it a no-op should it still arrive; a settle re-sent
// after a failure applies only while the marker is the reservation's own. See allow.lua
// and settle.lua.
const (
	// markerTTL bounds how long a marker or a tombstone is kept: a void or a re-sent
	// settle later than this gives nothing back, and a reservation held up in the
	// network for longer than this after its void spends (both an overcount).
	markerTTL = time.Minute
	// repairMax is the most voids and re-sent settles waiting at once; more are dropped
	// (their spend stays: an overcount), and counted.
	repairMax = 1 << 14
	// repairTimeout bounds each attempt of a repair.
	repairTimeout = 250 * time.Millisecond
	// repairBatch is the most repairs sent at once (pipelined together); after a failed
	// attempt one is sent at a time until the store answers again.
	repairBatch = 256
	// repairBackoffMin and repairBackoffMax bound the wait after an attempt that failed.
	repairBackoffMin = 10 * time.Millisecond
	repairBackoffMax = 200 * time.Millisecond
)

var markerTTLArg = strconv.FormatInt(markerTTL.Milliseconds(), 10)

// newReservation draws a reservation id: 64 random bits, not 0.
func newReservation() int64 {
	var b [8]byte
	for {
		_, _ = rand.Read(b[:]) // never fails (crypto/rand)
		if id := int64(binary.LittleEndian.Uint64(b[:])); id != 0 {
			return id
		}
	}
}

// markerKey is the marker of reservation id in the hash slot of the budget key key.
func markerKey(key string, id int64) string {
	i := strings.IndexByte(key, '}')
	var b strings.Builder
	b.Grow(i + 1 + 4 + 16)
	b.WriteString(key[:i+1])
	b.WriteString(":~r:")
	b.WriteString(leaseMember(id))
	return b.String()
}

// Repairs reports the limiter's repairs: the voids of reservations whose decision was
// lost (the call failed after it may have reached the store) and the settles re-sent
// after a failure, both sent off the request path until the store answers them. pending
// is the number waiting or being sent. dropped counts, since New, those given up: the
// queue was full (16,384 waiting), or no answer came within a minute (the markers'
// TTL), or the store refused them for good; a dropped repair leaves the spend in place,
// an overcount. It is safe for concurrent use.
func (l *Limiter) Repairs() (pending, dropped int64) {
	r := &l.core.repair
	r.mu.Lock()
	pending = int64(len(r.queue) + r.sending)
	r.mu.Unlock()
	return pending, int64(r.dropped.Load())
}

// repairs re-sends, on a goroutine of its own that runs while any is waiting, the
// settle.lua calls that must land however late: voids and failed settles. Each is
// idempotent (see settle.lua), so one sent twice, or sent again after an attempt that
// in fact landed, applies once.
type repairs struct {
	c       *core
	mu      sync.Mutex
	queue   []*repairJob
	sending int  // jobs taken by the running goroutine
	running bool // a goroutine sends the queue
	// sent, when not nil (tests), is told of every attempt's outcome.
	sent                    func(job *repairJob, err error)
	queued, landed, dropped atomic.Uint64
}

// repairJob is one settle.lua call to make: keys end with the marker, args are
// settle.lua's, with mode 'void' or 'retry'.
type repairJob struct {
	ctx    context.Context // without cancel: for the client's hooks
	keys   []string
	args   []any
	checks []ratebudget.Check // the call's checks, in the order of their arguments
	until  time.Time
	done   func() // after it landed, if not nil
}

// add takes on the call of settle.lua with keys and args, of checks.
func (r *repairs) add(ctx context.Context, keys []string, args []any, checks []ratebudget.Check, done func()) {
	job := &repairJob{ctx: context.WithoutCancel(ctx), keys: keys, args: args, checks: checks, until: time.Now().Add(markerTTL), done: done}
	r.mu.Lock()
	if len(r.queue)+r.sending >= repairMax {
		r.mu.Unlock()
		r.dropped.Add(1)
		return
	}
	r.queued.Add(1)
	r.queue = append(r.queue, job)
	start := !r.running
	r.running = true
	r.mu.Unlock()
	if start {
		go r.run()
	}
}

// run sends the queue until it is empty: up to repairBatch jobs at once while the store
// answers, one at a time with a growing wait while it does not.
func (r *repairs) run() {
	batch, wait := repairBatch, repairBackoffMin
	for {
		r.mu.Lock()
		if len(r.queue) == 0 {
			r.running = false
			r.mu.Unlock()
			return
		}
		k := min(batch, len(r.queue))
		jobs := append([]*repairJob(nil), r.queue[:k]...)
		r.queue = append(r.queue[:0], r.queue[k:]...)
		r.sending = k
		r.mu.Unlock()

		failed := make([]bool, len(jobs))
		var wg sync.WaitGroup
		for i, job := range jobs {
			wg.Go(func() {
				failed[i] = !r.send(job)
			})
		}
		wg.Wait()
		var again []*repairJob
		for i, job := range jobs {
			if failed[i] {
				again = append(again, job)
			}
		}
		r.mu.Lock()
		r.queue = append(r.queue, again...)
		r.sending = 0
		r.mu.Unlock()
		if len(again) == 0 {
			batch, wait = repairBatch, repairBackoffMin
			continue
		}
		batch = 1
		time.Sleep(wait)
		wait = min(2*wait, repairBackoffMax)
	}
}

// send makes one attempt of job. It reports false when the job is to be tried again.
func (r *repairs) send(job *repairJob) (ok bool) {
	if time.Now().After(job.until) {
		r.dropped.Add(1)
		return true
	}
	defer func() {
		if p := recover(); p != nil { // a client hook's bug: no caller to reach here
			r.dropped.Add(1)
			ok = true
		}
	}()
	ctx, cancel := context.WithTimeout(job.ctx, repairTimeout)
	defer cancel()
	// A charge whose calendar periods, computed around the caller's clock, miss the
	// server's time is sent again around it, as the settle itself is.
	v, err := r.c.runAround(ctx, settleScript, settleSource, job.keys, job.args, len(job.checks), 9,
		func(i int) *ratebudget.Rule { return &job.checks[i].Rule })
	if err == nil {
		if vals, isArray := v.([]any); !isArray || len(vals) != len(job.keys)-1 {
			err = badReply("repair: unexpected reply")
		}
	}
	if r.sent != nil {
		r.sent(job, err)
	}
	var re redis.Error
	switch {
	case err == nil:
		r.landed.Add(1)
		if job.done != nil {
			job.done()
		}
		return true
	case errors.As(err, &re) && strings.HasPrefix(re.Error(), "ERR ratebudget:"), isReplyError(err),
		errors.Is(err, redis.ErrClosed):
		// The script refused it (its arguments), or the client was closed: for good.
		r.dropped.Add(1)
		return true
	}
	return false
}

func isReplyError(err error) bool {
	var se *ratebudget.StoreError
	var re *replyError
	return errors.As(err, &se) && errors.As(se.Err, &re)
}

// void takes on the voids of the reservation d made for the checks g, whose call may
// have reached the store without the caller learning its outcome: one settle.lua call in
// mode 'void', giving every check back in full.
func (c *core) void(ctx context.Context, d *decision, g []int) {
	keys := make([]string, 0, len(g)+1)
	args := make([]any, 0, 2+9*len(g))
	args = append(args, "void")
	var checks []ratebudget.Check
	var now int64 // Unix ms, read for a Calendar check (see core.window)
	for _, j := range g {
		ch := &d.checks[j]
		r := &ch.Rule
		keys = append(keys, d.keys[j])
		member := "-"
		if d.members != nil && r.Algorithm == ratebudget.InFlight {
			member = d.members[j]
		}
		args = append(args, int64(r.Algorithm), r.Limit, c.window(r, &now), timerule.Capacity(r), ch.Cost, int64(0), int64(0), int64(0), member)
		checks = append(checks, *ch) // a copy: the caller's slice is its own again
	}
	keys = append(keys, markerKey(d.keys[g[0]], d.rid))
	args = append(args, markerTTLArg)
	var done func()
	if c.gaveBack != nil {
		done = func() { c.gaveBack(checks) }
	}
	c.repair.add(ctx, keys, args, checks, done)
}
