package lua

import (
	"context"
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/autopipe"
	"github.com/ratebudget/ratebudget/internal/refusal"
	"github.com/ratebudget/ratebudget/internal/wire"
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
	cacheSize     int       // refusal cache entries; 0: no cache
	batch         int       // decisions per pipeline; 0: no pipelining
	refusals      *refusal.Cache
	// proc is set for go-redis's own clients: decisions are then sent as prepared
	// commands (see process); other Clients get EvalSha and Eval calls.
	proc               processor
	allowSHA, allowSrc any // boxed once
	dedicated          bool
	conn               *wire.Conn // the dedicated connection, if any
	coalesceMax        int        // WithCoalescing's group; 0: no coalescing
	coal               *coalescer
	oneServer          bool // WithOneServer: checks of every slot in one call
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

// DefaultRefusalCacheSize is the number of refusals the limiter remembers when neither
// [WithRefusalCache] nor [WithoutRefusalCache] is given.
const DefaultRefusalCacheSize = 1 << 16

// MaxRefusalCacheSize is the largest accepted [WithRefusalCache] size.
const MaxRefusalCacheSize = 1 << 24

// WithRefusalCache sets how many refusals the limiter remembers (default
// [DefaultRefusalCacheSize]): a budget that refused a cost with a known wait is refused
// again locally, without a call to Redis, for requests of at least that cost until the
// wait is over (see the package documentation for why this is exact). n must be in 1 to
// [MaxRefusalCacheSize]; the cache holds at most n entries, plus one per shard of
// rounding (32 shards).
func WithRefusalCache(n int) Option {
	return func(l *Limiter) error {
		if n < 1 || n > MaxRefusalCacheSize {
			return &ratebudget.ConfigError{Field: "WithRefusalCache", Problem: fmt.Sprintf("must be 1 to %d entries, got %d", MaxRefusalCacheSize, n)}
		}
		l.cacheSize = n
		return nil
	}
}

// WithPipelining sets how many concurrent decisions may share one pipeline (default
// [DefaultPipelineBatch]; 1 to [MaxPipelineBatch]). With go-redis's own clients
// (*redis.Client, *redis.ClusterClient, *redis.Ring) decisions that arrive while others
// are in flight are sent together, one pipeline and one pair of system calls for many
// decisions; a decision that finds nothing in flight is sent at once, so an idle service
// sees no added latency. Each decision stays its own script call: pipelining changes no
// outcome, only the cost per decision under load.
func WithPipelining(maxBatch int) Option {
	return func(l *Limiter) error {
		if maxBatch < 1 || maxBatch > MaxPipelineBatch {
			return &ratebudget.ConfigError{Field: "WithPipelining", Problem: fmt.Sprintf("must be 1 to %d decisions, got %d", MaxPipelineBatch, maxBatch)}
		}
		l.batch = maxBatch
		return nil
	}
}

// WithoutPipelining sends every decision on its own.
func WithoutPipelining() Option {
	return func(l *Limiter) error {
		l.batch = 0
		return nil
	}
}

// DefaultPipelineBatch is the largest number of decisions in one pipeline when neither
// [WithPipelining] nor [WithoutPipelining] is given.
const DefaultPipelineBatch = 128

// MaxPipelineBatch is the largest accepted [WithPipelining] batch.
const MaxPipelineBatch = 4096

// WithDedicatedConnection sends decisions over a connection of the limiter's own,
// opened with the *redis.Client's dialer, credentials and database, instead of through
// the client's pool: decisions from concurrent callers are written together as they
// arrive and their replies matched in order, which costs markedly less CPU per decision
// than go-redis pipelines under load. It applies to a *redis.Client (including a
// failover client) only; it ignores the client's hooks (the commands do not pass
// through them) and its retry settings (a decision is never retried). The connection
// is dialed on first use and again after a failure, and closed by [Limiter.Close] or
// after 5 minutes without a decision.
func WithDedicatedConnection() Option {
	return func(l *Limiter) error {
		l.dedicated = true
		return nil
	}
}

// WithOneServer declares that every key lives on one Redis server: a *redis.Client
// (standalone, or a failover client following a primary), with no Redis Cluster and no
// sharding proxy in between. Checks of any hash slots, for example a service-wide rule
// next to a per-client rule, are then decided in one script call, atomically and
// all-or-nothing, instead of slot group by slot group with refunds: one round trip, and
// no window in which another caller sees budget that is about to be refunded.
//
// It needs a *redis.Client. Do not use it behind a proxy that shards keys (Envoy,
// twemproxy, a sharded database behind one endpoint): the script would run where its
// first key lives, and budgets of the other slots would be split between shards.
func WithOneServer() Option {
	return func(l *Limiter) error {
		l.oneServer = true
		return nil
	}
}

// credentials returns the client's credentials provider, if it has one, as the
// dedicated connection asks for it at each dial.
func credentials(opt *redis.Options) func(context.Context) (string, string, error) {
	if f := opt.CredentialsProviderContext; f != nil {
		return f
	}
	if f := opt.CredentialsProvider; f != nil {
		return func(context.Context) (string, string, error) {
			u, p := f()
			return u, p, nil
		}
	}
	return nil
}

// Close closes the limiter's dedicated connection, if it has one (see
// [WithDedicatedConnection]); decisions in flight fail. It does not close the client.
func (l *Limiter) Close() error {
	if l.conn != nil {
		return l.conn.Close()
	}
	return nil
}

// WithoutRefusalCache makes every decision a call to Redis.
func WithoutRefusalCache() Option {
	return func(l *Limiter) error {
		l.cacheSize = 0
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
		cacheSize:     DefaultRefusalCacheSize,
		batch:         DefaultPipelineBatch,
	}
	for _, o := range opts {
		if o == nil {
			return nil, &ratebudget.ConfigError{Field: "options", Problem: "must not be nil"}
		}
		if err := o(l); err != nil {
			return nil, err
		}
	}
	var pc autopipe.Client
	switch c := client.(type) {
	case *redis.Client:
		pc = c
	case *redis.ClusterClient:
		pc = c
	case *redis.Ring:
		pc = c
	}
	if _, ok := client.(*redis.Client); l.oneServer && !ok {
		return nil, &ratebudget.ConfigError{Field: "WithOneServer", Problem: fmt.Sprintf("needs a *redis.Client, got %T", client)}
	}
	if l.dedicated {
		c, ok := client.(*redis.Client)
		if !ok {
			return nil, &ratebudget.ConfigError{Field: "WithDedicatedConnection", Problem: fmt.Sprintf("needs a *redis.Client, got %T", client)}
		}
		opt := c.Options()
		if opt.StreamingCredentialsProvider != nil {
			return nil, &ratebudget.ConfigError{Field: "WithDedicatedConnection", Problem: "the client's StreamingCredentialsProvider is not supported (CredentialsProvider and CredentialsProviderContext are)"}
		}
		l.conn = wire.New(wire.Options{
			Dial: func(ctx context.Context) (net.Conn, error) {
				if opt.DialTimeout > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, opt.DialTimeout)
					defer cancel()
				}
				return opt.Dialer(ctx, opt.Network, opt.Addr)
			},
			Username:     opt.Username,
			Password:     opt.Password,
			Credentials:  credentials(opt),
			DB:           opt.DB,
			ReplyTimeout: opt.ReadTimeout,
			WriteTimeout: opt.WriteTimeout,
		})
		l.proc = l.conn
	} else if pc != nil {
		l.proc = pc
		if l.batch > 0 {
			// Two pipelines in flight keep the connection busy while the next forms.
			l.proc = autopipe.New(pc, l.batch, 2)
		}
	}
	l.allowSHA, l.allowSrc = l.allow.Hash(), allowSource
	if l.cacheSize > 0 {
		l.refusals = refusal.New(l.cacheSize)
	}
	if l.coalesceMax > 0 {
		l.coal = newCoalescer(l.coalesceMax)
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
	buf   []byte   // key bytes
	hash  []byte   // digest input
	ckey  []byte   // refusal cache key
	ends  []int    // end of each check's key in buf
	keys  []string // string keys, for every path but a single slot's call over the dedicated connection
	kb    [][]byte // that path's keys, views of buf
	slots []uint16
	outs  []ratebudget.Outcome
	aux   []int64
	idx   []int // checks of the current group
	gkeys []string
	args  []any
	nums  []int64 // numeric arguments, passed by pointer (no boxing)
	ints  []int64 // the script's reply
	done  []int   // groups admitted, as first check indexes
	lost  bool    // a call failed in transit: the client may still hold args
	mult  int64   // the call asks for mult times each check's cost (a coalesced group)

	// Coalescing (see coalesced); waiting and runner are guarded by the shard's lock.
	sig     []byte        // the decision's signature
	wake    chan struct{} // wakes a waiting member; capacity 1
	timer   *time.Timer
	waiting bool  // in a group not yet sent
	runner  bool  // sends its group's call
	role    uint8 // for other members, set before the wake
	gerr    error // roleErr's error
}

