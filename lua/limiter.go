package lua

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/argcheck"
	"github.com/ratebudget/ratebudget/internal/budgetkey"
	"github.com/ratebudget/ratebudget/internal/refusal"
	"github.com/ratebudget/ratebudget/internal/timerule"
)

var (
	//go:embed allow.lua
	allowSource string
	//go:embed settle.lua
	settleBody string
	// settleSource is settle.lua after allow.lua as a function, whose mode '3' charges a
	// settle's extras (see settle.lua).
	settleSource = "local function allow(KEYS, ARGV)\n" + allowSource + "\nend\n" + settleBody

	allowScript  = redis.NewScript(allowSource)
	settleScript = redis.NewScript(settleSource)
)

// refundTimeout bounds a refund when the caller's context has no earlier deadline.
const refundTimeout = 500 * time.Millisecond

// Limiter is the Redis [ratebudget.Limiter]. It holds no budget state itself: every
// decision is made by the Redis server (or repeated from the refusal cache, see
// [WithRefusalCache]). It is safe for concurrent use. Make one with [New]: the zero
// Limiter has no client and must not be used.
type Limiter struct {
	top      layer // the outermost of the configured layers: refusal cache, coalescing, core
	core     *core
	refusals *refusal.Limiter
}

var _ ratebudget.Limiter = (*Limiter)(nil)

// layer is a limiter in the stack of core, coalescing and refusal cache: each also
// reports every check's outcome.
type layer interface {
	ratebudget.Limiter
	AllowEach(ctx context.Context, checks []ratebudget.Check, outcomes []ratebudget.Outcome) (ratebudget.Decision, error)
}

// core decides checks in Redis: one script call per hash slot group.
type core struct {
	keys      budgetkey.Keyer
	oneServer bool
	// direct runs a script on the caller's goroutine (nil when the client is an
	// *redis.AutoPipeliner). pipe, when set, carries decisions that start while
	// another is in flight (all of them when direct is nil); newPipe gets it from the
	// client on first use (the client's own asynchronous AutoPipeliner, shared with
	// its other users and closed with it).
	direct   redis.Scripter
	newPipe  func() (*redis.AutoPipeliner, error)
	pipeOnce sync.Once
	pipe     *redis.AutoPipeliner
	inflight atomic.Int64
	// reload, for a *redis.ClusterClient, reloads its slot map after errors that say
	// the topology may have changed.
	reload *reloader
	// gaveBack, when not nil (a refusal cache), is told of the checks a refund gave
	// back, after the refund.
	gaveBack func([]ratebudget.Check)
	// repair re-sends voids and failed settles.
	repair repairs
	// cal keeps the current calendar periods of the Calendar rules decided, around the
	// reading of now (time.Now; tests drive it), whose boundaries the scripts take.
	cal timerule.PeriodCache
	now func() time.Time
}

// Option configures a [Limiter] in [New].
type Option func(*config) error

type config struct {
	prefix    string
	secret    []byte
	cacheSize int
	coalesce  int
	oneServer bool
	// refusalClock is the refusal cache's clock (nil: the monotonic clock); tests set it.
	refusalClock func() time.Duration
}

// WithPrefix sets the first part of every key (default "rb"), to give each
// application or environment sharing a Redis its own budgets. It must be 1 to 64 bytes
// of printable ASCII other than space, '{' and '}' (braces would change the Redis
// Cluster hash slot). Every key of the limiter starts with its prefix and a colon, so
// SCAN with MATCH prefix+":*" lists them, once any of the glob characters * ? [ ] \ in
// the prefix is escaped with a backslash. The pattern also matches the keys of a
// limiter whose prefix starts with this one's and a colon ("rb:eu" under "rb").
func WithPrefix(prefix string) Option {
	return func(c *config) error {
		if prefix == "" || len(prefix) > 64 {
			return &ratebudget.ConfigError{Field: "WithPrefix", Problem: fmt.Sprintf("must be 1 to 64 bytes, got %d", len(prefix))}
		}
		for i := 0; i < len(prefix); i++ {
			if b := prefix[i]; b <= ' ' || b > '~' || b == '{' || b == '}' {
				return &ratebudget.ConfigError{Field: "WithPrefix", Problem: fmt.Sprintf("has byte %q at %d; use printable ASCII without space or braces", b, i)}
			}
		}
		c.prefix = prefix
		return nil
	}
}

// WithKeySecret keys the digests in budget keys with secret (HMAC-SHA-256), so that
// nobody without it can compute which Redis Cluster hash slot, or which key, an
// identity gets: without a secret anyone can search offline for identities that share
// a slot. Every replica sharing the budgets must use the same secret; changing it
// starts every budget afresh. It must be 16 to 1024 bytes; the limiter keeps a copy.
// Without this option digests are unkeyed SHA-256.
func WithKeySecret(secret []byte) Option {
	return func(c *config) error {
		if len(secret) < 16 || len(secret) > 1024 {
			return &ratebudget.ConfigError{Field: "WithKeySecret", Problem: fmt.Sprintf("must be 16 to 1024 bytes, got %d", len(secret))}
		}
		c.secret = append([]byte(nil), secret...)
		return nil
	}
}

