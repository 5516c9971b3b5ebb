package middleware_test

import (
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/headers"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/keyfuncs"
	"github.com/ratebudget/ratebudget/lua"
	"github.com/ratebudget/ratebudget/middleware"
)

// On Redis, as in process, a request with two rules gets a RateLimit list member for
// each, admitted or refused, with coalescing and with refusals repeated from the
// refusal cache: the members (names and remaining units) are those the in-process
// limiter gives for the same requests.
func TestRateLimitListsEveryRuleOnRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	client := srv.Client(t)
	hook := &cmdCount{n: map[string]int{}}
	client.AddHook(hook)
	redisLim, err := lua.New(client, lua.WithPrefix("report"), lua.WithCoalescing(64))
	if err != nil {
		t.Fatal(err)
	}
	rules := []middleware.Rule{
		{Rule: ratebudget.Rule{Name: "client", Limit: 2, Window: time.Minute}, Identity: keyfuncs.Header("X-Client")},
		{Rule: ratebudget.Rule{Name: "site", Limit: 10, Window: time.Hour}, Identity: global},
	}
	handler := func(lim ratebudget.Limiter) func(hdr map[string]string) (int, string) {
		h := mustNew(t, lim, rules, middleware.WithHeaders(headers.IETF), middleware.WithTimeout(time.Minute))(ok)
		return func(hdr map[string]string) (int, string) {
			rec := do(h, "GET", "/", hdr)
			return rec.Code, rec.Header().Get("RateLimit")
		}
	}
	onRedis, inProcess := handler(redisLim), handler(newMemory(t, newClock()))
	alice, bob := map[string]string{"X-Client": "alice"}, map[string]string{"X-Client": "bob"}
	noT := regexp.MustCompile(`;t=\d+`) // seconds left differ between the two clocks
	var codes []int
	for i, hdr := range []map[string]string{alice, alice, alice, alice, bob, alice, bob, bob, alice} {
		if i == 3 {
			hook.take()
		}
		code, got := onRedis(hdr)
		wantCode, want := inProcess(hdr)
		if code != wantCode || noT.ReplaceAllString(got, "") != noT.ReplaceAllString(want, "") {
			t.Fatalf("request %d: %d RateLimit %q; in process %d %q", i, code, got, wantCode, want)
		}
		if n := len(strings.Split(got, ", ")); n != 2 || !strings.HasPrefix(got, `"client";r=`) || !strings.Contains(got, `, "site";r=`) {
			t.Fatalf("request %d: RateLimit %q, want a member for each of client and site", i, got)
		}
		codes = append(codes, code)
		if i == 3 {
			// alice's third and fourth requests are refused; the fourth from the cache.
			if n := hook.take(); n["evalsha"] != 0 {
				t.Fatalf("alice's repeated refusal sent %v; want it answered by the refusal cache", n)
			}
		}
	}
	if want := []int{200, 200, 429, 429, 200, 429, 200, 429, 429}; !slices.Equal(codes, want) {
		t.Fatalf("codes %v, want %v", codes, want)
	}
}
