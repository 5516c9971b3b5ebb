package lua

import (
	"context"
	_ "embed"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget"
)

var (
	//go:embed allow.lua
	allowSource string
	//go:embed refund.lua
	refundSource string
)

// Client is what the limiter needs from a go-redis client: running scripts.
// *redis.Client, *redis.ClusterClient, *redis.Ring and the failover clients implement it.
type Client interface {
	redis.Scripter
}

// Limiter is the Redis [ratebudget.Limiter]. It holds no budget state itself: every
// decision is made by the Redis server. It is safe for concurrent use.
type Limiter struct {
	client        Client
	prefix        string
	timeout       time.Duration
	refundTimeout time.Duration
	allow, refund *redis.Script
	pool          sync.Pool // *scratch
}

var _ ratebudget.Limiter = (*Limiter)(nil)

// Option configures a [Limiter] in [New].
type Option func(*Limiter) error

// DefaultPrefix is the key prefix when [WithPrefix] is not given.
const DefaultPrefix = "rb"

// MaxPrefixLen is the longest accepted key prefix, in bytes.
const MaxPrefixLen = 64

// WithPrefix sets the first part of every key (default [DefaultPrefix]), to give each
// application or environment sharing a Redis its own budgets. It must be 1 to
// [MaxPrefixLen] bytes of printable ASCII other than space, '{' and '}' (braces would
// change the Redis Cluster hash slot).
func WithPrefix(prefix string) Option {
	return func(l *Limiter) error {
		if prefix == "" || len(prefix) > MaxPrefixLen {
			return &ratebudget.ConfigError{Field: "WithPrefix", Problem: fmt.Sprintf("must be 1 to %d bytes, got %d", MaxPrefixLen, len(prefix))}
		}
		for i := 0; i < len(prefix); i++ {
			if c := prefix[i]; c <= ' ' || c > '~' || c == '{' || c == '}' {
				return &ratebudget.ConfigError{Field: "WithPrefix", Problem: fmt.Sprintf("has byte %q at %d; use printable ASCII without space or braces", c, i)}
			}
		}
		l.prefix = prefix
		return nil
	}
}

// WithTimeout bounds each decision (every script call it makes) by d, in addition to
// the caller's context. Zero, the default, means the caller's context alone. It must not
// be negative. The client's own timeouts still apply (see the package documentation).
func WithTimeout(d time.Duration) Option {
	return func(l *Limiter) error {
		if d < 0 {
			return &ratebudget.ConfigError{Field: "WithTimeout", Problem: "must not be negative, got " + d.String()}
		}
		l.timeout = d
		return nil
	}
}

// WithRefundTimeout bounds a refund (see the package documentation), which runs even if
// the caller's context has ended. Default 500ms; it must be positive.
func WithRefundTimeout(d time.Duration) Option {
	return func(l *Limiter) error {
		if d <= 0 {
			return &ratebudget.ConfigError{Field: "WithRefundTimeout", Problem: "must be positive, got " + d.String()}
		}
		l.refundTimeout = d
		return nil
	}
}