// WithRefusalCache sets how many refusals the limiter remembers (default 65,536: the
// cache is on unless n is 0): a budget that refused a cost with a known wait is refused
// again locally, without a call to Redis, for requests of that cost (of at least that
// cost under a fixed window) until the wait is over, but for at most 1s after the
// refused request was sent, with the wait that is left (see the package documentation
// for why this is exact). So a change made elsewhere (a raised limit, a budget reset
// through another replica, a FLUSHALL) is seen within 1s, and a flood of refused
// requests costs Redis at most one call a second per budget. n must be 0 to 2^24; the
// cache holds at most n entries, plus one per shard of rounding (32 shards).
func WithRefusalCache(n int) Option {
	return func(c *config) error {
		if n < 0 || n > 1<<24 {
			return &ratebudget.ConfigError{Field: "WithRefusalCache", Problem: fmt.Sprintf("must be 0 to %d entries, got %d", 1<<24, n)}
		}
		c.cacheSize = n
		return nil
	}
}

// WithCoalescing groups concurrent identical decisions, up to n per group (0, the
// default, turns it off; else 2 to 4096): a decision that finds another for the same
// checks (same budgets, rule parameters and costs, all costs equal) in flight waits for
// it, and the decisions that gathered meanwhile are then sent as one decision asking
// for all of their cost (see the package documentation). It pays off when many
// concurrent requests spend from one budget, such as a service-wide rule.
func WithCoalescing(n int) Option {
	return func(c *config) error {
		if n != 0 && (n < 2 || n > 4096) {
			return &ratebudget.ConfigError{Field: "WithCoalescing", Problem: fmt.Sprintf("must be 0 (off) or 2 to 4096 decisions, got %d", n)}
		}
		c.coalesce = n
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
	return func(c *config) error {
		c.oneServer = true
		return nil
	}
}

// New returns a limiter that keeps its budgets in the Redis reached by client, any
// go-redis client that runs scripts: a *redis.Client (also from NewFailoverClient), a
// *redis.ClusterClient (also from NewFailoverClusterClient), an *redis.AutoPipeliner or
// another [redis.Scripter]; every
// command goes through it, and through its hooks. With a *redis.Client or
// *redis.ClusterClient, a decision that starts while no other is in flight is sent at
// once on the caller's goroutine, and decisions that start while others are in flight
// are pipelined together through the client's AsyncAutoPipeline (see the package
// documentation), which the client owns and closes.
//
// Allow returns once its context's deadline has passed, which needs the client's
// ContextTimeoutEnabled option: New refuses a *redis.Client or *redis.ClusterClient
// without it. A *redis.Ring is refused: it shards keys by its own hash, not by Redis
// Cluster slots, so checks that the limiter decides in one script could be split
// between shards. New makes no call to Redis; see [Limiter.Load] to warm up. It
// returns a *[ratebudget.ConfigError] naming the option or field at fault.
//
// Without [WithKeySecret] the keys' digests are unkeyed: a service should log a
// warning then.
func New(client redis.Scripter, opts ...Option) (*Limiter, error) {
	cfg := config{prefix: "rb", cacheSize: 1 << 16}
	for _, o := range opts {
		if o == nil {
			return nil, &ratebudget.ConfigError{Field: "options", Problem: "must not be nil"}
		}
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	c := &core{keys: budgetkey.New(cfg.prefix, cfg.secret), oneServer: cfg.oneServer, direct: client, now: time.Now}
	c.repair.c = c
	l := &Limiter{core: c, top: c}
	noTimeout := &ratebudget.ConfigError{Field: "ContextTimeoutEnabled", Problem: "must be true in the client's options, so that a decision returns by its context's deadline"}
	switch cl := client.(type) {
	case nil:
		return nil, &ratebudget.ConfigError{Field: "client", Problem: "must not be nil"}
	case *redis.Ring:
		return nil, &ratebudget.ConfigError{Field: "client", Problem: "*redis.Ring is not supported: it shards keys by its own hash, which can split a decision's checks or a shared budget between shards; use a *redis.ClusterClient or one *redis.Client"}
	case *redis.Client:
		if cl == nil {
			return nil, &ratebudget.ConfigError{Field: "client", Problem: "must not be nil"}
		}
		if !cl.Options().ContextTimeoutEnabled {
			return nil, noTimeout
		}
		c.newPipe = cl.AsyncAutoPipeline
	case *redis.ClusterClient:
		if cl == nil {
			return nil, &ratebudget.ConfigError{Field: "client", Problem: "must not be nil"}
		}
		if !cl.Options().ContextTimeoutEnabled {
			return nil, noTimeout
		}
		if err := checkCluster(cl); err != nil {
			return nil, err
		}
		c.newPipe = cl.AsyncAutoPipeline
		c.reload = &reloader{c: cl}
	case *redis.AutoPipeliner:
		if cl == nil {
			return nil, &ratebudget.ConfigError{Field: "client", Problem: "must not be nil"}
		}
		c.direct, c.pipe = nil, cl
	}
	if _, ok := client.(*redis.Client); cfg.oneServer && !ok {
		return nil, &ratebudget.ConfigError{Field: "WithOneServer", Problem: fmt.Sprintf("needs a *redis.Client, got %T", client)}
	}
	if cfg.coalesce > 0 {
		l.top = newCoalescer(l.top, cfg.coalesce)
	}
	if cfg.cacheSize > 0 {
		l.refusals = refusal.Wrap(l.top, cfg.cacheSize, cfg.refusalClock)
		l.top = l.refusals
		// A refund gives budget back as a settle does: a refusal cached, or on its way
		// to the cache, since the refunded spend may no longer hold.
		c.gaveBack = l.refusals.GaveBack
	}
	return l, nil
}

// unauthenticated adds what Redis's reply to a long command sent before AUTH does not
// say ("Protocol error: unauthenticated bulk length"): that the server wants a password.
func unauthenticated(err error) error {
	var re redis.Error
	if errors.As(err, &re) && strings.Contains(re.Error(), "unauthenticated") {
		return fmt.Errorf("%w (the server requires a password, and the client sent none: set it in the client's options)", err)
	}
	return err
}

// Load makes the limiter ready for its first decision: it loads the scripts into the
// script cache of every server that will run them (SCRIPT LOAD, on every primary of a
// Redis Cluster), which opens connections on the way, and checks that the pipeline
// answers. Call it at start-up, so that no early decision pays for dialing and loading
// within its deadline. Decisions do not need it: after a server's script cache was
// emptied the limiter sends the script again. It returns a *[ratebudget.StoreError]:
// against a server that wants a password the client did not send, Redis's reply to the
// script ("ERR Protocol error: unauthenticated bulk length"), with the limiter's addition
// that the server requires a password.
func (l *Limiter) Load(ctx context.Context) error {
	c := l.core
	s := c.direct
	if s == nil {
		s = c.pipe
	}
	for _, sc := range []*redis.Script{allowScript, settleScript} {
		if err := sc.Load(ctx, s).Err(); err != nil {
			return classify(unauthenticated(err))
		}
	}
	if p := c.pipeline(); p != nil {
		if err := c.submit(ctx, p, redis.NewStatusCmd(ctx, "ping")); err != nil {
			return classify(err)
		}
	}
	return nil
}

// Allow decides all checks at once (see [ratebudget.Limiter]). Checks are validated with
// [ratebudget.ValidateChecks] before anything is sent. Checks that share a hash slot
// cost one script call; checks of several slots are decided slot by slot, with a
// best-effort refund when a later slot refuses (see the package documentation), unless
// [WithOneServer] puts them all in one call. A refusal remembered by the refusal cache
// is repeated without a call. Allow returns by ctx's deadline.
func (l *Limiter) Allow(ctx context.Context, checks []ratebudget.Check) (ratebudget.Decision, error) {
	if hasLease(checks) {
		// A lease is taken per request, and frees before any refusal's RetryAfter: no
		// coalescing, no refusal cache.
		d, err := l.core.decide(ctx, checks, nil, nil)
		l.admitted(checks, d, err)
		return d, err
	}
	return l.top.Allow(ctx, checks)
}

// AllowEach decides as [Limiter.Allow] does and, when it returns no error, has set
// outcomes[i] to checks[i]'s outcome (see "Reporting every check" in [ratebudget]);
// outcomes must have len(checks) elements. Through coalescing each member of a group gets
// the outcomes it would have seen admitted one after another; a refusal repeated by the
// refusal cache gives the outcomes Redis reported when it refused the same checks (a
// snapshot, as any decision's metadata is), or Redis is asked.
func (l *Limiter) AllowEach(ctx context.Context, checks []ratebudget.Check, outcomes []ratebudget.Outcome) (ratebudget.Decision, error) {
	if err := argcheck.Outcomes(len(checks), len(outcomes)); err != nil {
		return ratebudget.Decision{}, err
	}
	if hasLease(checks) {
		d, err := l.core.decide(ctx, checks, nil, outcomes)
		l.admitted(checks, d, err)
		return d, err
	}
	return l.top.AllowEach(ctx, checks, outcomes)
}

// admitted is told of a decision of checks made without the refusal cache (a lease's,
// a reservation's): when it admitted, the spend makes refusals and outcomes cached for
// their budgets stale reports, as an admission through the cache does.
func (l *Limiter) admitted(checks []ratebudget.Check, d ratebudget.Decision, err error) {
	if err == nil && d.Allowed && l.refusals != nil {
		l.refusals.ForgetChecks(checks)
	}
}

func hasLease(checks []ratebudget.Check) bool {
	for i := range checks {
		if checks[i].Rule.Algorithm == ratebudget.InFlight {
			return true
		}
	}
	return false
}

// decision is one decision's working state.
type decision struct {
	checks []ratebudget.Check
	keys   []string
	slots  []uint16
	outs   []ratebudget.Outcome
	aux    []int64 // per check: allow.lua's sixth value, a rolling window's ticket ID
	spent  bool    // a group was admitted: to refund if a later one refuses
	// idle, for checks of several slots, is each admitted check's reset after (ms) as it
	// was before its spend (allow.lua's mode '4'): its outcome once a later group's
	// refusal has given the spend back.
	idle []int64
	// members holds each in-flight check's lease member (nil when the decision has
	// none), leases its number; tickets, when not nil, receives each check's ticket
	// (always for checks of several slots, which a refund settles).
	members []string
	leases  []int64
	tickets []ratebudget.Ticket
	// rid, for a reservation (the caller's tickets), is its id: each slot group's call
	// leaves a marker for it, so that a call whose outcome was lost is voided.
	rid int64
}

// Allow is the limiter without its layers (refusal cache, coalescing).
func (c *core) Allow(ctx context.Context, checks []ratebudget.Check) (ratebudget.Decision, error) {
	return c.decide(ctx, checks, nil, nil)
}

// AllowEach is the limiter without its layers, reporting every check's outcome.
func (c *core) AllowEach(ctx context.Context, checks []ratebudget.Check, outcomes []ratebudget.Outcome) (ratebudget.Decision, error) {
	return c.decide(ctx, checks, nil, outcomes)
}

// decide is Allow, and with tickets not nil Reserve: tickets receives each check's
// ticket, outs (when not nil) each check's outcome.
func (c *core) decide(ctx context.Context, checks []ratebudget.Check, tickets []ratebudget.Ticket, outcomes []ratebudget.Outcome) (ratebudget.Decision, error) {
	if err := ratebudget.ValidateChecks(checks); err != nil {
		return ratebudget.Decision{}, err
	}
	if err := ctx.Err(); err != nil {
		return ratebudget.Decision{}, certain(err) // nothing was sent
	}
	n := len(checks)
	// Room for a few checks on the stack: most decisions need no other allocation here.
	var (
		keys    [4]string
		slots   [4]uint16
		outs    [4]ratebudget.Outcome
		aux     [4]int64
		idx     [4]int
		kb, sb  [128]byte
		buf     = kb[:0]
		scratch = sb[:0]
	)
	d := &decision{checks: checks, keys: keys[:0], slots: slots[:0], outs: outs[:0], aux: aux[:0], tickets: tickets}
	for range n {
		d.keys = append(d.keys, "")
		d.slots = append(d.slots, 0)
		d.outs = append(d.outs, ratebudget.Outcome{})
		d.aux = append(d.aux, 0)
	}
	if hasLease(checks) {
		d.members, d.leases = make([]string, n), make([]int64, n)
		for i := range checks {
			d.members[i] = "-"
			if checks[i].Rule.Algorithm == ratebudget.InFlight {
				d.leases[i], d.members[i] = newLease()
			}
		}
	}
	if tickets != nil {
		clear(tickets[:n])
		d.rid = newReservation()
	}
	single := true
	for i := range checks {
		var k []byte
		k, d.slots[i], scratch = c.keys.Append(buf[:0], scratch, &checks[i])
		buf = k
		d.keys[i] = string(k)
		single = single && (c.oneServer || d.slots[i] == d.slots[0])
	}
	if !single {
		if tickets == nil {
			// A refund is a settle at cost 0 of the groups already admitted: their
			// tickets name exactly the spend to give back.
			d.tickets = make([]ratebudget.Ticket, n)
		}
		d.idle = make([]int64, n)
	}
	if single {
		all := idx[:0]
		for i := range n {
			all = append(all, i)
		}
		if _, err := c.allow(ctx, d, all, true); err != nil {
			c.lost(ctx, d, all, err)
			return ratebudget.Decision{}, err
		}
		copy(outcomes, d.outs)
		return ratebudget.Combine(checks, d.outs), nil
	}
	dec, err := c.allowGroups(ctx, d)
	if err == nil {
		copy(outcomes, d.outs)
		if !dec.Allowed && tickets != nil {
			clear(tickets[:n])
		}
	}
	return dec, err
}

// group returns the checks in the slot of check first, if first is the first of them.
func (d *decision) group(first int) []int { return slotGroup(d.slots, first) }

// slotGroup returns the indexes of the slots equal to slots[first], if first is the
// first of them, else nil.
func slotGroup(slots []uint16, first int) []int {
	for j := 0; j < first; j++ {
		if slots[j] == slots[first] {
			return nil
		}
	}
	var g []int
	for i := first; i < len(slots); i++ {
		if slots[i] == slots[first] {
			g = append(g, i)
		}
	}
	return g
}

// allowGroups decides checks of several slots, slot group by slot group in order of
// first appearance, and refunds the groups admitted when a later one refuses or fails.
// d.tickets is not nil: each admitted group's tickets are written there.
func (c *core) allowGroups(ctx context.Context, d *decision) (ratebudget.Decision, error) {
	refused := false
	for i := range d.checks {
		g := d.group(i)
		if g == nil {
			continue
		}
		if refused {
			// Decide the rest without writing, so that the decision reports the same
			// rule as a single-step limiter would. On failure the group counts as
			// admitted: it then cannot be reported (a refusal is already decided).
			if _, err := c.allow(ctx, d, g, false); err != nil {
				for _, j := range g {
					d.outs[j] = ratebudget.Outcome{Allowed: true}
				}
			}
			continue
		}
		ok, err := c.allow(ctx, d, g, true)
		if err != nil {
			c.lost(ctx, d, g, err)
			if c.refund(ctx, d) != nil {
				// The earlier groups' spend may stay: the decision's outcome is
				// uncertain, even when this group's error is not.
				if se, isStore := err.(*ratebudget.StoreError); isStore {
					se.Uncertain = true
				}
			}
			return ratebudget.Decision{}, err
		}
		if !ok {
			refused = true
			var given []int // the checks of the groups admitted so far
			for j := range d.checks {
				if d.tickets[j] != (ratebudget.Ticket{}) {
					given = append(given, j)
				}
			}
			// A refusal either way; a failure leaves an over-count, and those groups'
			// outcomes as they are (spent). Given back (or on its way, detached), they
			// are reported as they were before their spend, as a refusal in one step
			// reports them ("Reporting every check" in package ratebudget).
			if err := c.refund(ctx, d); err == nil || errors.Is(err, errRefundDetached) {
				for _, j := range given {
					d.outs[j] = timerule.Unspent(d.outs[j], d.checks[j].Cost, d.idle[j])
				}
			}
			continue
		}
		d.spent = true
	}
	return ratebudget.Combine(d.checks, d.outs), nil
}

// refund gives back the spend of the groups admitted so far, best effort: a settle at
// cost 0 of their tickets (the groups not admitted have none), one settle.lua call per
// group. It returns the settle's error, after which the spend may stay; the tickets
// are cleared.
//
// When the caller's deadline is already over (typically: a later group timed out, its
// master stalled), the refund runs on a goroutine of its own, detached from ctx and
// bounded by refundTimeout, and refund returns errRefundDetached: its outcome is not
// known. Without it, the earlier groups' spend and leases, often on healthy masters,
// would stay for a decision that admitted nothing (a lease until its TTL).
//
// After the refund (when detached, once it ends), the refusal cache, if any, is told of
// the budget given back ([refusal.Limiter.GaveBack]), as after a settle: a refusal that
// Redis decided while the spend held is not cached for its whole wait.
func (c *core) refund(ctx context.Context, d *decision) error {
	if !d.spent {
		return nil
	}
	d.spent = false
	var given []ratebudget.Check // the checks of the groups admitted
	if c.gaveBack != nil {
		for i := range d.checks {
			if d.tickets[i] != (ratebudget.Ticket{}) {
				given = append(given, d.checks[i])
			}
		}
	}
	dl, hasDeadline := ctx.Deadline()
	if hasDeadline && (time.Until(dl) <= 0 || errors.Is(ctx.Err(), context.DeadlineExceeded)) {
		n := len(d.checks)
		// Copies: the caller's checks and tickets are its own again once Allow returns.
		checks := append([]ratebudget.Check(nil), d.checks...)
		tickets := append([]ratebudget.Ticket(nil), d.tickets[:n]...)
		keys := append([]string(nil), d.keys...)
		slots := append([]uint16(nil), d.slots...)
		clear(d.tickets[:n])
		c.settleDetached(ctx, checks, tickets, keys, slots, func() {
			if given != nil {
				c.gaveBack(given)
			}
		})
		return errRefundDetached
	}
	// The refund outlives a canceled caller, and runs within what is left of its
	// deadline: a refund cut short leaves the spend in place (an over-count, never an
	// under-count).
	deadline := time.Now().Add(refundTimeout)
	if hasDeadline && dl.Before(deadline) {
		deadline = dl
	}
	ctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	defer cancel()
	err := c.settle(ctx, d.checks, d.tickets, nil, d.keys, d.slots, false)
	if given != nil {
		c.gaveBack(given)
	}
	return err
}

// errRefundDetached is refund's report of a refund left to run after the decision.
var errRefundDetached = errors.New("lua: refund runs after the decision's deadline")

// lost is told that the call deciding the checks g of d failed with err. When err is
// uncertain the call may have spent although the caller is not admitted: a
// reservation's call is voided (see repair.go), and an admission's leases released.
func (c *core) lost(ctx context.Context, d *decision, g []int, err error) {
	var se *ratebudget.StoreError
	if !errors.As(err, &se) || !se.Uncertain {
		return
	}
	if d.rid != 0 {
		c.void(ctx, d, g)
		return
	}
	c.releaseLost(ctx, d, g, err)
}

// releaseLost releases the in-flight leases of the checks g of d after their script
// call failed with err, when err is uncertain: the call may have taken the leases
// although the caller is not admitted, and each would hold a slot until its TTL. A
// lease's member is drawn before the call, so it is released without a reply (ZREM of a
// member never added changes nothing). The release runs on a goroutine of its own, so
// that the decision still returns by its deadline; it is detached from ctx's
// cancellation and deadline, bounded by refundTimeout, and best effort: it can fail,
// or run before a delayed call it races with.
func (c *core) releaseLost(ctx context.Context, d *decision, g []int, err error) {
	var se *ratebudget.StoreError
	if d.members == nil || !errors.As(err, &se) || !se.Uncertain {
		return
	}
	var (
		checks  []ratebudget.Check
		tickets []ratebudget.Ticket
		keys    []string
		slots   []uint16
	)
	for _, j := range g {
		if d.checks[j].Rule.Algorithm == ratebudget.InFlight {
			checks = append(checks, d.checks[j]) // a copy: the caller's slice is its own again
			tickets = append(tickets, ratebudget.Ticket{At: 1, ID: d.leases[j]})
			keys, slots = append(keys, d.keys[j]), append(slots, d.slots[j])
		}
	}
	if len(checks) == 0 {
		return
	}
	c.settleDetached(ctx, checks, tickets, keys, slots, nil)
}

// settleDetached settles tickets (at cost 0) on a goroutine of its own, detached from
// ctx's cancellation and deadline and bounded by refundTimeout, then calls done when it
// is not nil. The slices are the goroutine's: the caller must not reuse them. A panic
// of the settle (a client hook's bug) has no caller to reach on that goroutine, where it
// would end the process: it ends the settle, as a failure does, and done still runs.
func (c *core) settleDetached(ctx context.Context, checks []ratebudget.Check, tickets []ratebudget.Ticket, keys []string, slots []uint16, done func()) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), refundTimeout)
	go func() {
		defer cancel()
		defer func() { _ = recover() }()
		if done != nil {
			defer done()
		}
		_ = c.settle(rctx, checks, tickets, nil, keys, slots, false)
	}()
}

