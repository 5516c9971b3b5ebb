package lua_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/algname"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/lua"
)

// limiterACL is the ACL rule that docs/FAILURE.md gives for the limiter's Redis user,
// for keys under the prefix p and the password pw: the script commands, SCRIPT LOAD
// and PING for Load, and every command the scripts call.
func limiterACL(t *testing.T, p string) []any {
	t.Helper()
	rules, _ := redistest.DocumentedACL(t, p, "pw")
	return rules
}

// clusterACL is limiterACL with the rules docs/FAILURE.md adds for a ClusterClient.
func clusterACL(t *testing.T, p string) []any {
	t.Helper()
	rules, cluster := redistest.DocumentedACL(t, p, "pw")
	return append(rules, cluster...)
}

// wantNoPermissionErrors fails if any of servers has refused a command for lack of
// permission (NOPERM): a user with the documented ACL never is.
func wantNoPermissionErrors(t *testing.T, servers ...*redistest.Server) {
	t.Helper()
	for _, s := range servers {
		if n := s.ErrorReplies(t, "NOPERM"); n != 0 {
			t.Errorf("server %s refused %d commands for lack of permission", s.Addr, n)
		}
	}
}

// aclClient sets the ACL user "limiter" to rule on srv and returns a client logged in
// as that user with password pw (over TLS for a server started by redistest.StartTLS).
func aclClient(t *testing.T, srv *redistest.Server, control *redis.Client, pw string, rule []any) *redis.Client {
	t.Helper()
	must(t, control.Do(context.Background(), append([]any{"ACL", "SETUSER", "limiter", "reset"}, rule...)...).Err())
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "limiter", Password: pw, MaxRetries: -1, TLSConfig: srv.TLSConfig(),
		ContextTimeoutEnabled: true, DialerRetries: 1, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second})
	t.Cleanup(func() { c.Close() })
	return c
}

// TestDocumentedACL: a Redis user with exactly the documented permissions can Load and
// run every kind of call the limiter makes: decisions of every time rule, one and
// several slot groups (with a refund), Reserve, Settle below and above the
// reservation, Renew, and Reset.
func TestDocumentedACL(t *testing.T) {
	srv := redistest.Start(t)
	documentedACLCalls(t, aclClient(t, srv, srv.Client(t), "pw", limiterACL(t, "acl")))
	wantNoPermissionErrors(t, srv)
}

// TestDocumentedACLDisableIdentity: the other way the doc gives to the CLIENT SETINFO
// rule, a client with DisableIdentity, runs every kind of call with the server's rules
// alone and is refused nothing, on any server.
func TestDocumentedACLDisableIdentity(t *testing.T) {
	srv := redistest.Start(t)
	rules, _, _ := redistest.DocumentedACLCommands(t, "acl", "pw")
	must(t, srv.Client(t).Do(context.Background(), append([]any{"ACL", "SETUSER", "limiter", "reset"}, rules...)...).Err())
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "limiter", Password: "pw", MaxRetries: -1,
		ContextTimeoutEnabled: true, DialerRetries: 1, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second,
		DisableIdentity: true})
	t.Cleanup(func() { c.Close() })
	documentedACLCalls(t, c)
	wantNoPermissionErrors(t, srv)
}

// documentedACLCalls loads a limiter of prefix acl on c and makes every kind of call.
func documentedACLCalls(t *testing.T, c *redis.Client) {
	t.Helper()
	ctx := context.Background()
	l, err := lua.New(c, lua.WithPrefix("acl"), lua.WithRefusalCache(0))
	must(t, err)
	must(t, l.Load(ctx))
	all := stateChecks("ann")
	if d, err := l.Allow(ctx, all); err != nil || !d.Allowed {
		t.Fatalf("Allow of every rule: %+v, %v", d, err)
	}
	site := ratebudget.Check{Rule: ratebudget.Rule{Name: "site", Limit: 1, Window: time.Hour}, Cost: 1}
	if d, err := l.Allow(ctx, []ratebudget.Check{site, all[0]}); err != nil || !d.Allowed {
		t.Fatalf("Allow of two slot groups: %+v, %v", d, err)
	}
	// The site is spent: a later group refuses, the earlier one is given back.
	if d, err := l.Allow(ctx, []ratebudget.Check{all[1], site}); err != nil || d.Allowed {
		t.Fatalf("Allow refused by its second group: %+v, %v", d, err)
	}
	for _, extra := range []int64{0, 2} {
		checks := stateChecks(fmt.Sprint("bob", extra))
		tickets := make([]ratebudget.Ticket, len(checks))
		if d, err := l.Reserve(ctx, checks, tickets, nil); err != nil || !d.Allowed {
			t.Fatalf("Reserve: %+v, %v", d, err)
		}
		must(t, l.Renew(ctx, checks, tickets))
		costs := []int64{1 + extra, 1 + extra, 1 + extra, 1}
		must(t, l.Settle(ctx, checks, tickets, costs))
	}
	must(t, l.Reset(ctx, append(all, site)...))
}