// New returns a limiter that keeps its budgets in the Redis reached by client. It makes
// no call to Redis; scripts are sent on first use. It returns a *[ratebudget.ConfigError]
// naming the option at fault.
func New(client Client, opts ...Option) (*Limiter, error) {
	if client == nil {
		return nil, &ratebudget.ConfigError{Field: "client", Problem: "must not be nil"}
	}
	l := &Limiter{
		client:        client,
		prefix:        DefaultPrefix,
		refundTimeout: 500 * time.Millisecond,
		allow:         redis.NewScript(allowSource),
		refund:        redis.NewScript(refundSource),
	}
	for _, o := range opts {
		if o == nil {
			return nil, &ratebudget.ConfigError{Field: "options", Problem: "must not be nil"}
		}
		if err := o(l); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// Prefix returns the key prefix.
func (l *Limiter) Prefix() string { return l.prefix }

// Key returns the Redis key that holds c's budget. It is meant for tools and tests;
// [Limiter.Allow] does not need it.
func (l *Limiter) Key(c ratebudget.Check) string {
	k, _, _ := appendKey(nil, nil, l.prefix, &c)
	return string(k)
}

// scratch holds one decision's buffers, reused through Limiter.pool.
type scratch struct {
	buf   []byte // key bytes
	hash  []byte // digest input
	keys  []string
	slots []uint16
	outs  []ratebudget.Outcome
	aux   []int64
	idx   []int // checks of the current group
	gkeys []string
	args  []any
	done  []int // groups admitted, as first check indexes
}

func (l *Limiter) getScratch(n int) *scratch {
	s, _ := l.pool.Get().(*scratch)
	if s == nil {
		s = &scratch{}
	}
	s.keys = s.keys[:0]
	s.slots = s.slots[:0]
	s.outs = s.outs[:0]
	s.aux = s.aux[:0]
	s.done = s.done[:0]
	for range n {
		s.outs = append(s.outs, ratebudget.Outcome{})
		s.aux = append(s.aux, 0)
	}
	return s
}

func (l *Limiter) putScratch(s *scratch) {
	clear(s.keys)
	clear(s.gkeys)
	clear(s.args)
	if cap(s.buf) > 4096 || cap(s.hash) > 4096 {
		s.buf, s.hash = nil, nil // do not keep a hostile identity's buffer
	}
	l.pool.Put(s)
}

// Allow decides all checks at once (see [ratebudget.Limiter]). Checks are validated with
// [ratebudget.ValidateChecks] before anything is sent. Checks that share a hash slot
// cost one script call; checks of several slots are decided slot by slot, with a
// best-effort refund when a later slot refuses (see the package documentation).
func (l *Limiter) Allow(ctx context.Context, checks []ratebudget.Check) (ratebudget.Decision, error) {
	if err := ratebudget.ValidateChecks(checks); err != nil {
		return ratebudget.Decision{}, err
	}
	if err := ctx.Err(); err != nil {
		// Nothing was sent: the outcome is certain.
		se := classify(err).(*ratebudget.StoreError)
		se.Uncertain = false
		return ratebudget.Decision{}, se
	}
	if l.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, l.timeout)
		defer cancel()
	}
	s := l.getScratch(len(checks))
	defer l.putScratch(s)

	s.buf = s.buf[:0]
	single := true
	for i := range checks {
		var slot uint16
		start := len(s.buf)
		s.buf, slot, s.hash = appendKey(s.buf, s.hash, l.prefix, &checks[i])
		s.keys = append(s.keys, string(s.buf[start:]))
		s.slots = append(s.slots, slot)
		single = single && slot == s.slots[0]
	}

	if single {
		s.idx = s.idx[:0]
		for i := range checks {
			s.idx = append(s.idx, i)
		}
		if _, err := l.runAllow(ctx, s, checks, true); err != nil {
			return ratebudget.Decision{}, err
		}
		return ratebudget.Combine(checks, s.outs), nil
	}
	return l.allowGroups(ctx, s, checks)
}

// group sets s.idx to the checks in the slot of checks[first].
func (s *scratch) group(first int) {
	s.idx = s.idx[:0]
	for i := first; i < len(s.slots); i++ {
		if s.slots[i] == s.slots[first] {
			s.idx = append(s.idx, i)
		}
	}
}

// firstOfGroup reports whether check i is the first of its slot group.
func (s *scratch) firstOfGroup(i int) bool {
	for j := 0; j < i; j++ {
		if s.slots[j] == s.slots[i] {
			return false
		}
	}
	return true
}

