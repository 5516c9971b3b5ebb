// Package lua is the Redis [ratebudget.Limiter]: every decision is one short Lua script
// run atomically by the Redis server that holds the budget, so that all replicas of a
// service spend from one shared budget.
//
// # Construction
//
//	rdb := redis.NewClient(&redis.Options{
//		Addr: "localhost:6379", MaxRetries: -1, ContextTimeoutEnabled: true, DialerRetries: 1,
//		DialTimeout: 200 * time.Millisecond, ReadTimeout: 200 * time.Millisecond,
//		WriteTimeout: 200 * time.Millisecond, PoolTimeout: 200 * time.Millisecond,
//	})
//	lim, err := lua.New(rdb, lua.WithPrefix("rb"))
//
// New accepts any go-redis client that can run scripts ([redis.Scripter]):
// *redis.Client, *redis.ClusterClient, *redis.Ring and failover clients. Configure that
// client with MaxRetries: -1 (go-redis otherwise re-sends a script after a lost reply,
// which spends twice), ContextTimeoutEnabled: true (so that the caller's deadline bounds
// the socket read), DialerRetries: 1 (a refused connection then fails at once, as a
// definite error), and short DialTimeout, ReadTimeout, WriteTimeout and PoolTimeout.
//
// # Scripts
//
// Two scripts are embedded from .lua files whose header comments document KEYS, ARGV and
// the reply: allow.lua decides a group of checks and spends them when all are admitted;
// refund.lua gives a group's spend back. They run with EVALSHA, and with EVAL when the
// server answers NOSCRIPT (its script cache is emptied by a restart, a failover or SCRIPT
// FLUSH), so nothing needs loading in advance.
//
// All time is the Redis server's clock (whole milliseconds: redis.call('TIME') for a
// rolling window, key TTLs for a token bucket); the callers' clocks never matter. The
// time rules are exactly those of [ratebudget.Memory]:
//   - fixed window ([ratebudget.FixedWindow]): a counter created with SET key cost PX
//     window at the first admission of an idle budget and then increased with INCRBY. A
//     refusal writes nothing and leaves the TTL alone; a counter found without a TTL is
//     given one, never left immortal.
//   - token bucket ([ratebudget.TokenBucket]): one integer, the deficit (capacity minus
//     level, in tokens × window milliseconds) at the time of the write, written with
//     SET key deficit PX (time until full), so that the key expires when the bucket is
//     full again and no key is a full bucket. The time is kept in the TTL: Redis stores
//     the expiry as an absolute time, so the time since the write is the time until
//     full that the deficit implies minus PTTL. A value that is not a decimal integer
//     between 0 and the full bucket is an error reply, never a full bucket; a value
//     found without a TTL counts as written now and is given its TTL back. A refusal
//     writes nothing else. If the server clock goes back the bucket does not refill
//     until it catches up, and every wait it reports (RetryAfter, ResetAfter and the
//     key's TTL, which keeps the lag for the next decision) includes that lag, as
//     [ratebudget.Memory]'s do; a full bucket reports no reset.
//   - rolling window ([ratebudget.RollingWindow]): a sorted set of admitted events over
//     (now-window, now], scored by time and named by their cumulative cost, their cost,
//     their time, and the cumulative cost before the window's oldest event with that
//     event's time. The window's sum is the newest event's cumulative cost less that
//     base, so while no event has left the window a decision reads only the newest
//     event; the earliest useful retry costs O(log² n). Events of one millisecond are
//     merged. A refusal only drops events that have left the window, which changes no
//     outcome.
//
// A check whose cost exceeds its rule's capacity is refused with Decision.Exceeded.
// Arguments are validated in Go before anything is sent, and again in the script before
// its first write, since Redis cannot roll a script back.
//
// # Cost per decision
//
// A decision of checks that share a slot is exactly one EVALSHA (EVAL once after the
// server's script cache was emptied) and no other command. Inside the script each check
// costs a few commands, independent of the budget's size: a fixed window GET and PTTL,
// then INCRBY (SET for a new window) on admission; a token bucket GET and PTTL, then
// one SET with PX on admission; a rolling window reads its newest event, then ZADD
// (with ZREM when events of one millisecond are merged) and PEXPIRE on admission, plus
// ZREMRANGEBYSCORE and a read of the oldest event once events have left the window, and
// an O(log² n) search for a refusal's retry time. TIME is read once per call, and only
// for rolling windows. Arguments that the script passes on (window, cost, the server
// time) stay strings: formatting a number costs the server about as much as a command.
// With go-redis's own clients the command is handed to Process with a reused argument
// list (keys and numbers passed by pointer); other [Client] implementations get EvalSha
// and Eval calls.
//
// # Pipelining
//
// With go-redis's own clients, decisions that arrive while others are in flight are
// sent together in one pipeline (at most [DefaultPipelineBatch] per pipeline, two
// pipelines in flight; see [WithPipelining]): one round trip and one pair of system
// calls on each side then serve many decisions. A decision that finds nothing in flight
// is sent at once. A pipeline is not a transaction: each decision is still its own
// atomic script call, with its own reply or error, so pipelining changes no outcome.
// Every caller waits on its own context, which is why the limiter is
// [ratebudget.ContextBound] whatever the client's settings. On two cores, 64 concurrent
// callers make fixed-window decisions at 0.73–2.2× the rate of bare PINGs on the same
// client (runs and machines vary), against about 0.5× without pipelining; over a
// dedicated connection (below) at 0.89–2.7×.
//
// # Dedicated connection
//
// With [WithDedicatedConnection] and a *redis.Client, decisions bypass the client's pool
// and go over one connection of the limiter's own, dialed with the client's Dialer,
// Username, Password and DB (AUTH and SELECT on each new connection). Callers append
// their commands to a shared write buffer; a writer goroutine sends what queued while
// its last write was on the wire, and a reader goroutine matches replies to callers in
// order. Every caller waits on its own context. The connection is dialed on first use
// and again after a failure: a failed dial is a definite connection error; a reply owed
// for longer than the client's ReadTimeout (3s if it has none) closes the connection and fails
// what it owed as uncertain, as does a lost connection. A connection idle for 5 minutes
// is closed; [Limiter.Close] closes it for good. Commands on it do not pass through the
// client's hooks and are never retried.
//
// # Coalescing
//
// A hot budget, one that many concurrent requests spend from, costs Redis a script call
// per request and serializes them on one key. With [WithCoalescing], a decision that
// finds another decision for the same checks (same budgets, rule parameters and costs)
// in flight waits; the decisions that gathered meanwhile, up to the given group size and
// never more cost than a rule's capacity, are then sent as one call asking for all of
// their cost, by the first of them. That call is one EVALSHA of allow.lua like any other,
// so nothing changes in Redis:
//   - a group admitted in full is exactly its members admitted one after another at one
//     server time; member i of n is told the Remaining it would have seen in that order
//     (the group's Remaining plus (n-1-i) × cost), and the group's ResetAfter;
//   - a group that does not fit spends nothing (a refusal never does), and its members
//     are then decided one call each, so the budget's last units are shared out exactly
//     as without coalescing; a group's refusal is never stored in the refusal cache;
//   - a store error reaches every member as its own *[ratebudget.StoreError].
//
// Every member waits on its own context and AllowWithin bound. One that gives up before
// its group is sent leaves it, with a certain error and nothing spent; one that gives up
// after gets an uncertain error, as a single caller would. If the member sending the call
// gives up during it, the others decide alone and the group's call may still be applied:
// an over-count, never an under-count. Decisions for different budgets never wait for
// each other; the cost is up to one extra round trip for a request that arrives while
// its budget has a decision in flight. Checks of several slots are coalesced slot group
// by slot group, so a service-wide budget next to per-client budgets is grouped across
// clients (with [WithOneServer] they are one call, grouped only with identical
// decisions); a refund (see below) of a grouped rolling-window spend gives back at most the
// first member's cost, the others' stay spent (an over-count).
// With the 64 callers of the package's BenchmarkProcess all on one budget, coalescing
// made decisions at about twice the rate without it, for less than a tenth of the Redis
// time per decision.
//
// # Refusal cache
//
// The limiter remembers refusals (64Ki by default; [WithRefusalCache], [WithoutRefusalCache]):
// once Redis refuses a check of cost c with RetryAfter r, further requests for the same
// budget (same key and rule parameters) with cost at least c are refused locally, without
// a call, until r has passed since the refused request was sent. A flooding client then
// costs Redis one call per wait instead of one per request. Only refusals decided by a
// script for that budget are stored (for checks of several slots, the refusing group's
// answer), never Exceeded refusals or errors.
//
// Without refunds this is exact: no request that Redis would admit is refused, because
// until RetryAfter the budget can only become fuller:
//   - fixed window: the count only grows until the window ends, and RetryAfter is the
//     window's PTTL;
//   - token bucket: the level grows only by refill, and RetryAfter is the refill time to
//     the refused cost (including a backward clock's lag); others' spending only lowers it;
//   - rolling window: the sum shrinks only as events age out, and RetryAfter is when enough
//     of them have; new admissions only add events.
//
// The wait is timed from before the request was sent, on the process's monotonic clock,
// so the copy never outlives Redis's refusal. What can make Redis admit earlier, and the
// cache then refuse for at most the cached wait: a refund (a multi-slot decision whose
// later group refused gives the earlier groups' spend back, see below), a budget lost on
// the server (restart, eviction, deletion), and a server clock that steps forward. A
// request with a smaller cost, or for another budget of the same client, still goes to
// Redis, and so does a request with a check whose cost exceeds its rule's capacity (it is
// reported Exceeded). A cached refusal reports the waits remaining from the stored one
// and the Remaining Redis reported then; when several checks of a request have cached
// refusals, the one with the longest wait is reported. When Redis admits a request, the
// refusals cached for its budgets are dropped: the spend left them exact, but they would
// report more units remaining (and for a token bucket or a rolling window a shorter wait)
// than there are, so the next request asks Redis. (A refusal that Redis decided before a
// concurrent admission may still be stored after it: it stays exact, and ends with its
// wait.) A random walk checks that with [WithOneServer] (no refunds) the limiter with
// its cache gives the same admissions, refusals and remaining units as the in-process
// limiter.
//
// # Keys
//
// A budget's key is
//
//	<prefix>:{<identity digest>}:<rule name>:<algorithm>[:<scope digest>]
//
// The digests are the first 128 bits of SHA-256 over a length-prefixed, domain-separated
// encoding, in unpadded base64url (22 bytes). Callers' input therefore can neither choose
// the Redis Cluster hash slot (only the digest is between the braces) nor make keys long,
// and identity "a:b" with scope "c" never meets identity "a" with scope "b:c". The rule
// name is restricted by [ratebudget.Rule.Validate] and the scope is omitted when empty.
// Every key carries a TTL no longer than its rule needs.
//
// # Several rules in one decision
//
// All checks whose keys hash to one slot, in particular all checks of one identity, are
// decided by one script call: all-or-nothing, with a single round trip. Checks of several
// slots (for example a service-wide rule next to a per-client rule) are decided slot group
// by slot group, in order of first appearance in the checks. If a later group refuses, or
// fails, the spend of the groups already admitted is refunded.
//
// The refund is best effort, and weaker than a single script: between the spend and the
// refund another caller may see less budget than there really is (and be refused); a
// refund is skipped when the state moved on meanwhile (a fixed window that closed and
// reopened, a rolling-window event that is no longer the newest); and a refund attempted
// after a transport error is itself uncertain. It never gives back more than was spent
// by the same decision, except that a fixed-window counter that closed and reopened with
// exactly the refunded amount in between is deleted. It never leaves a key without a TTL:
// a rolling window's key expires again when its newest remaining event leaves the window.
//
// Slots only matter to Redis Cluster and to proxies that shard keys. When every key lives
// on one server (a *redis.Client on a standalone server or a failover primary), say so
// with [WithOneServer]: checks of every slot are then decided in one script call, as
// checks of one slot are, with no refunds.
//
// # Errors
//
// Failures of the store are *[ratebudget.StoreError] with a Class: "server" for an error
// reply (OOM, BUSY, ...; nothing was spent), "reply" for a reply of an unexpected shape,
// "timeout" and "canceled" for the caller's context, "connection" for transport errors.
// Uncertain is set when the script may have run although its reply was lost. The limiter
// never retries a spend itself.
package lua
