package policy_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/ratebudget/ratebudget/memory"
	"github.com/ratebudget/ratebudget/middleware/policy"
)

// A policy of two plans: the tenant named by X-API-Key "k1" is on pro, any other key on
// free.
func Example() {
	p, err := policy.Parse("policy.yaml", []byte(`
rules:
  - name: hello
    identity: header:X-API-Key
    time: {limit: 2, window: 1m}
plans:
  free: {hello: {limit: 2}}
  pro: {hello: {limit: 100}}
tenants:
  header: X-API-Key
  default: free
  keys: {k1: pro}
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	lim, _ := memory.New()
	mw, err := p.Middleware(lim)
	if err != nil {
		fmt.Println(err)
		return
	}
	h := mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	for _, key := range []string{"k2", "k2", "k2", "k1", "k1", "k1"} {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("X-API-Key", key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Println(key, w.Code)
	}
	// Output:
	// k2 200
	// k2 200
	// k2 429
	// k1 200
	// k1 200
	// k1 200
}

// A file that is not a valid policy is refused with its line, column and field.
func ExampleParse_error() {
	_, err := policy.Parse("policy.yaml", []byte(`
rules:
  - name: hello
    identity: ip
    time: {limit: -5, window: 1m}
`))
	fmt.Println(err)
	// Output:
	// policy.yaml:5:19: rules[0].time.limit: must be in 1..1099511627776, got -5
}