// allow runs allow.lua for the checks g of d (spending them if write and all are
// admitted) and stores their outcomes in d.outs and d.aux. It reports whether all
// were admitted.
func (c *core) allow(ctx context.Context, d *decision, g []int, write bool) (bool, error) {
	keys := make([]string, 0, len(g))
	args := make([]any, 0, 1+6*len(g))
	marked := write && d.rid != 0 // a reservation: its marker is the last key
	switch {
	case !write:
		args = append(args, "0")
	case d.idle != nil && marked:
		args = append(args, "6") // "4", marked
	case d.idle != nil:
		args = append(args, "4") // as "2", with each check's reset before the spend
	case marked:
		args = append(args, "5") // "2", marked
	case d.tickets != nil:
		args = append(args, "2")
	default:
		args = append(args, "1")
	}
	var now int64 // Unix ms, read for a Calendar check
	for _, j := range g {
		ch := &d.checks[j]
		keys = append(keys, d.keys[j])
		args = append(args, int64(ch.Rule.Algorithm), ch.Rule.Limit, c.window(&ch.Rule, &now),
			timerule.Capacity(&ch.Rule), ch.Cost)
	}
	if d.members != nil {
		for _, j := range g {
			args = append(args, d.members[j])
		}
	}
	if marked {
		keys = append(keys, markerKey(d.keys[g[0]], d.rid))
		args = append(args, markerTTLArg)
	}
	v, err := c.runAround(ctx, allowScript, allowSource, keys, args, len(g), 5,
		func(i int) *ratebudget.Rule { return &d.checks[g[i]].Rule })
	if err != nil {
		return false, classify(err)
	}
	return parseAllow(v, d, g)
}