func (l *Limiter) getScratch(n int) *scratch {
	s, _ := l.pool.Get().(*scratch)
	if s == nil {
		s = &scratch{}
	}
	s.buf = s.buf[:0]
	s.ends = s.ends[:0]
	s.keys = s.keys[:0]
	s.kb = s.kb[:0]
	s.slots = s.slots[:0]
	s.outs = s.outs[:0]
	s.aux = s.aux[:0]
	s.done = s.done[:0]
	s.mult = 1
	if l.coal != nil && s.wake == nil {
		s.wake = make(chan struct{}, 1)
	}
	for range n {
		s.outs = append(s.outs, ratebudget.Outcome{})
		s.aux = append(s.aux, 0)
	}
	return s
}

func (l *Limiter) putScratch(s *scratch) {
	if s.lost {
		return // never reuse what a command in an unknown state may still reference
	}
	clear(s.keys)
	clear(s.kb)
	clear(s.gkeys)
	clear(s.args)
	if cap(s.buf) > 4096 || cap(s.hash) > 4096 {
		s.buf, s.hash = nil, nil // do not keep a hostile identity's buffer
	}
	l.pool.Put(s)
}

// key returns the key of check i, built by Allow.
func (s *scratch) key(i int) []byte {
	start := 0
	if i > 0 {
		start = s.ends[i-1]
	}
	return s.buf[start:s.ends[i]]
}