func (l *Limiter) allowGroups(ctx context.Context, s *scratch, checks []ratebudget.Check) (ratebudget.Decision, error) {
	refused := false
	for i := range checks {
		if !s.firstOfGroup(i) {
			continue
		}
		s.group(i)
		if refused {
			// Decide the rest without writing, so that the decision reports the same
			// rule as a single-step limiter would.
			if _, err := l.runAllow(ctx, s, checks, false); err != nil {
				for _, j := range s.idx {
					s.outs[j] = ratebudget.Outcome{Allowed: true}
				}
			}
			continue
		}
		ok, err := l.runAllow(ctx, s, checks, true)
		if err != nil {
			l.refundDone(ctx, s, checks)
			return ratebudget.Decision{}, err
		}
		if !ok {
			refused = true
			l.refundDone(ctx, s, checks)
			continue
		}
		s.done = append(s.done, i)
	}
	return ratebudget.Combine(checks, s.outs), nil
}

// refundDone gives back the spend of the groups in s.done, best effort: errors are
// ignored (the decision is a refusal or an error either way).
func (l *Limiter) refundDone(ctx context.Context, s *scratch, checks []ratebudget.Check) {
	if len(s.done) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.refundTimeout)
	defer cancel()
	for _, first := range s.done {
		s.group(first)
		s.gkeys = s.gkeys[:0]
		s.args = s.args[:0]
		for _, j := range s.idx {
			c := &checks[j]
			s.gkeys = append(s.gkeys, s.keys[j])
			s.args = append(s.args, int64(c.Rule.Algorithm), c.Rule.Limit, c.Rule.Window.Milliseconds(),
				c.Rule.Capacity(), c.Cost, s.aux[j])
		}
		_ = l.refund.Run(ctx, l.client, s.gkeys, s.args...).Err()
	}
	s.done = s.done[:0]
}

// runAllow runs allow.lua for the checks in s.idx and stores their outcomes in s.outs
// and s.aux. It reports whether all were admitted.
func (l *Limiter) runAllow(ctx context.Context, s *scratch, checks []ratebudget.Check, write bool) (bool, error) {
	s.gkeys = s.gkeys[:0]
	s.args = s.args[:0]
	if write {
		s.args = append(s.args, "1")
	} else {
		s.args = append(s.args, "0")
	}
	for _, j := range s.idx {
		c := &checks[j]
		s.gkeys = append(s.gkeys, s.keys[j])
		s.args = append(s.args, int64(c.Rule.Algorithm), c.Rule.Limit, c.Rule.Window.Milliseconds(),
			c.Rule.Capacity(), c.Cost)
	}
	v, err := l.allow.Run(ctx, l.client, s.gkeys, s.args...).Result()
	if err != nil {
		return false, classify(err)
	}
	vals, ok := v.([]any)
	if !ok {
		return false, badReply(fmt.Sprintf("%T, want an array", v))
	}
	if len(vals) != 6*len(s.idx) {
		return false, badReply(fmt.Sprintf("%d elements, want %d", len(vals), 6*len(s.idx)))
	}
	all := true
	for k, j := range s.idx {
		var f [6]int64
		for e := range f {
			n, ok := vals[6*k+e].(int64)
			if !ok {
				return false, badReply(fmt.Sprintf("element %d is %T, want an integer", 6*k+e, vals[6*k+e]))
			}
			f[e] = n
		}
		if f[0] < 0 || f[0] > 1 || f[1] < 0 || f[1] > 1 || f[3] < 0 || f[4] < 0 || f[5] < 0 {
			return false, badReply(fmt.Sprintf("check %d: out-of-range values %v", k, f))
		}
		o := ratebudget.Outcome{
			Allowed:    f[0] == 1,
			Exceeded:   f[1] == 1,
			Remaining:  f[2],
			ResetAfter: time.Duration(f[3]) * time.Millisecond,
			RetryAfter: time.Duration(f[4]) * time.Millisecond,
		}
		if o.Allowed && o.Exceeded {
			return false, badReply(fmt.Sprintf("check %d: both allowed and exceeded", k))
		}
		all = all && o.Allowed
		s.outs[j] = o
		s.aux[j] = f[5]
	}
	return all, nil
}
