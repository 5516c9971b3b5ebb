package lua_test

// Server states and settings that make Redis refuse the limiter's scripts, each on a
// redis-server of its own: what the limiter returns (class, certainty), and that a
// certain error never spent.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/algname"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/lua"
)

// stateChecks are one check of each time rule, for one identity (one slot group).
func stateChecks(id string) []ratebudget.Check {
	var out []ratebudget.Check
	for _, alg := range []ratebudget.Algorithm{ratebudget.FixedWindow, ratebudget.TokenBucket, ratebudget.RollingWindow, ratebudget.InFlight} {
		out = append(out, ratebudget.Check{Rule: ratebudget.Rule{Name: "r" + strconv.Itoa(int(alg)), Algorithm: alg, Limit: 5, Window: time.Hour}, Identity: id, Cost: 1})
	}
	return out
}

// wantServerError fails unless err is a certain server StoreError whose reply starts
// with prefix.
func wantServerError(t *testing.T, what string, err error, prefix string) {
	t.Helper()
	var se *ratebudget.StoreError
	var re redis.Error
	if !errors.As(err, &se) || se.Class != ratebudget.ClassServer || se.Uncertain || !errors.As(err, &re) || !strings.HasPrefix(re.Error(), prefix) {
		t.Fatalf("%s: %v, want a certain server StoreError %s", what, err, prefix)
	}
}

// wantUnspent fails if any of the checks' keys exists.
func wantUnspent(t *testing.T, control *redis.Client, l *lua.Limiter, checks []ratebudget.Check) {
	t.Helper()
	for _, c := range checks {
		if n := control.Exists(context.Background(), l.Key(c)).Val(); n != 0 {
			t.Fatalf("%s (%s): key written after a certain error", c.Rule.Name, algname.Of(c.Rule.Algorithm))
		}
	}
}