// cacheKey sets s.ckey to the refusal cache's key of check i: its budget key and the
// rule's parameters, so that a rule changed under the same name never meets the
// refusals of its former self.
func (s *scratch) cacheKey(i int, c *ratebudget.Check) []byte {
	s.ckey = append(s.ckey[:0], s.key(i)...)
	s.ckey = binary.AppendUvarint(s.ckey, uint64(c.Rule.Limit))
	s.ckey = binary.AppendUvarint(s.ckey, uint64(c.Rule.Window))
	s.ckey = binary.AppendUvarint(s.ckey, uint64(c.Rule.Burst))
	return s.ckey
}

// Allow decides all checks at once (see [ratebudget.Limiter]). Checks are validated with
// [ratebudget.ValidateChecks] before anything is sent. Checks that share a hash slot
// cost one script call; checks of several slots are decided slot by slot, with a
// best-effort refund when a later slot refuses (see the package documentation), unless
// [WithOneServer] puts them all in one call. A refusal remembered by the refusal cache
// is repeated without a call.
func (l *Limiter) Allow(ctx context.Context, checks []ratebudget.Check) (ratebudget.Decision, error) {
	return l.decide(ctx, 0, checks)
}

// AllowWithin is Allow bounded by timeout as well as by ctx (see
// [ratebudget.TimeoutBound]); a timeout of zero or less adds no bound. Over a dedicated
// connection a decision of one slot is bounded without a context of its own; other
// decisions derive one.
func (l *Limiter) AllowWithin(ctx context.Context, timeout time.Duration, checks []ratebudget.Check) (ratebudget.Decision, error) {
	return l.decide(ctx, timeout, checks)
}

