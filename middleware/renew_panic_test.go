package middleware_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/limitertest"
	"github.com/ratebudget/ratebudget/middleware"
)

// panicRenewer is a Settler whose Renew, once armed is closed, panics (a bug in a
// go-redis hook, which the lua limiter's Renew runs), or with fail set returns an error
// (whose observer then panics). renewed is closed after the first armed Renew.
type panicRenewer struct {
	limitertest.Settler
	armed   chan struct{}
	fail    bool
	once    sync.Once
	renewed chan struct{}
}

var errRenewBug = errors.New("renewal bug")

func (p *panicRenewer) Renew(ctx context.Context, checks []ratebudget.Check, tickets []ratebudget.Ticket) error {
	select {
	case <-p.armed:
	default:
		return p.Settler.Renew(ctx, checks, tickets)
	}
	defer p.once.Do(func() { close(p.renewed) })
	if p.fail {
		return &ratebudget.StoreError{Class: ratebudget.ClassOther, Err: errRenewBug}
	}
	panic(errRenewBug)
}

// A panic during a lease renewal (a client hook's bug, or an observer of a failed
// renewal) runs on the renewal's timer goroutine, where nothing recovers it: it must
// not take the process down, as the same panic in the decision would not (http.Server
// recovers the request's). The renewal stops, one line is logged, and the handler's
// return still releases the lease. Not parallel: it replaces slog's default logger.
func TestRenewalPanicKeepsTheProcess(t *testing.T) {
	var logged syncBuilder
	old := slog.Default()
	t.Cleanup(func() { slog.SetDefault(old) })
	slog.SetDefault(slog.New(slog.NewTextHandler(&logged, nil)))
	for _, tc := range []struct {
		name string
		fail bool // Renew fails, and the observer panics
	}{{"Renew", false}, {"observer", true}} {
		t.Run(tc.name, func(t *testing.T) {
			logged.Reset()
			p := &panicRenewer{Settler: newMemory(t, newClock()), armed: make(chan struct{}), fail: tc.fail, renewed: make(chan struct{})}
			slots := ratebudget.Rule{Name: "slots", Algorithm: ratebudget.InFlight, Limit: 1, Window: 10 * time.Millisecond}
			var opts []middleware.Option
			if tc.fail {
				opts = append(opts, middleware.WithObserver(func(ev middleware.Event) {
					if ev.Result == middleware.SettleFailed {
						panic(errRenewBug)
					}
				}))
			}
			h := mustNew(t, p, []middleware.Rule{{Rule: slots, Identity: global}}, opts...)(
				http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if r.URL.Path == "/long" {
						close(p.armed)
						<-p.renewed // the renewal has panicked (or reported its failure)
					}
					w.WriteHeader(http.StatusOK)
				}))
			if c := do(h, "GET", "/long", nil).Code; c != http.StatusOK {
				t.Fatalf("the request whose renewal panicked answered %d, want 200", c)
			}
			if c := do(h, "GET", "/quick", nil).Code; c != http.StatusOK {
				t.Fatalf("after it returned: %d, want 200 (its lease released)", c)
			}
			if s := logged.String(); !strings.Contains(s, "renewal bug") || !strings.Contains(s, "level=ERROR") {
				t.Errorf("log: %q, want an error line naming the panic", s)
			}
		})
	}
}

// syncBuilder is a strings.Builder safe for the concurrent writes of a logger.
type syncBuilder struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuilder) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuilder) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func (s *syncBuilder) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.b.Reset()
}