// TestServerRefusesWrites: Redis checks whether it may write at a script's first write
// command (maxmemory with noeviction: OOM; a replica: READONLY; min-replicas-to-write
// not met: NOREPLICAS), and the limiter's scripts validate and read everything before
// it. Each state gives a certain server error that spent nothing, for every time rule,
// alone, together in one script, and in a decision of two slot groups; a refusal, which
// writes nothing, is still answered; a lease's renewal is refused; a settle of a
// reservation made before is either applied or refused, never half; and decisions admit
// again once the state is lifted.
func TestServerRefusesWrites(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name, prefix string
		set, lift    func(t *testing.T, control *redis.Client)
		// trimAdmits: an in-flight check is admitted anyway. Its script first trims
		// expired leases (ZREMRANGEBYSCORE), a write Redis allows over maxmemory,
		// and after a script's first write its later writes are allowed too.
		trimAdmits bool
	}{
		{"maxmemory noeviction", "OOM",
			func(t *testing.T, c *redis.Client) {
				must(t, c.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err())
				must(t, c.ConfigSet(ctx, "maxmemory", "1").Err())
			},
			func(t *testing.T, c *redis.Client) { must(t, c.ConfigSet(ctx, "maxmemory", "0").Err()) }, true},
		{"replica", "READONLY",
			func(t *testing.T, c *redis.Client) {
				// A primary demoted while clients still point at it: it replicates a
				// master (here one that does not answer) and serves stale reads.
				must(t, c.Do(ctx, "REPLICAOF", "127.0.0.1", "1").Err())
			},
			func(t *testing.T, c *redis.Client) { must(t, c.Do(ctx, "REPLICAOF", "NO", "ONE").Err()) }, false},
		{"min-replicas-to-write", "NOREPLICAS",
			func(t *testing.T, c *redis.Client) { must(t, c.ConfigSet(ctx, "min-replicas-to-write", "1").Err()) },
			func(t *testing.T, c *redis.Client) { must(t, c.ConfigSet(ctx, "min-replicas-to-write", "0").Err()) }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t)
			c, control := srv.Client(t), srv.Client(t)
			l := newLimiter(t, c, lua.WithRefusalCache(0))
			must(t, l.Load(ctx))
			// Before: a spent budget (to be refused) and a reservation (to be settled).
			full := ratebudget.Check{Rule: ratebudget.Rule{Name: "full", Limit: 1, Window: time.Hour}, Identity: "z", Cost: 1}
			if d, err := l.Allow(ctx, []ratebudget.Check{full}); err != nil || !d.Allowed {
				t.Fatalf("Allow before: %+v, %v", d, err)
			}
			reserved := stateChecks("reserved")
			tickets := make([]ratebudget.Ticket, len(reserved))
			if d, err := l.Reserve(ctx, reserved, tickets, nil); err != nil || !d.Allowed {
				t.Fatalf("Reserve before: %+v, %v", d, err)
			}
			before := map[string]keyState{}
			for _, ch := range reserved {
				before[l.Key(ch)] = stateOf(t, control, l.Key(ch))
			}

			tc.set(t, control)
			all := stateChecks("ann")
			if tc.trimAdmits {
				lease := all[3]
				all = all[:3]
				d, err := l.Allow(ctx, []ratebudget.Check{lease})
				if err != nil || !d.Allowed || control.ZCard(ctx, l.Key(lease)).Val() != 1 {
					t.Fatalf("in-flight Allow: %+v, %v, %d leases; want admitted and counted", d, err, control.ZCard(ctx, l.Key(lease)).Val())
				}
			}
			for _, ch := range all {
				_, err := l.Allow(ctx, []ratebudget.Check{ch})
				wantServerError(t, "Allow "+algname.Of(ch.Rule.Algorithm), err, tc.prefix)
			}
			_, err := l.Allow(ctx, all)
			wantServerError(t, "Allow of every rule", err, tc.prefix)
			site := ratebudget.Check{Rule: ratebudget.Rule{Name: "site", Limit: 5, Window: time.Hour}, Cost: 1}
			_, err = l.Allow(ctx, []ratebudget.Check{site, all[0]})
			wantServerError(t, "Allow of two slot groups", err, tc.prefix)
			_, err = l.Reserve(ctx, all, make([]ratebudget.Ticket, len(all)), nil)
			wantServerError(t, "Reserve", err, tc.prefix)
			wantUnspent(t, control, l, append(all, site))
			if d, err := l.Allow(ctx, []ratebudget.Check{full}); err != nil || d.Allowed {
				t.Fatalf("Allow of a spent budget: %+v, %v; want a refusal (it writes nothing)", d, err)
			}
			// A renewal writes the lease's new expiry: refused too, so the lease keeps
			// its old one.
			wantServerError(t, "Renew", l.Renew(ctx, reserved, tickets), tc.prefix)
			// Settling the reservation at cost 0: gives back and releases, or a certain
			// error that changed nothing.
			err = l.Settle(ctx, reserved, tickets, make([]int64, len(reserved)))
			if err != nil {
				wantServerError(t, "Settle", err, tc.prefix)
				for _, ch := range reserved {
					if got := stateOf(t, control, l.Key(ch)); got.value != before[l.Key(ch)].value {
						t.Fatalf("Settle failed with a certain error but changed %s: %q, was %q", algname.Of(ch.Rule.Algorithm), got.value, before[l.Key(ch)].value)
					}
				}
			}

			tc.lift(t, control)
			if d, err := l.Allow(ctx, all); err != nil || !d.Allowed {
				t.Fatalf("Allow once lifted: %+v, %v", d, err)
			}
			if v := control.Get(ctx, l.Key(all[0])).Val(); v != "1" {
				t.Fatalf("fixed window %q once lifted, want 1: the refused decisions spent nothing", v)
			}
		})
	}
}

// keyState is a key's type and raw value.
type keyState struct{ typ, value string }