// TestDocumentedACLOnACluster: on a Redis Cluster the same user, with the rules the
// doc adds for a ClusterClient, can Load and decide, and is refused nothing.
func TestDocumentedACLOnACluster(t *testing.T) {
	_, nodes := redistest.StartCluster(t, 3)
	documentedClusterACLCalls(t, nodes)
}

// documentedClusterACLCalls gives the user of clusterACL (prefix acl) to every node, and
// over a ClusterClient logged in as that user (over TLS for nodes started with TLS),
// loads a limiter and decides rules of several slots. No node refuses a command.
func documentedClusterACLCalls(t *testing.T, nodes []*redistest.Server) {
	t.Helper()
	ctx := context.Background()
	var addrs []string
	for _, n := range nodes {
		must(t, n.Client(t).Do(ctx, append([]any{"ACL", "SETUSER", "limiter", "reset"}, clusterACL(t, "acl")...)...).Err())
		must(t, n.Client(t).ConfigResetStat(ctx).Err())
		addrs = append(addrs, n.Addr)
	}
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, Username: "limiter", Password: "pw", MaxRetries: -1,
		TLSConfig: nodes[0].TLSConfig(), ContextTimeoutEnabled: true, DialerRetries: 1, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second})
	t.Cleanup(func() { c.Close() })
	l, err := lua.New(c, lua.WithPrefix("acl"), lua.WithRefusalCache(0))
	must(t, err)
	must(t, l.Load(ctx))
	site := ratebudget.Check{Rule: ratebudget.Rule{Name: "site", Limit: 5, Window: time.Hour}, Cost: 1}
	for _, id := range []string{"ann", "bob", "cy", "dee"} {
		checks := append(stateChecks(id), site)
		if d, err := l.Allow(ctx, checks); err != nil || !d.Allowed {
			t.Fatalf("Allow for %s: %+v, %v", id, d, err)
		}
	}
	wantNoPermissionErrors(t, nodes...)
}

// TestAuthAndPermissionErrors: a user refused by Redis (wrong password, none, no
// permission for EVALSHA, for the keys, or for a command a script calls) gets a certain
// server error from Load and from decisions, and nothing is spent.
func TestAuthAndPermissionErrors(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	control := srv.Client(t)
	acl := limiterACL(t, "acl")
	without := func(field string) []any {
		var out []any
		for _, f := range acl {
			if f != field {
				out = append(out, f)
			}
		}
		return out
	}
	for _, tc := range []struct {
		name    string
		pw      string
		rule    []any
		checks  []ratebudget.Check
		prefix  string
		loadErr bool
	}{
		{"wrong password", "nope", acl, stateChecks("ann"), "WRONGPASS", true},
		{"no EVALSHA", "pw", without("+evalsha"), stateChecks("ann"), "NOPERM", false},
		{"other keys", "pw", append(without("~acl:*"), "~other:*"), stateChecks("ann"), "NOPERM", false},
		{"read-only keys", "pw", append(without("~acl:*"), "%R~acl:*"), stateChecks("ann"), "NOPERM", false},
		// TIME is called before any write, by rolling windows and leases only.
		{"no TIME", "pw", without("+time"), stateChecks("ann")[2:], "ERR", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := aclClient(t, srv, control, tc.pw, tc.rule)
			l, err := lua.New(c, lua.WithPrefix("acl"), lua.WithRefusalCache(0))
			must(t, err)
			if err := l.Load(ctx); tc.loadErr {
				wantServerError(t, "Load", err, tc.prefix)
			} else {
				must(t, err)
			}
			for _, ch := range tc.checks {
				_, err := l.Allow(ctx, []ratebudget.Check{ch})
				wantServerError(t, "Allow "+algname.Of(ch.Rule.Algorithm), err, tc.prefix)
			}
			_, err = l.Reserve(ctx, tc.checks, make([]ratebudget.Ticket, len(tc.checks)), nil)
			wantServerError(t, "Reserve", err, tc.prefix)
			wantUnspent(t, control, l, tc.checks)
		})
	}
	t.Run("no password", func(t *testing.T) {
		must(t, control.ConfigSet(ctx, "requirepass", "secret").Err())
		limiter := func() *lua.Limiter {
			c := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, ContextTimeoutEnabled: true, DialerRetries: 1})
			t.Cleanup(func() { c.Close() })
			l, err := lua.New(c, lua.WithPrefix("acl"), lua.WithRefusalCache(0))
			must(t, err)
			return l
		}
		// NOAUTH, or for SCRIPT LOAD (a bulk string longer than an unauthenticated
		// client may send) a protocol error, after which Redis closes the connection:
		// a call on that client may then find the connection closed (uncertain), so
		// the decision is made on a client of its own.
		err := limiter().Load(ctx)
		wantServerError(t, "Load", err, "")
		// Redis's own words for a script sent before AUTH ("Protocol error:
		// unauthenticated bulk length") do not say that a password is missing.
		if !strings.Contains(err.Error(), "password") {
			t.Fatalf("Load: %v, want an error that says a password is wanted", err)
		}
		_, err = limiter().Allow(ctx, stateChecks("ann")[:1])
		wantServerError(t, "Allow", err, "NOAUTH")
	})
}

