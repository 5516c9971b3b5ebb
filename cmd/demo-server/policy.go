package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/middleware"
	"github.com/ratebudget/ratebudget/middleware/policy"
)

// policyState is the demo's policy file (-policy): the Watcher that keeps it current,
// the policy in effect with when it was loaded, and the count of its reloads.
type policyState struct {
	path    string
	w       *policy.Watcher
	shown   atomic.Pointer[loadedPolicy] // what GET / shows
	reloads *prometheus.CounterVec
	close   func()
}

// loadedPolicy is a policy that took effect and when.
type loadedPolicy struct {
	p  *policy.Policy
	at time.Time
}

// reloadedKey is the key of a context value, a chan<- error, that receives the result of
// each reload of the policy file (tests).
type reloadedKey struct{}

// watchPolicy loads the policy file at path and keeps it current until ctx ends or close
// is called: it is read again when it changes and on SIGHUP. A reload is logged and
// counted in ratebudget_policy_reloads_total{result="ok"|"error"}; a failed one keeps
// the policy in effect.
func watchPolicy(ctx context.Context, path string, log *slog.Logger) (*policyState, error) {
	reloads := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ratebudget_policy_reloads_total",
		Help: "Reloads of the -policy file: ok (in effect), error (refused; the policy before it stays in effect).",
	}, []string{"result"})
	reloaded, _ := ctx.Value(reloadedKey{}).(chan<- error)
	pol := &policyState{path: path, reloads: reloads}
	w, err := policy.Watch(path, func(p *policy.Policy, err error) {
		if err != nil {
			reloads.WithLabelValues("error").Inc()
			log.Error("policy reload failed; the policy before it stays in effect", "file", path, "err", err)
		} else {
			pol.shown.Store(&loadedPolicy{p: p, at: time.Now()})
			reloads.WithLabelValues("ok").Inc()
			log.Info("policy reloaded", "file", path)
		}
		if reloaded != nil {
			reloaded <- err
		}
	})
	if err != nil {
		return nil, fmt.Errorf("-policy: %w", err)
	}
	pol.w = w
	// The first load; a reload reported before this line already stored a newer one.
	pol.shown.CompareAndSwap(nil, &loadedPolicy{p: w.Policy(), at: time.Now()})
	reloads.WithLabelValues("ok")
	reloads.WithLabelValues("error")
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-hup:
				_ = w.Reload() // logged and counted by the callback
			case <-stop:
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	pol.close = func() {
		signal.Stop(hup)
		close(stop)
		<-done
		w.Close()
	}
	return pol, nil
}

// flagLimitsOff reports whether the routes go without the limits of the flags: under
// -no-limit, and under -policy, whose rules limit /api instead.
func flagLimitsOff(o options, pol *policyState) bool { return o.noLimit || pol != nil }

// middleware returns the policy's middleware over lim, with opts, and registers the
// reload count in reg; without -policy (pol nil), middleware that limits nothing.
func (pol *policyState) middleware(lim ratebudget.Limiter, reg *prometheus.Registry, opts []middleware.Option) (func(http.Handler) http.Handler, error) {
	if pol == nil {
		return func(next http.Handler) http.Handler { return next }, nil
	}
	reg.MustRegister(pol.reloads)
	mw, err := pol.w.Middleware(lim, opts...)
	if err != nil {
		return nil, fmt.Errorf("-policy: %w", err)
	}
	return mw, nil
}

// guide answers GET /: under -policy, the routes and the policy in effect with when it
// was loaded; otherwise the guide of the flags' limits.
func (pol *policyState) guide(o options) http.HandlerFunc {
	if pol == nil {
		return guide(o)
	}
	return func(rw http.ResponseWriter, _ *http.Request) {
		shown := pol.shown.Load()
		var b strings.Builder
		fmt.Fprintf(&b, "ratebudget demo under the policy file %s, loaded %s\n\n", pol.path, shown.at.UTC().Format(time.RFC3339))
		b.WriteString("Routes: GET /api/hello, GET /api/accounts/{id}/report, POST /api/jobs?cost=N,\n" +
			"GET /api/slow?ms=N, GET /api/flaky?status=S, GET /api/download?bytes=N: each limited by\n" +
			"the rules below that match it. GET /healthz and GET /metrics are never limited.\n" +
			"The file is read again when it changes and on SIGHUP.\n\n")
		b.WriteString("The policy in effect:\n\n")
		b.Write(shown.p.Source())
		rw.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(rw, b.String())
	}
}
