package delivery_test

import (
	"context"
	"net/http/httptest"
	"testing"

	"github.com/ratebudget/ratebudget/internal/delivery"
)

type ctxKey struct{}

// Each taker takes each delivery once; an unmarked request's events are always taken.
func TestFirst(t *testing.T) {
	a, b := new(int), new(int)
	plain := httptest.NewRequest("GET", "/", nil)
	for range 2 {
		if !delivery.First(plain, a) || !delivery.First(nil, a) {
			t.Fatal("an unmarked event was not taken")
		}
	}
	r, mark := delivery.Request(plain)
	if r == plain || r.URL != plain.URL {
		t.Fatal("Request did not return a shallow copy")
	}
	for n := range 3 {
		mark.Next()
		for _, taker := range []*int{a, b, new(int)} {
			if !delivery.First(r, taker) {
				t.Fatalf("delivery %d: a taker did not take it first", n)
			}
			if delivery.First(r, taker) {
				t.Fatalf("delivery %d: a taker took it twice", n)
			}
		}
	}
}

// The marked request's context is the request's: its values, deadline and cancellation.
func TestMarkedContext(t *testing.T) {
	parent, cancel := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "v"))
	r, _ := delivery.Request(httptest.NewRequest("GET", "/", nil).WithContext(parent))
	ctx := r.Context()
	if ctx.Value(ctxKey{}) != "v" {
		t.Fatal("the request's context value is lost")
	}
	child, stop := context.WithCancel(ctx)
	defer stop()
	cancel()
	<-child.Done() // a context derived from the marked one ends with the request's
	if ctx.Err() != context.Canceled {
		t.Fatalf("Err %v, want context.Canceled", ctx.Err())
	}
}