// window is rule r's window argument for the scripts: its Window in ms, or for a
// Calendar rule the boundaries of its periods before, around and after *now (Unix ms;
// when 0, read from c.now first) in the form allow.lua takes (timerule's
// PeriodCache.Bounds).
func (c *core) window(r *ratebudget.Rule, now *int64) any {
	if r.Algorithm != ratebudget.Calendar {
		return r.Window.Milliseconds()
	}
	if *now == 0 {
		*now = c.now().UnixMilli()
	}
	return c.cal.Bounds(r, *now)
}

// calendarMissPrefix starts allow.lua's error reply when the server's clock is in none
// of a Calendar check's periods (also through settle.lua, whose charges above a
// reservation are allow.lua's); the server's time (Unix ms) follows.
const calendarMissPrefix = "ERR ratebudget: calendar periods miss server time "

// calendarMiss reports whether err is allow.lua's reply that the server's clock is in
// none of a Calendar check's periods, and the server's time it names (Unix ms).
func calendarMiss(err error) (int64, bool) {
	if err == nil {
		return 0, false
	}
	rest, ok := strings.CutPrefix(err.Error(), calendarMissPrefix)
	if !ok {
		return 0, false
	}
	ms, perr := strconv.ParseInt(rest, 10, 64)
	return ms, perr == nil && ms > 0
}