var _ ratebudget.TimeoutBound = (*Limiter)(nil)

// decide is Allow, with AllowWithin's timeout when within is above zero.
func (l *Limiter) decide(ctx context.Context, within time.Duration, checks []ratebudget.Check) (ratebudget.Decision, error) {
	if err := ratebudget.ValidateChecks(checks); err != nil {
		return ratebudget.Decision{}, err
	}
	if err := ctx.Err(); err != nil {
		// Nothing was sent: the outcome is certain.
		se := classify(err).(*ratebudget.StoreError)
		se.Uncertain = false
		return ratebudget.Decision{}, se
	}
	s := l.getScratch(len(checks))
	defer l.putScratch(s)

	single := true
	for i := range checks {
		var slot uint16
		s.buf, slot, s.hash = appendKey(s.buf, s.hash, l.prefix, &checks[i])
		s.ends = append(s.ends, len(s.buf))
		s.slots = append(s.slots, slot)
		single = single && (slot == s.slots[0] || l.oneServer)
	}

	var sent int64
	if l.refusals != nil {
		sent = l.refusals.Now()
	}
	if l.refusals != nil && !l.refusals.Empty() {
		found, exceeded := false, false
		var best ratebudget.Decision
		for i := range checks {
			// A check that exceeds its capacity makes the decision Exceeded, which no
			// cached refusal reports: the store decides it.
			exceeded = exceeded || checks[i].Cost > checks[i].Rule.Capacity()
			d, ok := l.refusals.Lookup(s.cacheKey(i, &checks[i]), checks[i].Cost, sent)
			if ok && (!found || d.RetryAfter > best.RetryAfter) {
				d.Index = i
				best, found = d, true
			}
		}
		if found && !exceeded {
			return best, nil
		}
	}

	if single && l.conn != nil {
		// The dedicated connection encodes the arguments before Ints waits: the key
		// bytes can be sent from buf, without a string each.
		for i := range checks {
			s.kb = append(s.kb, s.key(i))
		}
	} else {
		for i := range checks {
			s.keys = append(s.keys, string(s.key(i)))
		}
	}
	timeout := l.timeout
	if within > 0 && (timeout <= 0 || within < timeout) {
		timeout = within
	}
	if timeout > 0 && !(single && l.conn != nil) {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
		timeout = 0 // the context bounds every call
	}
	var d ratebudget.Decision
	if single {
		s.idx = s.idx[:0]
		for i := range checks {
			s.idx = append(s.idx, i)
		}
		if _, err := l.spend(ctx, timeout, s, checks); err != nil {
			return ratebudget.Decision{}, err
		}
		d = ratebudget.Combine(checks, s.outs)
	} else {
		var err error
		if d, err = l.allowGroups(ctx, s, checks); err != nil {
			return ratebudget.Decision{}, err
		}
	}
	switch {
	case l.refusals == nil:
	case d.Allowed:
		// The spend makes any refusal cached for these budgets a stale report.
		for i := 0; i < len(checks) && !l.refusals.Empty(); i++ {
			l.refusals.Forget(s.cacheKey(i, &checks[i]))
		}
	case !d.Exceeded && d.RetryAfter > 0:
		// d reports the outcome Redis decided for checks[d.Index] (allowGroups only
		// reports refusals that a script returned).
		l.refusals.Store(s.cacheKey(d.Index, &checks[d.Index]), checks[d.Index].Cost, sent, d)
	}
	return d, nil
}

