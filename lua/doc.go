// Package lua is the Redis [ratebudget.Limiter]: every decision is one short Lua script
// run atomically by the Redis server that holds the budget, so that all replicas of a
// service spend from one shared budget.
//
// # Construction
//
// The server must be Redis 7.0 or later: tickets for settling (and the refund of a
// decision spread over several slot groups) read PEXPIRETIME.
//
//	rdb := redis.NewClient(&redis.Options{
//		Addr: "localhost:6379", MaxRetries: -1, ContextTimeoutEnabled: true, DialerRetries: 1,
//		DialTimeout: 200 * time.Millisecond, ReadTimeout: 200 * time.Millisecond,
//		WriteTimeout: 200 * time.Millisecond, PoolTimeout: 200 * time.Millisecond,
//	})
//	lim, err := lua.New(rdb, lua.WithPrefix("rb"), lua.WithKeySecret(secret))
//	// at start-up:
//	err = lim.Load(ctx)
//
// [New] accepts any go-redis client that runs scripts: *redis.Client (also from
// NewFailoverClient), *redis.ClusterClient, *redis.AutoPipeliner, or another
// redis.Scripter. Every command goes through that client, so its hooks (tracing,
// metrics), credentials, RESP version and routing apply. Configure it with:
//   - ContextTimeoutEnabled: true, required (New refuses a *redis.Client or
//     *redis.ClusterClient without it): the caller's deadline then bounds the socket, and
//     Allow returns by it. A context canceled without a deadline is only seen between
//     commands.
//   - MaxRetries: -1, for the limiter's other commands (SCRIPT LOAD). Script calls are
//     never re-sent once they may have run, whatever MaxRetries and a ClusterClient's
//     MaxRedirects say: the limiter marks them NoRetry, which every go-redis client
//     honours, so one request never spends or refunds twice. Another redis.Scripter
//     gets EVALSHA and EVAL calls and must not retry them itself, and neither may a
//     hook of the client that sends a command again: it must leave alone a command
//     whose NoRetry reports true.
//   - DialerRetries: 1 and short DialTimeout, ReadTimeout, WriteTimeout and PoolTimeout,
//     so that a failing Redis fails fast.
//
// With a *redis.ClusterClient, MOVED and ASK redirects are followed (New refuses
// MaxRedirects: -1, which would return them, except on a client from
// NewFailoverClusterClient, which sets MaxRedirects from FailoverOptions.MaxRetries
// and has no MOVED to follow). Scripts run on each slot's master even when the client
// sends read-only commands to replicas (ReadOnly, RouteByLatency, RouteRandomly,
// ReplicaOnly); but a NewFailoverClient with ReplicaOnly reaches replicas only, where
// every decision fails with READONLY. And an error that may mean the topology
// moved (a refused or reset connection, a timeout, MOVED, READONLY, CLUSTERDOWN,
// TRYAGAIN, MASTERDOWN) makes the client reload its slot map in the background, at most
// once per 100ms: a failed-over master's slots are decided again as soon as the cluster
// has promoted its replica, instead of after the client's ClusterStateReloadInterval
// (60 s by default). An *redis.AutoPipeliner given to New cannot be reloaded that way:
// give the *redis.ClusterClient itself. A script call answered TRYAGAIN (its keys share
// a slot being migrated, some moved and some not: Redis ran nothing) is sent again
// after a short wait, growing from 1ms to 16ms, until it is answered otherwise or the
// caller's context ends (at most 1s for a context without a deadline; then the
// TRYAGAIN is returned: a certain error).
// docs/CLUSTER.md has the recommended settings and what a failover costs.
//
// A *redis.Ring is refused: it places keys by its own hash of the whole key, not by hash
// slot, so checks that the limiter decides in one script, or a budget shared by
// everyone, could be split between shards.
//
// # Concurrency
//
// With a *redis.Client or *redis.ClusterClient, a decision that starts while no other is
// in flight is sent at once, on the caller's goroutine: one round trip, no hand-off.
// Decisions that start while others are in flight go through the client's
// AsyncAutoPipeline, which writes them together: one round trip and one pair of system
// calls serve many. Each is still its own script call with its own reply, so this
// changes no outcome. go-redis's default AutoPipelineOptions suit this (set
// Options.AutoPipelineOptions to change them: FullDuplex was faster in some benchmark
// runs here and not in others, with no gain end to end, see docs/PERFORMANCE.md). Given an *redis.AutoPipeliner, every decision goes through it; use
// the asynchronous face (AsyncAutoPipeline), since the blocking one does not let a
// decision return at its deadline.
//
// # Start-up
//
// [Limiter.Load] loads the scripts (SCRIPT LOAD, on every primary of a Redis Cluster) and
// opens connections, so that early decisions do not pay for it within their deadline.
// It is optional: a decision that meets an empty script cache (after a restart, a
// failover or SCRIPT FLUSH) sends the script with EVAL and goes on.
//
// # Keys
//
// A budget's key is
//
//	<prefix>:{<identity digest>}:<rule name>:<algorithm>[:<scope digest>]
//
// The digests are 128 bits, in unpadded base64url (22 bytes), of a length-prefixed,
// domain-separated encoding: callers' input can neither make keys long nor put a brace
// in them, and identity "a:b" with scope "c" never meets identity "a" with scope "b:c".
// With [WithKeySecret] the digests are HMAC-SHA-256 under the secret, so that nobody
// without it can compute which hash slot (and so which Redis Cluster node) an identity
// lands in, or pick identities that share one. Without it they are plain SHA-256 and
// anyone can, so a service without a secret should log a warning. Every replica
// must use the same prefix and secret. Every key carries a TTL no longer than its rule
// needs.
//
// # Time rules
//
// Time is the Redis server's clock, in whole milliseconds; the callers' clocks never
// matter. The rules are exactly those of the in-process limiter (package memory):
//   - fixed window: a counter created with SET key cost PX window at the first admission
//     of an idle budget, then INCRBY. A counter found without a TTL is given one.
//   - token bucket: the deficit at the time of the write, its time until full and the
//     window its units are of, written with SET PX (that time), so that the key expires
//     when the bucket is full again; the time since the write is read from the TTL, and
//     the deficit is converted to the reader's window, so a rule whose Limit or Window
//     changes under the same name refills at its new rate from the level written. If
//     the server clock goes back, the bucket does not refill until it catches up.
//   - rolling window: a sorted set of admitted events over (now-window, now], each named
//     by its cumulative cost, so that a decision reads only the newest event while none
//     has left the window; events of one millisecond are merged.
//   - in-flight ([ratebudget.InFlight]): a sorted set of leases scored by their expiry
//     (Window after each was taken or last renewed), each a random 64-bit member drawn
//     by the limiter; expired leases are pruned by the next decision, and the key
//     expires with its last lease.
//   - calendar ([ratebudget.Calendar]): Lua has no time zone database, so the limiter
//     passes the boundaries of three periods of the rule's zone, around its own clock;
//     the script picks the one that holds the server's clock and keeps "count:period
//     start" in a key that expires at the period's end (SET PXAT). When the server's
//     clock is in none of them (the caller's clock is off by more than a period) the
//     script answers with the server's time, writing nothing, and the limiter sends the
//     call again once, with the periods around that time (docs/CALENDAR.md).
//
// # Settling
//
// The limiter settles decisions as "Settling a decision" in [ratebudget] and
// docs/SETTLING.md describe. Reserve is allow.lua in a mode that also replies each
// check's ticket (a fixed window's PEXPIRETIME, a rolling-window event's time and
// cumulative sum, a lease's number); it never goes through the refusal cache or
// coalescing, nor does any decision with an in-flight check. Settle is one settle.lua
// call per slot group (one in all with [WithOneServer]): in one execution it gives back
// what was reserved above the actual cost, releases the leases and charges what was used
// above the reservation, with allow.lua's own code (mode '3': spend without refusing,
// into debt of at most one capacity), which the Go side puts in front of settle.lua as a
// function; a group whose checks are all charged above is that allow.lua call alone. A
// fixed window or a calendar period is given back only while it is the reserved one; a
// rolling-window event only while it is the newest (an older event's refund is skipped:
// an overcount); a token bucket always, up to full. Settle drops this process's cached
// refusals of the settled budgets; other processes' caches may refuse for at most their
// cached wait, and 1s. Renew is settle.lua in renew mode.
//
// # A reservation lost, a settle failed
//
// A script call written before the store stalled still runs when it resumes (it waits in
// the server's socket, or in the client's pipeline queue), so "not sent" cannot be
// assumed of a call that failed by its deadline. Each reservation therefore has an id
// (carried in [ratebudget.Ticket].Reservation), and allow.lua leaves a marker for it in
// the slot of its budgets, with each check's ticket, for a minute. When a Reserve fails
// with an uncertain error its caller is not admitted, and the limiter voids the
// reservation: a settle.lua call that gives the marked spend back, or, when the
// reservation has not run yet, leaves a tombstone that makes it a no-op when it does
// (an error reply, nothing spent); whichever comes first. A Settle that fails is re-sent
// with the same id, and applies at most once: the marker is deleted by the first settle
// to land, and a re-sent settle applies only while it is there. Voids and re-sent
// settles wait in a queue of at most 16,384 and are sent off the request path, pipelined
// together while the store answers, one at a time with a growing wait (10 to 200 ms)
// while it does not; [Limiter.Repairs] counts them. What stays uncertain: a repair that
// comes more than a minute after its reservation (the marker has expired: nothing is
// given back, an overcount), a settle that fails more than a minute after its
// reservation (likewise), a reservation held up in the network for more than a minute
// after its void (it spends), and the queue full or the process ending before the store
// answers again (the spend stays). A decision is not sent once its context has ended;
// one already handed to the pipeline cannot be taken back.
//
// A refusal writes nothing. A check whose cost exceeds its rule's capacity is refused
// with Decision.Exceeded. Arguments are validated in Go before anything is sent, and
// again in the script before its first write, since Redis cannot roll a script back.
// The scripts, allow.lua and settle.lua, document their KEYS, ARGV and replies.
//
// # Several rules in one decision
//
// Checks whose keys share a hash slot, in particular all checks of one identity, are one
// script call: all-or-nothing. Checks of several slots (a service-wide rule next to a
// per-client rule) are decided slot group by slot group; if a later group refuses or
// fails, the groups already admitted are refunded: each admitted group records tickets,
// as Reserve does, and the refund is a settle at cost 0 of them (one settle.lua call per
// group). The refund is best effort: meanwhile another caller may see less budget than
// there is, and a refund after a transport error is itself uncertain; it never gives back
// more than the decision spent, nor to a window other than the one it spent in. The
// refund runs within the caller's deadline; when a later group used it all up (its master
// stalled), the refund runs after Allow returned, for at most 500ms, and the error is
// uncertain. Through [Limiter.AllowEach] and [Limiter.Reserve], a decision refused this
// way reports its checks as "Reporting every check" in [ratebudget] says, as a refusal in
// one step does: the groups given back as they were before their spend (each admitted
// group's call also replies its checks' resets as they were), and the groups after the
// refusal, decided without writing, as they are (a refund that fails leaves the spend,
// and its groups' outcomes as they are, spent). When every key lives on one server (a
// *redis.Client on a standalone server or a failover primary), [WithOneServer] decides
// checks of every slot in one call, with no refunds.
//
// # Refusal cache
//
// The limiter remembers refusals ([WithRefusalCache]): once Redis refuses a check of cost
// c with RetryAfter r, requests for the same budget with cost c are refused locally
// until r has passed, for at most 1s after the refused request was sent, so a flooding
// client costs Redis one call per wait, at most one a second per budget. Under a fixed
// window so are requests of any cost above c, which wait for the window's end too;
// under a token bucket or a rolling window a larger cost waits longer than r, so Redis
// is asked and tells its wait. Until
// then the budget can only become fuller by the time rule itself, so this refuses
// nothing Redis would admit, except after another process's refund or settle, a budget
// lost on the server, a raised limit, another replica's [Limiter.Reset] or a server
// clock stepping forward, for at most 1s (this limiter's own refunds, settles and
// resets drop its refusals of the budgets given back, including refusals decided while
// the spend held). A cached refusal reports the remembered budget's rule and the wait
// remaining; when several of a request's budgets refuse, that rule need not be the one
// with the longest wait that Redis would report, so its RetryAfter is a lower bound, as
// every RetryAfter is. An admission drops the refusals of its budgets. Through
// [Limiter.AllowEach] a cached refusal also repeats every check's outcome as Redis
// reported it, but only for the same checks (budgets, costs, order), while none of their
// budgets was spent or settled through this limiter since and no refused check's wait
// is over; otherwise Redis is asked. Spends by other processes are not seen: the
// outcomes are a snapshot, as any decision's metadata is.
//
// # Coalescing
//
// With [WithCoalescing], a decision that finds an identical one (same budgets, rule
// parameters and costs) in flight waits for it; the decisions that gathered meanwhile
// are then sent as one decision for all of their cost, never more than a rule's
// capacity. A group admitted in full is its members admitted one after another: each is
// told the decision it would have seen (its Remaining, ResetAfter and reported rule),
// and through [Limiter.AllowEach] each check's outcome (a token bucket's ResetAfter is
// rounded against the member: at most 1ms late). A group that does not fit spends nothing, and
// its members are decided one by one. Every member waits on its own context: one that
// gives up before its group is sent gets a certain error; if the member sending the
// group gives up, the others decide alone and the group's call may still be applied (an
// over-count, never an under-count).
//
// # Errors
//
// Failures of the store are *[ratebudget.StoreError] with a Class:
// [ratebudget.ClassServer] for an error reply (OOM, BUSY, ...; nothing was spent),
// [ratebudget.ClassReply] for a reply of an unexpected shape, [ratebudget.ClassTimeout]
// and [ratebudget.ClassCanceled] for the caller's context, [ratebudget.ClassConnection]
// for transport errors (certain for a connection never made: refused, or a TLS
// handshake that failed).
// Uncertain is set when the script may have run although its reply was lost, and when a
// decision of several slot groups failed and the refund of its groups already admitted
// failed too (their spend may stay). A reservation that an uncertain call may have made
// is voided (see above), and an in-flight lease that an uncertain Allow may have taken
// is released in the background, best effort: the caller was not admitted. The
// limiter sends a script call again only after TRYAGAIN, which Redis Cluster replies
// before running anything; never after an error that leaves the spend uncertain.
package lua
