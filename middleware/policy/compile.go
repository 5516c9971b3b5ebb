package policy

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/bound"
)

// compiler turns a decoded file into a Policy, refusing the first problem with the
// position of its field.
type compiler struct {
	file  string
	pos   map[string]*yaml.Node
	rules []rule
	index map[string]int // rule name -> index in rules
	p     *Policy
	// ident and addr are the client_ip section's key functions: identity ip's, and the
	// whole address that match.ip reads.
	ident, addr func(*http.Request) (string, error)
}

func (c *compiler) fail(path, format string, args ...any) error {
	e := &Error{File: c.file, Path: path, Problem: fmt.Sprintf(format, args...)}
	// A field left out has no node: point at the nearest enclosing one that has.
	for p := path; ; p = parent(p) {
		if n, ok := c.pos[p]; ok {
			e.Line, e.Column = n.Line, n.Column
			break
		}
		if p == "" {
			break
		}
	}
	return e
}

// parent is path without its last element: "rules[1].time" for "rules[1].time.limit",
// "rules" for "rules[1]", "" for "rules".
func parent(path string) string {
	i := strings.LastIndexAny(path, ".[")
	if i < 0 {
		return ""
	}
	return path[:i]
}

func compile(name string, data []byte, f *file, pos map[string]*yaml.Node) (*Policy, error) {
	c := &compiler{file: name, pos: pos, index: map[string]int{}}
	if f.Version != 0 && f.Version != 1 {
		return nil, c.fail("version", "must be 1, got %d", f.Version)
	}
	if len(f.Rules) == 0 {
		return nil, c.fail("rules", "must list at least one rule")
	}
	var err error
	if c.ident, c.addr, err = c.clientIP(f.ClientIP); err != nil {
		return nil, err
	}
	for i := range f.Rules {
		if err := c.rule(fmt.Sprintf("rules[%d]", i), &f.Rules[i]); err != nil {
			return nil, err
		}
	}
	if err := c.replaces(f.Rules); err != nil {
		return nil, err
	}
	c.p = &Policy{file: name, source: slices.Clone(data), rules: c.rules, clientIP: c.ident}
	c.p.classes = []class{{limits: c.baseLimits()}}
	if err := c.plans(f.Plans); err != nil {
		return nil, err
	}
	if err := c.tenants(f.Tenants); err != nil {
		return nil, err
	}
	if err := c.overrides(f.Overrides); err != nil {
		return nil, err
	}
	if f.ShadowMode {
		for _, cl := range c.p.classes {
			for i := range cl.limits {
				cl.limits[i].Shadow = true
			}
		}
	}
	return c.p, nil
}

// rule compiles one rule: its name, identity, scope, match, time rule and contract.
func (c *compiler) rule(path string, s *ruleSpec) error {
	r := rule{name: s.Name, identity: s.Identity, scope: s.Scope, shadow: s.Shadow, unlimited: s.Unlimited}
	if err := (ratebudget.Rule{Name: s.Name, Limit: 1, Window: time.Second}).Validate(); err != nil {
		return c.fail(path+".name", "%s", problem(err))
	}
	if _, dup := c.index[s.Name]; dup {
		return c.fail(path+".name", "%q names another rule too", s.Name)
	}
	if err := c.identity(path+".identity", s.Identity); err != nil {
		return err
	}
	switch s.Scope {
	case "", "none", "route", "method_route":
	default:
		return c.fail(path+".scope", "must be none, route or method_route, got %q", s.Scope)
	}
	var err error
	if r.match, err = c.match(path+".match", s.Match); err != nil {
		return err
	}
	if err := c.timeRule(path+".time", s, &r); err != nil {
		return err
	}
	if err := c.counts(path+".counts", s.Counts, &r); err != nil {
		return err
	}
	c.index[s.Name] = len(c.rules)
	c.rules = append(c.rules, r)
	return nil
}

