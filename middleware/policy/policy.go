package policy

import (
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/ratebudget/ratebudget"
)

// Policy is a parsed and validated policy file: its rules, plans, tenants and
// overrides. It is immutable: a changed file is a new Policy (see [Watch]). Its methods
// are safe for concurrent use.
type Policy struct {
	file   string // the name it was parsed under, for log lines
	source []byte
	rules  []rule
	// classes are the sets of values a request can be decided under: 0 the rules' own,
	// then one per plan, then one per override.
	classes      []class
	tenantHeader string         // canonical header name; "" when the file has no tenants
	tenantOf     map[string]int // a tenant's key -> its class
	defaultClass int            // the class of a request whose tenant is not listed
	// clientIP is identity ip's key function, built from the file's client_ip section.
	clientIP func(*http.Request) (string, error)
}

// rule is a compiled rule of the file.
type rule struct {
	name      string
	algorithm ratebudget.Algorithm
	period    ratebudget.Period // a Calendar rule's
	zone      *time.Location    // a Calendar rule's
	weekStart time.Weekday
	base      limits // the time rule's own values
	identity  string
	scope     string
	counts    countSpec
	shadow    bool
	unlimited bool
	match     matcher
	// replacedBy lists the rules that replace this one: when one of them matches a
	// request, this rule does not apply to it.
	replacedBy []int
}

// limits are a rule's values under one class.
type limits struct {
	Limit     int64
	Window    time.Duration
	Burst     int64
	Shadow    bool
	Unlimited bool
}

// class is one plan, or one tenant's override, with every rule's values under it.
type class struct {
	name   string // "" for the rules' own values
	limits []limits
}

// matcher is a rule's match: every condition set must hold.
type matcher struct {
	method     string
	path       string
	pathPrefix bool
	headers    []headerMatch
	ips        []netip.Prefix
	// addr gives the client's whole address for ips: the policy's client_ip section
	// read as identity ip reads it, ungrouped.
	addr func(*http.Request) (string, error)
}

type headerMatch struct {
	name   string // canonical
	value  string
	prefix bool
}

// Source returns the content the policy was parsed from. The caller must not modify it.
func (p *Policy) Source() []byte { return p.source }

func (m *matcher) matches(r *http.Request) bool {
	if m.method != "" && r.Method != m.method && (m.method != http.MethodGet || r.Method != http.MethodHead) {
		return false // GET matches HEAD too, as a ServeMux pattern and chi's GetHead do
	}
	if m.pathPrefix {
		if !strings.HasPrefix(r.URL.Path, m.path) {
			return false
		}
	} else if m.path != "" && r.URL.Path != m.path {
		return false
	}
	for _, h := range m.headers {
		vv := r.Header[h.name]
		if len(vv) == 0 {
			return false // "*" too asks for the header to be there
		}
		if h.prefix && !strings.HasPrefix(vv[0], h.value) || !h.prefix && vv[0] != h.value {
			return false
		}
	}
	if len(m.ips) > 0 {
		// A client whose address cannot be known (a unix-socket peer, an "unknown" hop, a malformed
		// forwarding header) is in no range.
		a, err := m.addr(r)
		if err != nil {
			return false
		}
		ip, err := netip.ParseAddr(a)
		if err != nil {
			return false
		}
		for _, p := range m.ips {
			if p.Contains(ip) {
				return true
			}
		}
		return false
	}
	return true
}

// applies reports whether rule i applies to r: its match holds and no rule that
// replaces it matches.
func (p *Policy) applies(i int, r *http.Request) bool {
	ru := &p.rules[i]
	if !ru.match.matches(r) {
		return false
	}
	for _, j := range ru.replacedBy {
		if p.rules[j].match.matches(r) {
			return false
		}
	}
	return true
}

// classOf returns the class r is decided under: its tenant's override or plan, the
// default plan for a tenant not listed, the rules' own values without tenants.
func (p *Policy) classOf(r *http.Request) *class {
	if p.tenantHeader == "" {
		return &p.classes[0]
	}
	if vv := r.Header[p.tenantHeader]; len(vv) > 0 {
		if c, ok := p.tenantOf[strings.TrimSpace(vv[0])]; ok {
			return &p.classes[c]
		}
	}
	return &p.classes[p.defaultClass]
}

// applied is one rule as it applies to a request.
type applied struct {
	rule string
	plan string
	limits
}

// resolve appends to dst the rules that apply to r, in the file's order, with the values
// r is decided under. It allocates nothing when dst has room.
func (p *Policy) resolve(r *http.Request, dst []applied) []applied {
	c := p.classOf(r)
	for i := range p.rules {
		if p.applies(i, r) {
			dst = append(dst, applied{rule: p.rules[i].name, plan: c.name, limits: c.limits[i]})
		}
	}
	return dst
}

// timeRule is the rule's time rule under the values l.
func (ru *rule) timeRule(l limits) ratebudget.Rule {
	r := ratebudget.Rule{Name: ru.name, Algorithm: ru.algorithm, Limit: l.Limit, Window: l.Window, Burst: l.Burst}
	if ru.algorithm == ratebudget.Calendar {
		r.Period, r.Location, r.WeekStart = ru.period, ru.zone, ru.weekStart
	}
	return r
}