// runAround runs script as run does. When the reply is allow.lua's that the server's
// clock is in none of a Calendar check's periods (the caller's clock is off by more than
// a period), it sets the window argument of each Calendar check i < n, rule(i), to the
// periods around the server's time, and runs script once more with them. The checks'
// arguments are allow.lua's layout or settle.lua's: check i's window is args[3+stride*i]
// (stride 5 for allow.lua, 9 for settle.lua). args keeps the new windows, so that a call
// sent again later is sent with them.
func (c *core) runAround(ctx context.Context, script *redis.Script, src string, keys []string, args []any, n, stride int, rule func(i int) *ratebudget.Rule) (any, error) {
	v, err := c.run(ctx, script, src, keys, args)
	server, ok := calendarMiss(err)
	if !ok {
		return v, err
	}
	for i := range n {
		if r := rule(i); r.Algorithm == ratebudget.Calendar {
			args[3+stride*i] = c.window(r, &server)
		}
	}
	return c.run(ctx, script, src, keys, args)
}

// Backoff between script calls answered TRYAGAIN: the first wait, and the longest; and
// how long a call whose context has no deadline keeps trying.
const (
	tryAgainFirst = time.Millisecond
	tryAgainMax   = 16 * time.Millisecond
	tryAgainFor   = time.Second
)