// TestNoPexpiretimeWritesNothing: settling reads a fixed window's PEXPIRETIME (Redis
// 7.0), and Reserve and decisions of several slot groups read it after their spend. A
// server or user without it (Redis before 7.0, or an ACL that does not grant it) gets a
// certain error that wrote nothing, not a certain error after the spend.
func TestNoPexpiretimeWritesNothing(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	control := srv.Client(t)
	acl := limiterACL(t, "acl")
	var without []any
	for _, f := range acl {
		if f != "+pexpiretime" {
			without = append(without, f)
		}
	}
	c := aclClient(t, srv, control, "pw", acl)
	l, err := lua.New(c, lua.WithPrefix("acl"), lua.WithRefusalCache(0))
	must(t, err)
	// A reservation of a lease and a fixed window, made while the user may.
	held := stateChecks("held")
	held = []ratebudget.Check{held[3], held[0]}
	tickets := make([]ratebudget.Ticket, len(held))
	if d, err := l.Reserve(ctx, held, tickets, nil); err != nil || !d.Allowed {
		t.Fatalf("Reserve: %+v, %v", d, err)
	}
	before := []keyState{stateOf(t, control, l.Key(held[0])), stateOf(t, control, l.Key(held[1]))}
	must(t, control.Do(ctx, append([]any{"ACL", "SETUSER", "limiter", "reset"}, without...)...).Err())

	fw := stateChecks("ann")[:1]
	_, err = l.Reserve(ctx, fw, make([]ratebudget.Ticket, 1), nil)
	wantServerError(t, "Reserve", err, "ERR")
	site := ratebudget.Check{Rule: ratebudget.Rule{Name: "site", Limit: 5, Window: time.Hour}, Cost: 1}
	_, err = l.Allow(ctx, []ratebudget.Check{site, fw[0]})
	wantServerError(t, "Allow of two slot groups", err, "ERR")
	wantUnspent(t, control, l, []ratebudget.Check{site, fw[0]})
	err = l.Settle(ctx, held, tickets, []int64{0, 0})
	wantServerError(t, "Settle", err, "ERR")
	for i, ch := range held {
		if got := stateOf(t, control, l.Key(ch)); got != before[i] {
			t.Fatalf("a certain Settle error changed %s: %v, was %v", algname.Of(ch.Rule.Algorithm), got, before[i])
		}
	}
}

// TestAllowScriptFitsOneWrite: allow.lua's SCRIPT LOAD fits go-redis's write buffer (32
// KiB), so that a client without its password is answered by Redis (a certain error,
// TestAuthAndPermissionErrors) rather than reset while still writing: Redis closes an
// unauthenticated connection that sends a bulk string above 16 KiB, and a command
// written in two parts meets that close on the second.
func TestAllowScriptFitsOneWrite(t *testing.T) {
	src := lua.AllowSource
	cmd := fmt.Sprintf("*3\r\n$6\r\nscript\r\n$4\r\nload\r\n$%d\r\n%s\r\n", len(src), src)
	if len(cmd) > 32<<10 {
		t.Fatalf("SCRIPT LOAD of allow.lua is %d bytes, above 32 KiB", len(cmd))
	}
}
