package middleware

import (
	"errors"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/headers"
	"github.com/ratebudget/ratebudget/internal/algname"
	"github.com/ratebudget/ratebudget/internal/keyreason"
	"github.com/ratebudget/ratebudget/internal/meta"
	"github.com/ratebudget/ratebudget/internal/problem"
)

// InputError is the error given to the error handler ([WithErrorHandler]) and to
// observers (Event.Err, Invalid) for a request whose identity, scope, plan or cost
// could not be determined. Nothing is counted for such a request, by any layer.
//
// A key, plan or cost function that knows why a request cannot be counted returns one
// to have the reason shown to the client: &InputError{Reason: "cost must be a positive
// integer", Err: err}, leaving Part and Rule empty. The middleware answers with an
// InputError of its own that names the part and rule it was computing, takes that
// Reason (from anywhere in the function's error chain) and wraps the function's error
// as Err: the 400 says "rate-limit cost: cost must be a positive integer". An error
// of any other type gets a generic reason, because its text may hold internal details.
type InputError struct {
	// Part is what failed: "identity", "scope", "plan" (Rule.Plan) or "cost"; empty in
	// an InputError a function returns.
	Part string
	// Rule is the rule whose key function failed; empty for the cost, and in an
	// InputError a function returns.
	Rule string
	// Reason is a short, client-facing explanation ("header X-Api-Key is missing or
	// empty", "cost must be a positive integer") without request data that could be
	// reflected at other users (quote no header values). In the middleware's InputError
	// it is the Reason of an InputError the function returned, a fixed text for
	// package keyfuncs's errors, or a generic text for the part ("cost could not be
	// determined").
	Reason string
	// Err is the underlying error, for logs: in the middleware's InputError the key or
	// cost function's error, nil for a cost below 1. It may be nil.
	Err error
}