// run runs script with EVALSHA, and with EVAL when the server's script cache does not
// hold it (NOSCRIPT), as go-redis's Script.Run does.
//
// A call answered TRYAGAIN is sent again, after a wait that grows from tryAgainFirst to
// tryAgainMax, for as long as ctx allows: a Redis Cluster node gives it, before running
// anything, to a call whose keys share a slot being migrated when some of them have
// moved and others not, which lasts until the migration of those keys ends. No other
// reply is sent again: CLUSTERDOWN and MASTERDOWN also come before anything runs, but
// they last for a failover (seconds), and the failure policy should answer meanwhile.
// If ctx ends first, or would end before the next try could come back (the wait, plus
// twice what the last try took), the last TRYAGAIN is returned;
// a ctx without a deadline stops trying after tryAgainFor (a migration left half done
// would otherwise hold the call until it is canceled).
func (c *core) run(ctx context.Context, script *redis.Script, src string, keys []string, args []any) (any, error) {
	var giveUp time.Time // for a ctx without a deadline, set at the first TRYAGAIN
	for wait := tryAgainFirst; ; wait = min(2*wait, tryAgainMax) {
		sent := time.Now()
		v, err := c.send(ctx, "evalsha", script.Hash(), keys, args)
		if err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT")) {
			v, err = c.send(ctx, "eval", src, keys, args)
		}
		c.reload.noteErr(err)
		if !tryAgain(err) {
			return v, err
		}
		dl, ok := ctx.Deadline()
		if !ok {
			if giveUp.IsZero() {
				giveUp = time.Now().Add(tryAgainFor)
			}
			dl = giveUp
		}
		// Another try must have time to come back after the wait: twice what this one
		// took. A try cut short by the deadline is uncertain, where TRYAGAIN is certain.
		if time.Until(dl) < wait+2*time.Since(sent) {
			return nil, err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, err
		case <-t.C:
		}
	}
}