func stateOf(t *testing.T, c *redis.Client, key string) keyState {
	t.Helper()
	ctx := context.Background()
	s := keyState{typ: c.Type(ctx, key).Val()}
	switch s.typ {
	case "string":
		s.value = c.Get(ctx, key).Val()
	case "zset":
		s.value = fmt.Sprint(c.ZRangeWithScores(ctx, key, 0, -1).Val())
	}
	return s
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestBusyServer: while another client's script runs past busy-reply-threshold, Redis
// answers BUSY to everything but SCRIPT KILL and SHUTDOWN NOSAVE: a certain error,
// nothing spent, and no wait for the decision's deadline. Once the script is killed,
// decisions admit again.
func TestBusyServer(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t, "--busy-reply-threshold", "20")
	c, control := srv.Client(t), srv.Client(t)
	l := newLimiter(t, c, lua.WithRefusalCache(0))
	must(t, l.Load(ctx))
	other := srv.Client(t)
	busy := make(chan error, 1)
	go func() { busy <- other.Eval(ctx, "while true do end", nil).Err() }()
	// PING blocks while the script runs below the threshold, then is answered BUSY.
	for {
		err := control.Ping(ctx).Err()
		if redis.HasErrorPrefix(err, "BUSY") {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	all := stateChecks("ann")
	dctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	_, err := l.Allow(dctx, all)
	wantServerError(t, "Allow while busy", err, "BUSY")
	if dctx.Err() != nil {
		t.Fatal("the decision waited for its deadline")
	}
	_, err = l.Reserve(ctx, all, make([]ratebudget.Ticket, len(all)), nil)
	wantServerError(t, "Reserve while busy", err, "BUSY")
	must(t, control.ScriptKill(ctx).Err())
	if err := <-busy; err == nil {
		t.Fatal("the endless script returned no error once killed")
	}
	wantUnspent(t, control, l, all)
	if d, err := l.Allow(ctx, all); err != nil || !d.Allowed {
		t.Fatalf("Allow after SCRIPT KILL: %+v, %v", d, err)
	}
}

// TestSlowScriptBelowThreshold: another client's script that runs below
// busy-reply-threshold holds every client. A decision returns at its deadline with an
// uncertain timeout, and the uncertainty is real: Redis runs the abandoned call once
// the other script ends.
func TestSlowScriptBelowThreshold(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t, "--busy-reply-threshold", "60000")
	c, control := srv.Client(t), srv.Client(t)
	l := newLimiter(t, c, lua.WithRefusalCache(0))
	must(t, l.Load(ctx))
	other := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, ReadTimeout: time.Minute})
	t.Cleanup(func() { other.Close() })
	slow := make(chan error, 1)
	go func() {
		// The script spins for 3 s of the server's CPU time (os.clock, where the server
		// has it, as Valkey does), or of TIME where there is no os (Redis 7.0, whose TIME
		// advances within a script; Valkey's stays where the script began).
		slow <- other.Eval(ctx, `local ok, clock = pcall(function() return os.clock end)
			if not ok then clock = function() local t = redis.call('TIME') return tonumber(t[1]) + tonumber(t[2]) / 1e6 end end
			local t0 = clock()
			while clock() < t0 + 3 do end
			return 1`, nil).Err()
	}()
	// Wait until the script holds the server: a PING with a short deadline times out.
	for {
		pctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		err := control.Ping(pctx).Err()
		cancel()
		if err != nil {
			break
		}
	}
	fw := ratebudget.Check{Rule: ratebudget.Rule{Name: "fw", Limit: 5, Window: time.Hour}, Identity: "ann", Cost: 1}
	dctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err := l.Allow(dctx, []ratebudget.Check{fw})
	cancel()
	var se *ratebudget.StoreError
	if !errors.As(err, &se) || se.Class != ratebudget.ClassTimeout || !se.Uncertain {
		t.Fatalf("Allow while another script runs: %v, want an uncertain timeout", err)
	}
	must(t, <-slow)
	// The abandoned call runs once the server reads its connection again.
	var spent string
	for end := time.Now().Add(10 * time.Second); spent != "1" && time.Now().Before(end); {
		spent = control.Get(ctx, l.Key(fw)).Val()
		time.Sleep(10 * time.Millisecond) // polling with a deadline
	}
	if spent != "1" {
		t.Fatalf("the budget holds %q after the other script ended, want 1: the abandoned call ran", spent)
	}
}

// TestClientPauseWrite: while clients are paused for writes (CLIENT PAUSE ... WRITE, as
// failover tooling does), Redis holds every script that may write: a decision ends at
// its deadline with an uncertain timeout, and admits again once the pause ends.
func TestClientPauseWrite(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	c, control := srv.Client(t), srv.Client(t)
	l := newLimiter(t, c, lua.WithRefusalCache(0))
	must(t, l.Load(ctx))
	must(t, control.Do(ctx, "CLIENT", "PAUSE", "60000", "WRITE").Err())
	fw := stateChecks("ann")[:1]
	dctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err := l.Allow(dctx, fw)
	cancel()
	var se *ratebudget.StoreError
	if !errors.As(err, &se) || se.Class != ratebudget.ClassTimeout || !se.Uncertain {
		t.Fatalf("Allow while paused: %v, want an uncertain timeout", err)
	}
	must(t, control.Do(ctx, "CLIENT", "UNPAUSE").Err())
	if d, err := l.Allow(ctx, fw); err != nil || !d.Allowed {
		t.Fatalf("Allow after the pause: %+v, %v", d, err)
	}
}