// spend decides the checks in s.idx and spends them if all are admitted (runAllow in
// write mode), coalesced with concurrent identical decisions under WithCoalescing.
func (l *Limiter) spend(ctx context.Context, timeout time.Duration, s *scratch, checks []ratebudget.Check) (bool, error) {
	if l.coal != nil {
		return l.spendCoalesced(ctx, timeout, s, checks)
	}
	return l.runAllow(ctx, timeout, s, checks, true)
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
			// rule as a single-step limiter would. On failure the group counts as
			// admitted: it then cannot be reported (a refusal is already decided).
			if _, err := l.runAllow(ctx, 0, s, checks, false); err != nil {
				for _, j := range s.idx {
					s.outs[j] = ratebudget.Outcome{Allowed: true}
				}
			}
			continue
		}
		ok, err := l.spend(ctx, 0, s, checks)
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
	// The refund outlives a canceled caller, but not its deadline: a refund cut short
	// leaves the spend in place (an over-count, never an under-count).
	deadline := time.Now().Add(l.refundTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	ctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	defer cancel()
	for _, first := range s.done {
		s.group(first)
		s.gkeys = s.gkeys[:0]
		args := make([]any, 0, 6*len(s.idx))
		for _, j := range s.idx {
			c := &checks[j]
			s.gkeys = append(s.gkeys, s.keys[j])
			args = append(args, int64(c.Rule.Algorithm), c.Rule.Limit, c.Rule.Window.Milliseconds(),
				c.Rule.Capacity(), c.Cost, s.aux[j])
		}
		if l.proc == nil {
			_ = l.refund.Run(ctx, l.client, s.gkeys, args...).Err()
			continue
		}
		_ = l.processScript(ctx, l.refund, refundSource, s.gkeys, args) // copies its arguments
	}
	s.done = s.done[:0]
}

// processScript runs script through l.proc as EVALSHA, and as EVAL after NOSCRIPT.
func (l *Limiter) processScript(ctx context.Context, script *redis.Script, src string, keys []string, args []any) error {
	cmdArgs := make([]any, 0, 3+len(keys)+len(args))
	cmdArgs = append(cmdArgs, "evalsha", script.Hash(), len(keys))
	for _, k := range keys {
		cmdArgs = append(cmdArgs, k)
	}
	cmdArgs = append(cmdArgs, args...)
	cmd := redis.NewCmd(ctx, cmdArgs...)
	cmd.SetFirstKeyPos(3)
	err := l.proc.Process(ctx, cmd)
	if err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT")) {
		cmdArgs[0], cmdArgs[1] = "eval", src
		cmd = redis.NewCmd(ctx, cmdArgs...)
		cmd.SetFirstKeyPos(3)
		err = l.proc.Process(ctx, cmd)
	}
	return err
}

// BoundByContext reports whether Allow returns once its context is done whatever Redis
// does (see [ratebudget.ContextBound]): true with pipelining (the default with go-redis's
// own clients) and with [WithDedicatedConnection], whose callers wait on their context,
// and with a client whose ContextTimeoutEnabled option lets the context bound its
// socket reads.
func (l *Limiter) BoundByContext() bool {
	if _, ok := l.proc.(*autopipe.Batcher); ok || l.conn != nil {
		return true
	}
	switch c := l.client.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	}
	return false
}

var _ ratebudget.ContextBound = (*Limiter)(nil)

// processor runs a prepared command: go-redis's own clients.
type processor interface {
	Process(ctx context.Context, cmd redis.Cmder) error
}

// runAllow runs allow.lua for the checks in s.idx and stores their outcomes in s.outs
// and s.aux. It reports whether all were admitted.
//
// A timeout above zero bounds the call over the dedicated connection (other paths get
// their bound from ctx).
func (l *Limiter) runAllow(ctx context.Context, timeout time.Duration, s *scratch, checks []ratebudget.Check, write bool) (bool, error) {
	mode := "0"
	if write {
		mode = "1"
	}
	// The numeric arguments, written before any pointer to them is taken.
	s.nums = s.nums[:0]
	for _, j := range s.idx {
		c := &checks[j]
		s.nums = append(s.nums, int64(c.Rule.Algorithm), c.Rule.Limit, c.Rule.Window.Milliseconds(),
			c.Rule.Capacity(), c.Cost*s.mult)
	}
	var v any
	var err error
	if l.conn != nil {
		// The dedicated connection reads the integers without go-redis values.
		if s.ints, err = l.processInts(ctx, timeout, s, mode); err != nil {
			if errors.Is(err, wire.ErrReplyShape) {
				return false, badReply(err.Error())
			}
			return false, classify(err)
		}
		return parseAllow(s.ints, s, len(s.idx))
	}
	if l.proc != nil {
		v, err = l.process(ctx, s, mode)
	} else {
		s.gkeys = s.gkeys[:0]
		args := make([]any, 0, 1+len(s.nums))
		args = append(args, mode)
		for _, j := range s.idx {
			s.gkeys = append(s.gkeys, s.keys[j])
		}
		for _, n := range s.nums {
			args = append(args, n)
		}
		v, err = l.allow.Run(ctx, l.client, s.gkeys, args...).Result()
	}
	if err != nil {
		return false, classify(err)
	}
	if s.ints, err = replyInts(v, s.ints[:0]); err != nil {
		return false, err
	}
	return parseAllow(s.ints, s, len(s.idx))
}