// send sends one EVALSHA or EVAL: on the caller's goroutine when no other decision is
// in flight, else through the pipeline.
func (c *core) send(ctx context.Context, verb, body string, keys []string, args []any) (any, error) {
	if err := ctx.Err(); err != nil {
		return nil, notSent{err} // the caller has given up: held back
	}
	var p *redis.AutoPipeliner
	if c.direct == nil {
		p = c.pipe
	} else {
		n := c.inflight.Add(1)
		defer c.inflight.Add(-1)
		if n > 1 {
			p = c.pipeline()
		}
	}
	proc, _ := c.direct.(processor)
	if p == nil && proc == nil {
		if verb == "eval" {
			return c.direct.Eval(ctx, body, keys, args...).Result()
		}
		return c.direct.EvalSha(ctx, body, keys, args...).Result()
	}
	cmdArgs := make([]any, 0, 3+len(keys)+len(args))
	cmdArgs = append(cmdArgs, verb, body, len(keys))
	for _, k := range keys {
		cmdArgs = append(cmdArgs, k)
	}
	cmdArgs = append(cmdArgs, args...)
	cmd := redis.NewCmd(ctx, cmdArgs...)
	cmd.SetFirstKeyPos(3)
	var err error
	if p == nil {
		err = proc.Process(ctx, onceCmd{cmd})
	} else {
		err = c.submit(ctx, p, onceCmd{cmd})
	}
	if err != nil {
		return nil, err
	}
	return cmd.Val(), nil
}