// TestLoadingServer: a server restarting with a dataset answers LOADING until it is
// loaded: Load and decisions get a certain server error, and nothing is spent.
func TestLoadingServer(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	first := redistest.Start(t, "--dir", dir)
	fc := first.Client(t)
	pipe := fc.Pipeline()
	for i := range 3000 {
		pipe.Set(ctx, fmt.Sprint("fill:", i), strings.Repeat("x", 1000), 0)
	}
	_, err := pipe.Exec(ctx)
	must(t, err)
	must(t, fc.Save(ctx).Err())
	first.Kill(t)
	// Loading the 3000 keys takes at least 3s (1ms each); the server answers between keys.
	srv := redistest.Start(t, "--dir", dir, "--key-load-delay", "1000", "--loading-process-events-interval-bytes", "1024")
	c := srv.Client(t)
	l := newLimiter(t, c, lua.WithRefusalCache(0))
	wantServerError(t, "Load", l.Load(ctx), "LOADING")
	all := stateChecks("ann")
	_, err = l.Allow(ctx, all)
	wantServerError(t, "Allow", err, "LOADING")
	_, err = l.Reserve(ctx, all, make([]ratebudget.Ticket, len(all)), nil)
	wantServerError(t, "Reserve", err, "LOADING")
}

// TestEvictionResetsBudgets: under an evicting maxmemory-policy, budgets are evicted
// like any key, and with a volatile-* policy first, being the keys with a TTL. An
// evicted budget is a silent reset: no error, and the limiter admits again from zero.
// This is why the limiter's Redis needs noeviction (docs/FAILURE.md).
func TestEvictionResetsBudgets(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	c := srv.Client(t)
	l := newLimiter(t, c, lua.WithRefusalCache(0))
	fw := ratebudget.Check{Rule: ratebudget.Rule{Name: "fw", Limit: 10, Window: time.Hour}, Identity: "ann", Cost: 1}
	for range 5 {
		if d, err := l.Allow(ctx, []ratebudget.Check{fw}); err != nil || !d.Allowed {
			t.Fatalf("Allow: %+v, %v", d, err)
		}
	}
	must(t, c.ConfigSet(ctx, "maxmemory-policy", "volatile-lru").Err())
	must(t, c.ConfigSet(ctx, "maxmemory", "3000000").Err())
	// Keys without a TTL until Redis has nothing left to evict.
	var err error
	for i := 0; err == nil; i++ {
		if i == 100000 {
			t.Fatal("maxmemory never reached")
		}
		err = c.Set(ctx, fmt.Sprint("fill:", i), strings.Repeat("x", 1000), 0).Err()
	}
	if !redis.HasErrorPrefix(err, "OOM") {
		t.Fatal(err)
	}
	must(t, c.ConfigSet(ctx, "maxmemory", "0").Err())
	d, err := l.Allow(ctx, []ratebudget.Check{fw})
	if err != nil || !d.Allowed || d.Remaining != 9 {
		t.Fatalf("Allow after eviction: %+v, %v; want admitted with 9 left: the 5 spent were lost", d, err)
	}
}

// TestMaxClientsReached: a server at maxclients accepts a connection, answers its
// first command (go-redis's HELLO) with an error and closes it. go-redis takes that
// error for a server without HELLO and writes on, so the limiter gets a connection
// error (a broken pipe or EOF), reported uncertain although nothing ran. Nothing is
// spent.
func TestMaxClientsReached(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	control := srv.Client(t)
	must(t, control.ConfigSet(ctx, "maxclients", "1").Err()) // the control connection
	c := srv.Client(t)
	l := newLimiter(t, c, lua.WithRefusalCache(0))
	all := stateChecks("ann")
	_, err := l.Allow(ctx, all)
	var se *ratebudget.StoreError
	if !errors.As(err, &se) || (se.Class != ratebudget.ClassConnection && se.Class != ratebudget.ClassServer) {
		t.Fatalf("Allow at maxclients: %v, want a connection or server StoreError", err)
	}
	must(t, control.ConfigSet(ctx, "maxclients", "100").Err())
	wantUnspent(t, control, l, all)
	if d, err := l.Allow(ctx, all); err != nil || !d.Allowed {
		t.Fatalf("Allow below maxclients: %+v, %v", d, err)
	}
}