// processInts is process over the dedicated connection.
func (l *Limiter) processInts(ctx context.Context, timeout time.Duration, s *scratch, mode string) ([]int64, error) {
	l.allowArgs(s, mode)
	start := time.Now()
	ints, err := l.conn.Ints(ctx, timeout, s.args, s.ints[:0])
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		if timeout > 0 {
			if timeout -= time.Since(start); timeout <= 0 {
				return ints, context.DeadlineExceeded // no time left to send EVAL
			}
		}
		s.args[0], s.args[1] = "eval", l.allowSrc
		ints, err = l.conn.Ints(ctx, timeout, s.args, s.ints[:0])
	}
	return ints, err
}

// allowArgs sets s.args to allow.lua's EVALSHA for the checks in s.idx: keys and
// numbers are passed by pointer, which go-redis and the dedicated connection write
// without boxing them into new interface values.
func (l *Limiter) allowArgs(s *scratch, mode string) {
	s.args = append(s.args[:0], "evalsha", l.allowSHA, len(s.idx))
	for _, j := range s.idx {
		if len(s.kb) > 0 {
			s.args = append(s.args, &s.kb[j])
		} else {
			s.args = append(s.args, &s.keys[j])
		}
	}
	if mode == "1" {
		s.args = append(s.args, "1") // a constant: no boxing
	} else {
		s.args = append(s.args, "0")
	}
	for k := range s.nums {
		s.args = append(s.args, &s.nums[k])
	}
}

// replyInts appends the integers of a go-redis reply to dst; a reply of another shape
// is a bad reply.
func replyInts(v any, dst []int64) ([]int64, error) {
	vals, ok := v.([]any)
	if !ok {
		return dst, badReply(fmt.Sprintf("%T, want an array", v))
	}
	for e, x := range vals {
		n, ok := x.(int64)
		if !ok {
			return dst, badReply(fmt.Sprintf("element %d is %T, want an integer", e, x))
		}
		dst = append(dst, n)
	}
	return dst, nil
}

// process sends EVALSHA (and EVAL after NOSCRIPT, as go-redis's Script.Run does) with
// the argument list of allowArgs.
func (l *Limiter) process(ctx context.Context, s *scratch, mode string) (any, error) {
	l.allowArgs(s, mode)
	cmd := redis.NewCmd(ctx, s.args...)
	cmd.SetFirstKeyPos(3)
	err := l.proc.Process(ctx, cmd)
	if err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT")) {
		s.args[0], s.args[1] = "eval", l.allowSrc
		cmd = redis.NewCmd(ctx, s.args...)
		cmd.SetFirstKeyPos(3)
		err = l.proc.Process(ctx, cmd)
	}
	if err != nil {
		var rErr redis.Error
		if !errors.As(err, &rErr) {
			s.lost = true
		}
		return nil, err
	}
	return cmd.Val(), nil
}

// parseAllow checks allow.lua's reply for n checks and stores it in s.outs and s.aux.
func parseAllow(vals []int64, s *scratch, n int) (bool, error) {
	if len(vals) != 6*n {
		return false, badReply(fmt.Sprintf("%d elements, want %d", len(vals), 6*n))
	}
	all := true
	for k, j := range s.idx {
		var f [6]int64
		copy(f[:], vals[6*k:])
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
