package chiroute

import (
	"net/http"
	"strconv"
	"testing"

	"github.com/go-chi/chi/v5"
)

// Hostile paths, matched or not, inside a subrouter or not, add nothing to the cache
// past the router's own patterns.
func TestCacheBoundedUnderHostilePaths(t *testing.T) {
	t.Parallel()
	h := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	r := chi.NewRouter()
	r.Route("/api", func(r chi.Router) {
		r.Use(func(next http.Handler) http.Handler { return next })
		r.Get("/{id}", h)
	})
	r.Get("/files/*", h)
	var c Cache
	for i := range 10_000 {
		n := strconv.Itoa(i)
		for _, path := range []string{"/api/" + n, "/api/" + n + "/x", "/files/" + n, "/" + n, "/api%2F" + n} {
			for _, method := range []string{"GET", "HEAD", "X" + n} {
				if pattern, levels := Find(r, method, path); len(levels) > 0 {
					c.First(r, method, pattern, levels)
				}
			}
		}
	}
	if len(c.first) > 8 {
		t.Fatalf("%d cache entries for 3 patterns", len(c.first))
	}
}
