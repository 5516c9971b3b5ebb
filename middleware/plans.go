package middleware

import (
	"log/slog"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/timerule"
)

// Plan is a set of values a rule decides a request under instead of its own, for the
// requests on that plan (a tenant's tier, looked up by [Rule.Plan]). A Plan is a value;
// the middleware copies the rule's plans at [New], so changing one afterwards changes
// nothing. The zero Plan is invalid (it has no Name). Each plan is compiled at New into
// a rule of its own values, so that a request on it costs a scan of at most 8 names (a
// map lookup above) and allocates nothing.
//
// A plan changes what the budget admits, never which budget it is: the budget's key is
// the rule's name, identity and scope, without the plan or the limit, so a tenant that
// moves to another plan keeps what it has spent, and its open window, bucket, events or
// leases are decided under the new plan's values from then on (docs/RULE-CHANGES.md,
// "Plans").
type Plan struct {
	// Name names the plan: 1 to 64 bytes of [A-Za-z0-9_.-], unique among the rule's
	// plans. It is what Rule.Plan returns for a request on the plan, and it is sent in
	// the RateLimit-Policy field (parameter ratebudget-plan) and in the refusal's body
	// (member plan).
	Name string
	// Limit replaces the rule's Limit (see ratebudget.Rule): cost units per Window, or
	// leases held at once for an InFlight rule. Required unless Unlimited.
	Limit int64
	// Window replaces the rule's Window; zero keeps the rule's.
	Window time.Duration
	// Burst replaces the rule's Burst: a TokenBucket's capacity, zero meaning Limit
	// (also when the rule's own Burst is not zero). Other time rules require zero.
	Burst int64
	// Shadow puts the rule in shadow mode for requests on the plan (see Rule.Shadow): its
	// budget is spent and observed, never enforced. A rule in shadow mode stays so on
	// every plan.
	Shadow bool
	// Unlimited leaves the rule out of the decision for requests on the plan: no check,
	// no store call, no metadata from it, nothing spent. An Unlimited plan sets no other
	// field than Name.
	Unlimited bool
}

// maxLinearPlans is the number of plans up to which a rule finds a request's plan by a
// scan of their names; above it, by a map.
const maxLinearPlans = 8

// plans is what a rule with plans resolves a request's plan with.
type plans struct {
	of       func(*http.Request) (string, error) // Rule.Plan
	names    []string                            // the plans' names, in order
	variants []compiledRule                      // variants[i] is the rule on plan names[i]
	index    map[string]int                      // name to index, when there are more than maxLinearPlans
	// warned is set once a request on a plan the rule does not know has been logged.
	warned atomic.Bool
}

// compilePlans validates the plans of r, whose compiled rule cr is otherwise complete,
// and gives cr its variant for each. replicas is the local fallback's share (0 without
// one).
func (cr *compiledRule) compilePlans(r *Rule, replicas int) error {
	if len(r.Plans) == 0 {
		if r.Plan != nil {
			return &ratebudget.ConfigError{Rule: r.Name, Field: "Plan", Problem: "is set but the rule has no Plans"}
		}
		return nil
	}
	if r.Plan == nil {
		return &ratebudget.ConfigError{Rule: r.Name, Field: "Plan", Problem: "must not be nil for a rule with Plans (it gives a request's plan)"}
	}
	ps := &plans{of: r.Plan, names: make([]string, len(r.Plans)), variants: make([]compiledRule, len(r.Plans))}
	seen := make(map[string]int, len(r.Plans))
	for i, p := range r.Plans {
		field := "Plans[" + strconv.Itoa(i) + "]"
		if err := planName(r.Name, field, p.Name); err != nil {
			return err
		}
		if j, dup := seen[p.Name]; dup {
			return &ratebudget.ConfigError{Rule: r.Name, Field: field + ".Name", Problem: strconv.Quote(p.Name) + " is also the name of Plans[" + strconv.Itoa(j) + "]"}
		}
		seen[p.Name] = i
		v, err := cr.variant(r.Name, field, p, replicas)
		if err != nil {
			return err
		}
		ps.names[i], ps.variants[i] = p.Name, v
	}
	if len(r.Plans) > maxLinearPlans {
		ps.index = seen
	}
	cr.plans = ps
	return nil
}

// variant returns cr under plan p, the rule's plan named field.
func (cr *compiledRule) variant(rule, field string, p Plan, replicas int) (compiledRule, error) {
	v := *cr
	v.plans, v.plan = nil, p.Name
	if p.Unlimited {
		if p.Limit != 0 || p.Window != 0 || p.Burst != 0 || p.Shadow {
			return v, &ratebudget.ConfigError{Rule: rule, Field: field + ".Unlimited", Problem: "leaves Limit, Window, Burst and Shadow without effect; set them to zero"}
		}
		v.unlimited = true
		return v, nil
	}
	v.rule.Limit, v.rule.Burst = p.Limit, p.Burst
	if p.Window != 0 {
		v.rule.Window = p.Window
	}
	if err := v.rule.Validate(); err != nil {
		if ce, ok := err.(*ratebudget.ConfigError); ok {
			return v, &ratebudget.ConfigError{Rule: rule, Field: field + "." + ce.Field, Problem: ce.Problem}
		}
		return v, err
	}
	v.limit = timerule.Capacity(&v.rule)
	v.limitText = strconv.FormatInt(v.limit, 10)
	v.shadow = cr.shadow || p.Shadow
	if err := v.compileCounts(); err != nil {
		if ce, ok := err.(*ratebudget.ConfigError); ok {
			return v, &ratebudget.ConfigError{Rule: rule, Field: field + ".Limit", Problem: "does not fit the rule's Counts: " + ce.Problem}
		}
		return v, err
	}
	if replicas > 0 {
		v.local = localRule(v.rule, replicas)
	}
	return v, nil
}

// planName checks a plan's name as a rule's name is checked (1 to 64 bytes of
// [A-Za-z0-9_.-]), by ratebudget.Rule.Validate, reporting it as field's Name.
func planName(rule, field, name string) error {
	err := ratebudget.Rule{Name: name, Limit: 1, Window: time.Millisecond}.Validate()
	if ce, ok := err.(*ratebudget.ConfigError); ok {
		return &ratebudget.ConfigError{Rule: rule, Field: field + ".Name", Problem: ce.Problem}
	}
	return err
}

// resolve returns the rule r is decided under: cr's variant for r's plan, or cr itself
// for the plan "" and for a plan cr does not know (logged once per rule). cr has plans.
func (cr *compiledRule) resolve(r *http.Request) (*compiledRule, *InputError) {
	ps := cr.plans
	name, err := ps.of(r)
	if err != nil {
		return nil, inputError(partPlan, cr.rule.Name, err, "plan could not be determined")
	}
	if name == "" {
		return cr, nil
	}
	if ps.index != nil {
		if i, ok := ps.index[name]; ok {
			return &ps.variants[i], nil
		}
	} else {
		for i := range ps.names {
			if ps.names[i] == name {
				return &ps.variants[i], nil
			}
		}
	}
	if ps.warned.CompareAndSwap(false, true) {
		slog.Default().LogAttrs(r.Context(), slog.LevelWarn, "ratebudget: a request is on a plan the rule does not know; "+
			"it is decided under the rule's own values (logged once per rule)",
			slog.String("rule", cr.rule.Name), slog.String("plan", name))
	}
	return cr, nil
}