// pipeline returns the AutoPipeliner for concurrent decisions, or nil.
func (c *core) pipeline() *redis.AutoPipeliner {
	if c.newPipe != nil {
		c.pipeOnce.Do(func() {
			if p, err := c.newPipe(); err == nil {
				c.pipe = p
			}
		})
	}
	return c.pipe
}

// submit sends cmd through p and waits for its reply or for ctx. A blocking-face
// AutoPipeliner refuses Submit; cmd is then processed on it.
func (c *core) submit(ctx context.Context, p *redis.AutoPipeliner, cmd redis.Cmder) error {
	err := p.Submit(ctx, cmd).WaitContext(ctx)
	if errors.Is(err, redis.ErrSubmitBlockingFace) {
		err = p.Process(ctx, cmd)
	}
	return err
}

// parseAllow checks allow.lua's reply for the checks g and stores it in d.outs and
// d.aux (and in d.idle and d.tickets when the reply has them). It reports whether all
// were admitted.
func parseAllow(v any, d *decision, g []int) (bool, error) {
	vals, ok := v.([]any)
	if !ok {
		return false, badReply(fmt.Sprintf("%T, want an array", v))
	}
	if len(vals) != 6*len(g) && (d.tickets == nil || len(vals) != 7*len(g)) && (d.idle == nil || len(vals) != 8*len(g)) {
		return false, badReply(fmt.Sprintf("%d elements, want %d", len(vals), 6*len(g)))
	}
	all := true
	for k, j := range g {
		o, aux, err := parseOutcome(vals[6*k:6*k+6], k)
		if err != nil {
			return false, err
		}
		all = all && o.Allowed
		d.outs[j] = o
		d.aux[j] = aux
	}
	if len(vals) == 8*len(g) {
		if err := parseIdle(vals[7*len(g):], d, g); err != nil {
			return false, err
		}
	}
	if len(vals) >= 7*len(g) {
		if err := parseTickets(vals[6*len(g):7*len(g)], d, g); err != nil {
			return false, err
		}
	}
	return all, nil
}

// parseOutcome reads check k's six values of allow.lua's reply: its outcome and its
// sixth value.
func parseOutcome(vals []any, k int) (ratebudget.Outcome, int64, error) {
	var f [6]int64
	for e := range f {
		n, ok := vals[e].(int64)
		if !ok {
			return ratebudget.Outcome{}, 0, badReply(fmt.Sprintf("element %d is %T, want an integer", 6*k+e, vals[e]))
		}
		f[e] = n
	}
	if f[0] < 0 || f[0] > 1 || f[1] < 0 || f[1] > 1 || f[3] < 0 || f[4] < 0 || f[5] < 0 {
		return ratebudget.Outcome{}, 0, badReply(fmt.Sprintf("check %d: out-of-range values %v", k, f))
	}
	o := ratebudget.Outcome{
		Allowed:    f[0] == 1,
		Exceeded:   f[1] == 1,
		Remaining:  f[2],
		ResetAfter: timerule.Duration(f[3]),
		RetryAfter: timerule.Duration(f[4]),
	}
	if o.Allowed && o.Exceeded {
		return ratebudget.Outcome{}, 0, badReply(fmt.Sprintf("check %d: both allowed and exceeded", k))
	}
	return o, f[5], nil
}

// parseIdle reads each check's reset before the spend (allow.lua's modes '4' and '6')
// into d.idle.
func parseIdle(vals []any, d *decision, g []int) error {
	for k, j := range g {
		idle, ok := vals[k].(int64)
		if !ok || idle < 0 {
			return badReply(fmt.Sprintf("reset before the spend %d is %v, want an integer, at least 0", k, vals[k]))
		}
		d.idle[j] = idle
	}
	return nil
}

// parseTickets reads each check's ticket value into d.tickets, once d.aux is read.
func parseTickets(vals []any, d *decision, g []int) error {
	for k, j := range g {
		tk, ok := vals[k].(int64)
		if !ok {
			return badReply(fmt.Sprintf("ticket %d is %T, want an integer", k, vals[k]))
		}
		d.tickets[j] = ticketOf(&d.checks[j], tk, d.aux[j])
		d.tickets[j].Reservation = d.rid
		if d.checks[j].Rule.Algorithm == ratebudget.InFlight {
			d.tickets[j].ID = d.leases[j]
		}
	}
	return nil
}
