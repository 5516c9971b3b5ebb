package middleware_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/bound"
	"github.com/ratebudget/ratebudget/internal/budgetkey"
	"github.com/ratebudget/ratebudget/internal/limitertest"
	"github.com/ratebudget/ratebudget/internal/redistest"
	"github.com/ratebudget/ratebudget/lua"
	"github.com/ratebudget/ratebudget/middleware"
)

// stressInFlight sends many concurrent requests through an InFlight rule of limit 3 on
// lim, with a CountActual rule beside it: some handlers panic, some observers panic,
// some requests arrive canceled and some are canceled while their handler runs. At no
// moment do more than 3 handlers run, and once every request has returned every lease
// has been released: the limit is free again. left reports the slots free.
func stressInFlight(t *testing.T, lim ratebudget.Limiter, left func() int64) {
	const limit, workers, each = 3, 8, 60
	conc := ratebudget.Rule{Name: "conc", Algorithm: ratebudget.InFlight, Limit: limit, Window: time.Hour}
	work := ratebudget.Rule{Name: "work", Limit: bound.MaxLimit, Window: time.Hour}
	var running, most atomic.Int64
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := running.Add(1)
		defer running.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		if r.Header.Get("X-Cancel") != "" {
			r.Context().Value(cancelKey{}).(context.CancelFunc)()
		}
		if r.Header.Get("X-Panic") == "handler" {
			panic(http.ErrAbortHandler)
		}
		w.WriteHeader(http.StatusOK)
	})
	units := middleware.CountActual(2, func(r *http.Request, status int, _ http.Header) int64 {
		if r.Header.Get("X-Panic") == "actual" {
			panic(errCallback)
		}
		return 1
	})
	h := mustNew(t, lim, []middleware.Rule{
		{Rule: conc, Identity: global},
		{Rule: work, Identity: global, Counts: units},
	}, middleware.WithTimeout(time.Minute), middleware.WithObserver(func(ev middleware.Event) {
		if ev.Result == middleware.Allowed && ev.Request.Header.Get("X-Panic") == "observer" {
			panic(errCallback)
		}
	}))(handler)
	var codes sync.Map
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				ctx, cancel := context.WithCancel(context.Background())
				req := httptest.NewRequest("GET", "/", nil)
				switch (w + i) % 6 {
				case 1:
					req.Header.Set("X-Panic", "handler")
				case 2:
					req.Header.Set("X-Panic", "observer")
				case 3:
					req.Header.Set("X-Panic", "actual")
				case 4:
					cancel() // canceled before the decision: nothing spent
				case 5:
					// Canceled while the handler runs (the client went away).
					req.Header.Set("X-Cancel", "1")
					ctx = context.WithValue(ctx, cancelKey{}, cancel)
				}
				req = req.WithContext(ctx)
				rec := httptest.NewRecorder()
				func() {
					defer func() { _ = recover() }()
					h.ServeHTTP(rec, req)
				}()
				cancel()
				n, _ := codes.LoadOrStore(rec.Code, new(atomic.Int64))
				n.(*atomic.Int64).Add(1)
			}
		})
	}
	wg.Wait()
	if m := most.Load(); m > limit {
		t.Errorf("%d handlers ran at once, limit %d", m, limit)
	}
	var summary []string
	codes.Range(func(k, v any) bool {
		summary = append(summary, strconv.Itoa(k.(int))+":"+strconv.FormatInt(v.(*atomic.Int64).Load(), 10))
		return true
	})
	if n := left(); n != limit {
		t.Fatalf("after every request returned: %d of %d slots free (codes %v); want every lease released", n, limit, summary)
	}
}

type cancelKey struct{}

func TestStressInFlightLeasesMemory(t *testing.T) {
	t.Parallel()
	lim := newMemory(t, newClock()) // leases never expire: a leak stays visible
	conc := ratebudget.Rule{Name: "conc", Algorithm: ratebudget.InFlight, Limit: 3, Window: time.Hour}
	stressInFlight(t, lim, func() int64 {
		return freeSlots(t, lim, conc)
	})
}

func TestStressInFlightLeasesRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	client := srv.Client(t)
	lim, err := lua.New(client, lua.WithPrefix("stress"), lua.WithCoalescing(16))
	if err != nil {
		t.Fatal(err)
	}
	conc := ratebudget.Rule{Name: "conc", Algorithm: ratebudget.InFlight, Limit: 3, Window: time.Hour}
	key := budgetkey.New("stress", nil).Key(ratebudget.Check{Rule: conc, Identity: globalID, Cost: 1})
	stressInFlight(t, lim, func() int64 {
		n, err := client.ZCard(context.Background(), key).Result()
		if err != nil {
			t.Fatal(err)
		}
		return 3 - n
	})
}

// freeSlots reports how many of r's slots are free for the global identity, holding
// none of them afterwards.
func freeSlots(t *testing.T, lim limitertest.Settler, r ratebudget.Rule) int64 {
	t.Helper()
	checks := []ratebudget.Check{{Rule: r, Identity: globalID, Cost: 1}}
	var held [][]ratebudget.Ticket
	for range r.Limit + 1 {
		tk := make([]ratebudget.Ticket, 1)
		d, err := lim.Reserve(context.Background(), checks, tk, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !d.Allowed {
			break
		}
		held = append(held, tk)
	}
	for _, tk := range held {
		if err := lim.Settle(context.Background(), checks, tk, nil); err != nil {
			t.Fatal(err)
		}
	}
	return int64(len(held))
}