func (c *compiler) identity(path, id string) error {
	kind, name, _ := strings.Cut(id, ":")
	switch {
	case id == "ip" || id == "global":
		return nil
	case (kind == "header" || kind == "hashed_header") && token(name):
		return nil
	case id == "":
		return c.fail(path, "is required: ip, global, header:NAME or hashed_header:NAME")
	}
	return c.fail(path, "must be ip, global, header:NAME or hashed_header:NAME (NAME a header field name), got %q", id)
}

// token reports whether s is an HTTP token (RFC 9110 section 5.6.2), e.g. a header name.
func token(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

func (c *compiler) match(path string, s *matchSpec) (matcher, error) {
	var m matcher
	if s == nil {
		return m, nil
	}
	if s.Method != "" && (!token(s.Method) || strings.ToUpper(s.Method) != s.Method) {
		return m, c.fail(path+".method", "must be a method in upper case such as GET, got %q", s.Method)
	}
	m.method = s.Method
	if s.Path != "" && !strings.HasPrefix(s.Path, "/") {
		return m, c.fail(path+".path", "must start with /, got %q", s.Path)
	}
	m.path, m.pathPrefix = cutStar(s.Path)
	names := make([]string, 0, len(s.Headers))
	for k := range s.Headers {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		if !token(k) {
			return m, c.fail(join(path+".headers", k), "is not a header field name")
		}
		v, prefix := cutStar(s.Headers[k])
		m.headers = append(m.headers, headerMatch{name: http.CanonicalHeaderKey(k), value: v, prefix: prefix})
	}
	for i, a := range s.IP {
		pfx, err := netip.ParsePrefix(a)
		if err != nil {
			addr, aerr := netip.ParseAddr(a)
			if aerr != nil {
				return m, c.fail(fmt.Sprintf("%s.ip[%d]", path, i), "must be an address or a prefix such as 192.0.2.1 or 2001:db8::/32, got %q", a)
			}
			pfx = netip.PrefixFrom(addr, addr.BitLen())
		}
		m.ips = append(m.ips, pfx.Masked())
	}
	if len(m.ips) > 0 {
		m.addr = c.addr
	}
	return m, nil
}

// cutStar splits a trailing '*' (a prefix match) off s.
func cutStar(s string) (string, bool) {
	if v, ok := strings.CutSuffix(s, "*"); ok {
		return v, true
	}
	return s, false
}

// algorithms are the time rules by their name in the file.
var algorithms = map[string]ratebudget.Algorithm{
	"fixed": ratebudget.FixedWindow, "token": ratebudget.TokenBucket,
	"rolling": ratebudget.RollingWindow, "inflight": ratebudget.InFlight,
}

// timeRule compiles a rule's time rule into r.
func (c *compiler) timeRule(path string, s *ruleSpec, r *rule) error {
	t := s.Time
	if t == nil {
		if s.Unlimited {
			// No budget is ever asked: any valid values will do.
			r.base = limits{Limit: 1, Window: time.Second}
			return nil
		}
		return c.fail(path, "is required (or unlimited: true)")
	}
	if t.Type == "" {
		t.Type = "fixed"
	}
	if t.Type == "calendar" {
		return c.calendar(path, t, r)
	}
	algo, ok := algorithms[t.Type]
	if !ok {
		return c.fail(path+".type", "must be fixed, token, rolling, inflight or calendar, got %q", t.Type)
	}
	r.algorithm = algo
	for _, f := range []struct{ name, v string }{{"period", t.Period}, {"zone", t.Zone}, {"week_start", t.WeekStart}} {
		if f.v != "" {
			return c.fail(path+"."+f.name, "applies to a calendar rule only")
		}
	}
	if t.Limit == nil {
		return c.fail(path+".limit", "is required")
	}
	if t.Window == "" {
		return c.fail(path+".window", "is required: a duration such as 1s, 1m or 24h")
	}
	var err error
	r.base, err = c.limits(path, r, limits{}, limitSpec{Limit: t.Limit, Window: t.Window, Burst: t.Burst})
	return err
}

// calendar compiles a calendar rule's time rule into r.
func (c *compiler) calendar(path string, t *timeSpec, r *rule) error {
	r.algorithm = ratebudget.Calendar
	switch t.Period {
	case "hour", "day", "week", "month", "year":
		r.period = periods[t.Period]
	case "":
		return c.fail(path+".period", "is required for a calendar rule: hour, day, week, month or year")
	default:
		return c.fail(path+".period", "must be hour, day, week, month or year, got %q", t.Period)
	}
	loc, err := zone(t.Zone)
	if err != nil {
		return c.fail(path+".zone", "%v", err)
	}
	r.zone = loc
	if t.WeekStart != "" {
		if r.period != ratebudget.Week {
			return c.fail(path+".week_start", "applies to a week period only")
		}
		d, ok := weekdays[t.WeekStart]
		if !ok {
			return c.fail(path+".week_start", "must be a day of the week such as monday, got %q", t.WeekStart)
		}
		r.weekStart = d
	}
	if t.Limit == nil {
		return c.fail(path+".limit", "is required")
	}
	r.base, err = c.limits(path, r, limits{}, limitSpec{Limit: t.Limit, Window: t.Window, Burst: t.Burst})
	return err
}

var periods = map[string]ratebudget.Period{
	"hour": ratebudget.Hour, "day": ratebudget.Day, "week": ratebudget.Week, "month": ratebudget.Month, "year": ratebudget.Year,
}

var weekdays = map[string]time.Weekday{
	"sunday": time.Sunday, "monday": time.Monday, "tuesday": time.Tuesday, "wednesday": time.Wednesday,
	"thursday": time.Thursday, "friday": time.Friday, "saturday": time.Saturday,
}

// zone loads the IANA time zone name ("" is UTC). Local is refused: it differs between
// the machines that read one file.
func zone(name string) (*time.Location, error) {
	switch name {
	case "", "UTC":
		return time.UTC, nil
	case "Local":
		return nil, errors.New("must name a zone such as Europe/Paris: Local differs between machines")
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil, fmt.Errorf("unknown time zone %q (an IANA name such as America/New_York)", name)
	}
	return loc, nil
}

// limits applies s (a rule's time values, a plan's or an override's) over prev for rule r
// and validates the result as a time rule's values. A limit given without a burst has a
// burst of zero: the capacity is the limit.
func (c *compiler) limits(path string, r *rule, prev limits, s limitSpec) (limits, error) {
	l := prev
	if s.Limit != nil {
		l.Limit, l.Burst = *s.Limit, 0
	}
	if s.Burst != nil {
		l.Burst = *s.Burst
	}
	if s.Window != "" {
		d, err := time.ParseDuration(string(s.Window))
		if err != nil {
			return l, c.fail(path+".window", "must be a duration such as 1s, 1m or 24h, got %q", s.Window)
		}
		l.Window = d
	}
	l.Shadow = l.Shadow || s.Shadow
	l.Unlimited = l.Unlimited || s.Unlimited
	if r.algorithm == ratebudget.Calendar {
		if err := c.calendarLimits(path, l); err != nil {
			return l, err
		}
	}
	err := r.timeRule(l).Validate()
	var ce *ratebudget.ConfigError
	if errors.As(err, &ce) {
		return l, c.fail(path+"."+strings.ToLower(ce.Field), "%s", ce.Problem)
	}
	return l, err
}

// calendarLimits checks a calendar rule's values: a limit, and neither window nor burst
// (the period is the window).
func (c *compiler) calendarLimits(path string, l limits) error {
	switch {
	case l.Limit < 1 || l.Limit > bound.MaxLimit:
		return c.fail(path+".limit", "must be in 1..%d, got %d", int64(bound.MaxLimit), l.Limit)
	case l.Window != 0:
		return c.fail(path+".window", "does not apply to a calendar rule: its period is its window")
	case l.Burst != 0:
		return c.fail(path+".burst", "applies to a token rule only")
	}
	return nil
}

// problem is a ConfigError's problem, or err's text.
func problem(err error) string {
	var ce *ratebudget.ConfigError
	if errors.As(err, &ce) {
		return ce.Problem
	}
	return err.Error()
}

func (c *compiler) counts(path string, s *countSpec, r *rule) error {
	if s == nil {
		return nil
	}
	r.counts = *s
	switch s.Contract {
	case "", "attempts", "successes", "request_bytes":
		if s.Estimate != 0 || s.Header != "" {
			return c.fail(path, "estimate and header apply to response_bytes and response_header only")
		}
	case "response_bytes", "response_header":
		if s.Estimate < 1 {
			return c.fail(path+".estimate", "is required: the cost reserved at admission, at least 1")
		}
		if (s.Contract == "response_header") != (s.Header != "") {
			return c.fail(path+".header", "is required for response_header, and applies to it only")
		}
		if s.Header != "" && !token(s.Header) {
			return c.fail(path+".header", "must be a header field name, got %q", s.Header)
		}
	default:
		return c.fail(path+".contract", "must be attempts, successes, request_bytes, response_bytes or response_header, got %q", s.Contract)
	}
	if s.Contract != "" && s.Contract != "attempts" && r.algorithm == ratebudget.InFlight {
		return c.fail(path+".contract", "an inflight rule counts attempts only: it holds one lease per request")
	}
	return nil
}

// replaces resolves each rule's replaces into the replaced rules' replacedBy, refusing
// unknown names and cycles.
func (c *compiler) replaces(specs []ruleSpec) error {
	for i, s := range specs {
		for k, name := range s.Replaces {
			path := fmt.Sprintf("rules[%d].replaces[%d]", i, k)
			j, ok := c.index[name]
			switch {
			case !ok:
				return c.fail(path, "unknown rule %q", name)
			case j == i:
				return c.fail(path, "a rule cannot replace itself")
			case slices.Contains(c.rules[j].replacedBy, i):
				return c.fail(path, "%q is listed twice", name)
			}
			c.rules[j].replacedBy = append(c.rules[j].replacedBy, i)
		}
	}
	// A cycle (a replaces b, b replaces a) would drop every rule of it when all match.
	state := make([]uint8, len(specs)) // 0 unvisited, 1 on the stack, 2 done
	var visit func(i int, trail []string) error
	visit = func(i int, trail []string) error {
		state[i] = 1
		trail = append(trail, specs[i].Name)
		for k, name := range specs[i].Replaces {
			j := c.index[name]
			if state[j] == 1 {
				return c.fail(fmt.Sprintf("rules[%d].replaces[%d]", i, k), "forms a cycle: %s replaces %s", strings.Join(trail, " replaces "), name)
			}
			if state[j] == 0 {
				if err := visit(j, trail); err != nil {
					return err
				}
			}
		}
		state[i] = 2
		return nil
	}
	for i := range specs {
		if state[i] == 0 {
			if err := visit(i, nil); err != nil {
				return err
			}
		}
	}
	return nil
}

// baseLimits is every rule's own values, the class of requests on no plan.
func (c *compiler) baseLimits() []limits {
	out := make([]limits, len(c.rules))
	for i, r := range c.rules {
		out[i] = r.base
		out[i].Shadow = r.shadow
		out[i].Unlimited = r.unlimited
	}
	return out
}

// className checks a plan's or an override's name: it becomes part of the name of a
// plan in the metadata ("pro", "pro.acme"), so it has no dot.
func (c *compiler) className(path, name string) error {
	if !plainKey(name) || len(name) > 31 {
		return c.fail(path, "a name must be 1 to 31 bytes of [A-Za-z0-9_-]")
	}
	return nil
}

// plans compiles each plan into a class: every rule's values on that plan.
func (c *compiler) plans(plans map[string]map[string]limitSpec) error {
	for _, name := range sortedKeys(plans) {
		path := join("plans", name)
		if err := c.className(path, name); err != nil {
			return err
		}
		ls, err := c.apply(path, c.p.classes[0].limits, plans[name])
		if err != nil {
			return err
		}
		c.p.classes = append(c.p.classes, class{name: name, limits: ls})
	}
	return nil
}

// apply returns base with each rule's entry of entries applied, validated.
func (c *compiler) apply(path string, base []limits, entries map[string]limitSpec) ([]limits, error) {
	out := slices.Clone(base)
	for _, rname := range sortedKeys(entries) {
		i, ok := c.index[rname]
		if !ok {
			return nil, c.fail(join(path, rname), "unknown rule %q", rname)
		}
		l, err := c.limits(join(path, rname), &c.rules[i], out[i], entries[rname])
		if err != nil {
			return nil, err
		}
		out[i] = l
	}
	return out, nil
}

// classIndex returns the index of the plan named name, or fails at path.
func (c *compiler) classIndex(path, name string) (int, error) {
	for i, cl := range c.p.classes[1:] {
		if cl.name == name {
			return i + 1, nil
		}
	}
	var names []string
	for _, cl := range c.p.classes[1:] {
		names = append(names, cl.name)
	}
	if names == nil {
		return 0, c.fail(path, "unknown plan %q: the file has no plans", name)
	}
	return 0, c.fail(path, "unknown plan %q (plans: %s)", name, strings.Join(names, ", "))
}

// tenants compiles how a request's tenant is found and which plan each tenant is on.
func (c *compiler) tenants(t *tenantSpec) error {
	if t == nil {
		return nil
	}
	if !token(t.Header) {
		return c.fail("tenants.header", "is required: the header that names the tenant, such as X-API-Key")
	}
	c.p.tenantHeader = http.CanonicalHeaderKey(t.Header)
	if t.Default != "" {
		i, err := c.classIndex("tenants.default", t.Default)
		if err != nil {
			return err
		}
		c.p.defaultClass = i
	}
	c.p.tenantOf = make(map[string]int, len(t.Keys))
	for _, key := range sortedKeys(t.Keys) {
		path := join("tenants.keys", key)
		if key == "" {
			return c.fail(path, "a tenant's key must not be empty")
		}
		i, err := c.classIndex(path, t.Keys[key])
		if err != nil {
			return err
		}
		c.p.tenantOf[key] = i
	}
	return nil
}

// overrides compiles each override into a class of its own, named after its tenant's
// plan and its own name ("pro.acme"), so that the tenant's key never shows.
func (c *compiler) overrides(overrides map[string]overrideSpec) error {
	if len(overrides) > 0 && c.p.tenantHeader == "" {
		return c.fail("overrides", "needs tenants: which header names a tenant")
	}
	keys := map[string]string{} // tenant key -> override name
	for _, name := range sortedKeys(overrides) {
		o, path := overrides[name], join("overrides", name)
		if err := c.className(path, name); err != nil {
			return err
		}
		if o.Key == "" {
			return c.fail(path+".key", "is required: the tenant's key")
		}
		if other, dup := keys[o.Key]; dup {
			return c.fail(path+".key", "is the key of override %q too", other)
		}
		keys[o.Key] = name
		plan, listed := c.p.tenantOf[o.Key]
		if !listed {
			plan = c.p.defaultClass
		}
		if base := c.p.classes[plan]; base.name != "" {
			name = base.name + "." + name
		}
		ls, err := c.apply(path+".rules", c.p.classes[plan].limits, o.Rules)
		if err != nil {
			return err
		}
		c.p.tenantOf[o.Key] = len(c.p.classes)
		c.p.classes = append(c.p.classes, class{name: name, limits: ls})
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