// Error names the rule and the part when set, and the reason, then the underlying
// error, which may hold internal details (log it, do not send it).
func (e *InputError) Error() string {
	s := "ratebudget: "
	if e.Rule != "" {
		s += "rule " + e.Rule + ": "
	}
	if e.Part != "" {
		s += e.Part + ": "
	}
	s += e.Reason
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap returns Err.
func (e *InputError) Unwrap() error { return e.Err }

// The parts of an [InputError].
const (
	partIdentity = "identity"
	partScope    = "scope"
	partCost     = "cost"
	partPlan     = "plan"
)

// inputError is the InputError for err, the error of the function that computes part
// for rule: its reason is the Reason of an InputError in err's chain, the text
// keyreason gives for package keyfuncs's errors, or generic.
func inputError(part, rule string, err error, generic string) *InputError {
	var ie *InputError
	if errors.As(err, &ie) && ie.Reason != "" {
		return &InputError{Part: part, Rule: rule, Reason: ie.Reason, Err: err}
	}
	reason, ok := keyreason.Of(err)
	if !ok {
		reason = generic
	}
	return &InputError{Part: part, Rule: rule, Reason: reason, Err: err}
}

func (m *mw) invalid(w http.ResponseWriter, r *http.Request, st *stack, err *InputError) {
	ev := Event{Request: r, Result: Invalid, Err: err}
	observeOuter(st, m, &ev)
	mount, built := errors.Is(err, keyreason.ErrNoRoutePattern), isConfigError(err)
	// Not the client's fault: the limiter is mounted where no route is known, or a key
	// function was built wrong (keyfuncs.Header without a name, Join of nothing). Logged
	// also when a custom error handler answers: it answers the client, not the operator.
	switch {
	case mount && m.warnedMount.CompareAndSwap(false, true):
		slog.Default().LogAttrs(r.Context(), slog.LevelError, "ratebudget: a rule's route scope found no route pattern; "+
			"mount the middleware where the route is known: on a chi router (r.Use, r.With, r.Group) or on the handler given to http.ServeMux.Handle, not around a ServeMux",
			slog.String("rule", err.Rule), slog.String("path", r.URL.Path))
	case built && m.warnedKey.CompareAndSwap(false, true):
		slog.Default().LogAttrs(r.Context(), slog.LevelError, "ratebudget: a rule's key function was built wrong, so the route answers 500",
			slog.String("rule", err.Rule), slog.String("part", err.Part), slog.String("error", err.Err.Error()))
	}
	if m.cfg.onError != nil {
		m.cfg.onError(w, r, err)
		return
	}
	if mount || built {
		writeMisconfigured(w, r)
		return
	}
	meta.WriteInvalid(w, r, err.Part, err.Reason)
}

// exceeded answers a request whose cost exceeds the capacity of cr, one of m's rules
// (or a plan's variant of one): 413, decided without the limiter. No budget metadata is
// sent: the store was not asked, so nothing is known of what remains. st.checks holds
// the outer layers' checks only; index is cr's check's index in the decision, as the
// limiter's decisions count checks.
func (m *mw) exceeded(w http.ResponseWriter, r *http.Request, st *stack, cost int64, cr *compiledRule, index int) {
	d := ratebudget.Decision{Outcome: ratebudget.Outcome{Exceeded: true}, Rule: cr.rule.Name, Index: index, Limit: cr.limit}
	observeOuter(st, m, &Event{Request: r, Result: Exceeded, Decision: d})
	if m.cfg.onRefusal != nil {
		presetRefusal(w.Header(), &d)
		m.cfg.onRefusal(w, r, d)
		return
	}
	meta.WriteCostExceeded(w, r, headers.None, []meta.Info{{Policy: d.Rule, Limit: d.Limit, Window: cr.rule.Window, Plan: cr.plan}}, 0, cost)
}

// checksBefore is the index in the decision of the check of m's rule i, a rule without
// plans, when every rule before it has none either: st's checks, then m's enforced
// rules before i.
func (m *mw) checksBefore(st *stack, i int) int {
	index := len(st.checks)
	for j := range i {
		if !m.rules[j].shadow {
			index++
		}
	}
	return index
}

// misconfigured answers 500 for a limiter that rejected the request's checks: a
// configuration mistake, not the client's and not the store's. Every layer of st sees
// the event, and the first such answer of m logs the error: the response never says
// what is wrong.
func (m *mw) misconfigured(w http.ResponseWriter, r *http.Request, st *stack, err error) {
	observeAll(st, &Event{Request: r, Result: Invalid, Err: err})
	if m.warnedConfig.CompareAndSwap(false, true) {
		slog.Default().LogAttrs(r.Context(), slog.LevelError, "ratebudget: the limiter rejected a request's rate-limit checks as invalid, "+
			"so the route answers 500",
			slog.String("error", err.Error()), slog.String("path", r.URL.Path))
	}
	writeMisconfigured(w, r)
}

// conflict answers 500 for a request through stacked layers that define one rule name
// on one limiter two ways, outer in an earlier layer and cr in m: a configuration
// mistake found only when a request stacks them, and found before anything is spent.
// Every layer of st, and m, see the event (its Err a *ratebudget.ConfigError naming the
// first field that differs), and the first such answer of m logs both definitions.
func (m *mw) conflict(w http.ResponseWriter, r *http.Request, st *stack, outer, cr *compiledRule) {
	field, a, b := differs(outer, cr)
	err := &ratebudget.ConfigError{Rule: cr.rule.Name, Field: field,
		Problem: "is " + a + " in an outer layer and " + b + " in an inner one; stacked layers on one limiter may share a rule name only with one definition"}
	observeOuter(st, m, &Event{Request: r, Result: Invalid, Err: err})
	if m.warnedConflict.CompareAndSwap(false, true) {
		slog.Default().LogAttrs(r.Context(), slog.LevelError, "ratebudget: stacked layers define one rate-limit rule name differently on one limiter, "+
			"so the route answers 500 before anything is spent; define it alike in every layer (one budget) or give each definition its own name",
			slog.String("rule", cr.rule.Name), slog.String("outer", definition(outer)), slog.String("inner", definition(cr)),
			slog.String("path", r.URL.Path))
	}
	writeMisconfigured(w, r)
}

// differs returns the first field in which a and b, rules of one name, differ, with its
// value in each.
func differs(a, b *compiledRule) (field, av, bv string) {
	switch x, y := &a.rule, &b.rule; {
	case x.Algorithm != y.Algorithm:
		return "Algorithm", algname.Of(x.Algorithm), algname.Of(y.Algorithm)
	case x.Limit != y.Limit:
		return "Limit", strconv.FormatInt(x.Limit, 10), strconv.FormatInt(y.Limit, 10)
	case x.Window != y.Window:
		return "Window", x.Window.String(), y.Window.String()
	case x.Burst != y.Burst:
		return "Burst", strconv.FormatInt(x.Burst, 10), strconv.FormatInt(y.Burst, 10)
	}
	return "Counts", a.counts.kind.String(), b.counts.kind.String()
}

// definition describes the budget cr defines, for a log line.
func definition(cr *compiledRule) string {
	return "Algorithm " + algname.Of(cr.rule.Algorithm) + ", Limit " + strconv.FormatInt(cr.rule.Limit, 10) + ", Window " + cr.rule.Window.String() +
		", Burst " + strconv.FormatInt(cr.rule.Burst, 10) + ", Counts " + cr.counts.kind.String()
}

// writeMisconfigured answers 500 for a mistake of the server's configuration, without
// saying which: the log says it.
func writeMisconfigured(w http.ResponseWriter, r *http.Request) {
	problem.Write(w, r, problem.Problem{
		Type:   problem.Blank,
		Title:  "Internal Server Error",
		Status: http.StatusInternalServerError,
		Detail: "the rate limit of this route is misconfigured",
	})
}
