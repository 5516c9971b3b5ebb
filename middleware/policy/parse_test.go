package policy

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
)

func TestParseExample(t *testing.T) {
	p, err := Load("testdata/example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if got := len(p.rules); got != 3 {
		t.Fatalf("rules = %d, want 3", got)
	}
	var names []string
	for _, c := range p.classes {
		names = append(names, c.name)
	}
	if got, want := strings.Join(names, ","), ",free,pro,pro.acme"; got != want {
		t.Errorf("classes = %q, want %q", got, want)
	}
	if p.file != "testdata/example.yaml" || len(p.Source()) == 0 {
		t.Errorf("file, Source = %q, %d bytes", p.file, len(p.Source()))
	}
}

// A bad file is refused with its line, column and field path.
func TestParseErrors(t *testing.T) {
	const head = "rules:\n  - name: a\n    identity: ip\n"
	tt := []struct {
		name string
		src  string
		want string
	}{
		{"wrong_type", head + "    time: {limit: abc, window: 1m}\n",
			`p.yaml:4:19: rules[0].time.limit: must be an integer, got string "abc"`},
		{"wrong_type_duration", head + "    time: {limit: 5, window: 60}\n",
			`p.yaml:4:30: rules[0].time.window: must be a duration such as 1s, 1m or 24h, got integer 60`},
		{"unknown_field", head + "    time: {limit: 5, window: 1m, limt: 4}\n",
			`p.yaml:4:34: rules[0].time.limt: unknown field "limt" (known here: burst, limit, period, type, week_start, window, zone)`},
		{"unknown_top_field", "rule: []\n",
			`p.yaml:1:1: rule: unknown field "rule"`},
		{"negative_limit", head + "    time: {limit: -5, window: 1m}\n",
			`p.yaml:4:19: rules[0].time.limit: must be in 1..1099511627776, got -5`},
		{"missing_limit", head + "    time: {window: 1m}\n",
			`p.yaml:4:11: rules[0].time.limit: is required`},
		{"bad_window", head + "    time: {limit: 5, window: soon}\n",
			`p.yaml:4:30: rules[0].time.window: must be a duration such as 1s, 1m or 24h, got "soon"`},
		{"unknown_plan", head + "    time: {limit: 5, window: 1m}\nplans:\n  free: {a: {limit: 1}}\ntenants:\n  header: X-API-Key\n  keys: {k1: gold}\n",
			`p.yaml:9:14: tenants.keys.k1: unknown plan "gold" (plans: free)`},
		{"unknown_default_plan", head + "    time: {limit: 5, window: 1m}\ntenants:\n  header: X-API-Key\n  default: free\n",
			`p.yaml:7:12: tenants.default: unknown plan "free": the file has no plans`},
		{"plan_unknown_rule", head + "    time: {limit: 5, window: 1m}\nplans:\n  free: {b: {limit: 1}}\n",
			`p.yaml:6:13: plans.free.b: unknown rule "b"`},
		{"plan_negative_limit", head + "    time: {limit: 5, window: 1m}\nplans:\n  free:\n    a: {limit: -1}\n",
			`p.yaml:7:16: plans.free.a.limit: must be in 1..1099511627776, got -1`},
		{"replaces_cycle", "rules:\n" +
			"  - {name: a, identity: ip, time: {limit: 1, window: 1s}, replaces: [b]}\n" +
			"  - {name: b, identity: ip, time: {limit: 1, window: 1s}, replaces: [c]}\n" +
			"  - {name: c, identity: ip, time: {limit: 1, window: 1s}, replaces: [a]}\n",
			`p.yaml:4:70: rules[2].replaces[0]: forms a cycle: a replaces b replaces c replaces a`},
		{"replaces_unknown", "rules:\n  - {name: a, identity: ip, time: {limit: 1, window: 1s}, replaces: [x]}\n",
			`p.yaml:2:70: rules[0].replaces[0]: unknown rule "x"`},
		{"unknown_zone", head + "    time: {type: calendar, limit: 5, period: day, zone: Mars/Olympus_Mons}\n",
			`p.yaml:4:57: rules[0].time.zone: unknown time zone "Mars/Olympus_Mons" (an IANA name such as America/New_York)`},
		{"local_zone", head + "    time: {type: calendar, limit: 5, period: day, zone: Local}\n",
			`p.yaml:4:57: rules[0].time.zone: must name a zone such as Europe/Paris: Local differs between machines`},
		{"calendar_window", head + "    time: {type: calendar, limit: 5, period: day, window: 24h}\n",
			`p.yaml:4:59: rules[0].time.window: does not apply to a calendar rule: its period is its window`},
		{"calendar_no_period", head + "    time: {type: calendar, limit: 5}\n",
			`p.yaml:4:11: rules[0].time.period: is required for a calendar rule: hour, day, week, month or year`},
		{"period_on_fixed", head + "    time: {limit: 5, window: 1m, period: day}\n",
			`p.yaml:4:42: rules[0].time.period: applies to a calendar rule only`},
		{"burst_on_fixed", head + "    time: {limit: 5, window: 1m, burst: 9}\n",
			`p.yaml:4:41: rules[0].time.burst: applies to TokenBucket only, got 9 for fixed`},
		{"bad_identity", "rules:\n  - name: a\n    identity: cookie\n    time: {limit: 5, window: 1m}\n",
			`p.yaml:3:15: rules[0].identity: must be ip, global, header:NAME or hashed_header:NAME (NAME a header field name), got "cookie"`},
		{"duplicate_name", "rules:\n  - {name: a, identity: ip, unlimited: true}\n  - {name: a, identity: ip, unlimited: true}\n",
			`p.yaml:3:12: rules[1].name: "a" names another rule too`},
		{"bad_name", "rules:\n  - {name: 'a b', identity: ip, unlimited: true}\n",
			`p.yaml:2:12: rules[0].name: has byte ' ' at 1; use only [A-Za-z0-9_.-]`},
		{"duplicate_key", head + "    shadow: true\n    shadow: false\n    unlimited: true\n",
			`p.yaml:5:5: rules[0].shadow: is given twice`},
		{"list_for_mapping", "rules:\n  - name: a\n    identity: ip\n    time: [5]\n",
			`p.yaml:4:11: rules[0].time: must be a mapping, got a list`},
		{"alias_bomb", "plans:\n  a: {r: &l {limit: 1}}\n" + aliasBomb(),
			`p.yaml:3:149: plans.p23.r16: follows more than 1000 aliases`},
		{"not_yaml", "rules: [\n",
			`p.yaml:1: did not find expected node content`},
		{"empty", "# nothing\n", `p.yaml: is empty: a policy has at least a list of rules`},
		{"no_rules", "shadow_mode: true\n", `p.yaml:1:1: rules: must list at least one rule`},
		{"override_without_tenants", head + "    unlimited: true\noverrides:\n  acme: {key: k, rules: {a: {limit: 1}}}\n",
			`p.yaml:6:3: overrides: needs tenants: which header names a tenant`},
		{"client_ip_bad_cidr", "client_ip:\n  trusted_proxies: [\"10.0.0.0/8\", \"10.0.0/8\"]\n  header: X-Forwarded-For\n" + head + "    unlimited: true\n",
			`p.yaml:2:35: client_ip.trusted_proxies[1]: invalid CIDR "10.0.0/8": `},
		{"client_ip_trust_everyone", "client_ip:\n  trusted_proxies: [0.0.0.0/0]\n  header: X-Forwarded-For\n" + head + "    unlimited: true\n",
			`p.yaml:2:21: client_ip.trusted_proxies[0]: invalid CIDR "0.0.0.0/0": a /0 prefix would trust every address`},
		{"client_ip_no_proxies", "client_ip:\n  trusted_proxies: []\n  header: X-Forwarded-For\n" + head + "    unlimited: true\n",
			`p.yaml:2:20: client_ip.trusted_proxies: at least one prefix is required`},
		{"client_ip_header_untrusted", "client_ip:\n  header: X-Forwarded-For\n" + head + "    unlimited: true\n",
			`p.yaml:2:11: client_ip.header: needs trusted_proxies: a forwarding header is believed only from a trusted proxy`},
		{"client_ip_bad_header", "client_ip:\n  trusted_proxies: [10.0.0.0/8]\n  header: 'X Real IP'\n" + head + "    unlimited: true\n",
			`p.yaml:3:11: client_ip.header: invalid header name "X Real IP"`},
		{"client_ip_empty_header", "client_ip:\n  trusted_proxies: [10.0.0.0/8]\n  header: ''\n" + head + "    unlimited: true\n",
			`p.yaml:3:11: client_ip.header: invalid header name ""`},
		{"client_ip_proxies_without_header", "client_ip:\n  trusted_proxies: [10.0.0.0/8]\n" + head + "    unlimited: true\n",
			`p.yaml:2:20: client_ip.trusted_proxies: has no effect without header: name the forwarding header the proxies write`},
		{"client_ip_require_without_header", "client_ip:\n  require_forwarding: true\n" + head + "    unlimited: true\n",
			`p.yaml:2:23: client_ip.require_forwarding: needs header: it refuses a request from a trusted proxy that has no forwarding header`},
		{"client_ip_ipv4_prefix", "client_ip: {ipv4_prefix: 33}\n" + head + "    unlimited: true\n",
			`p.yaml:1:26: client_ip.ipv4_prefix: must be a prefix length: 33 bits, want 1 to 32`},
		{"client_ip_ipv6_prefix_huge", "client_ip: {ipv6_prefix: 99999999999999}\n" + head + "    unlimited: true\n",
			`p.yaml:1:26: client_ip.ipv6_prefix: must be a prefix length: 99999999999999 bits, want 1 to 128`},
		{"client_ip_unknown_field", "client_ip: {trusted: [10.0.0.0/8]}\n" + head + "    unlimited: true\n",
			`p.yaml:1:13: client_ip.trusted: unknown field "trusted" (known here: header, ipv4_prefix, ipv6_prefix, require_forwarding, trusted_proxies)`},
		{"inflight_successes", head + "    time: {type: inflight, limit: 5, window: 1m}\n    counts: {contract: successes}\n",
			`p.yaml:5:24: rules[0].counts.contract: an inflight rule counts attempts only: it holds one lease per request`},
	}
	for _, tc := range tt {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("p.yaml", []byte(tc.src))
			var pe *Error
			if !errors.As(err, &pe) {
				t.Fatalf("Parse = %v, want a *Error", err)
			}
			if got := err.Error(); !strings.HasPrefix(got, tc.want) {
				t.Errorf("error\n got %s\nwant %s", got, tc.want)
			}
		})
	}
}

// aliasBomb is 40 plans, each an alias of a plan of 40 rules that are each an alias:
// 1,600 uses of an alias.
func aliasBomb() string {
	var b strings.Builder
	b.WriteString("  m: &m {")
	for j := range 40 {
		fmt.Fprintf(&b, "r%d: *l, ", j)
	}
	b.WriteString("}\n")
	for i := range 40 {
		fmt.Fprintf(&b, "  p%d: *m\n", i)
	}
	return b.String()
}

func TestLoadMissing(t *testing.T) {
	if _, err := Load("testdata/nothing-here.yaml"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load = %v, want os.ErrNotExist", err)
	}
}
