package keyreason_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/ratebudget/ratebudget/internal/keyreason"
	"github.com/ratebudget/ratebudget/keyfuncs"
)

// The reasons of package keyfuncs's errors, and none for an error of another package
// (the reason of a function's own *middleware.InputError: TestBadRequestNamesThePart).
func TestOf(t *testing.T) {
	t.Parallel()
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = "10.0.0.1:1"
	r.Header.Set("X-Forwarded-For", "not an address")
	_, missing := keyfuncs.Header("x-api-key")(r)
	_, hashed := keyfuncs.HashedHeader("X-API-Key", nil)(r)
	ip, err := keyfuncs.ClientIP(keyfuncs.TrustedProxies("10.0.0.0/8"), keyfuncs.FromHeader("X-Forwarded-For"))
	if err != nil {
		t.Fatal(err)
	}
	_, badXFF := ip(r)
	for _, tc := range []struct {
		err  error
		want string
		ok   bool
	}{
		{missing, "header X-Api-Key is missing or empty", true},
		{hashed, "header X-Api-Key is missing or empty", true},
		{badXFF, "header X-Forwarded-For is malformed", true},
		{keyreason.ErrNoClientIP, "the client address could not be determined", true},
		{keyreason.ErrEmptyKey, "identity could not be determined", true},
		{fmt.Errorf("wrapped: %w", missing), "header X-Api-Key is missing or empty", true},
		{keyreason.ErrNoRoutePattern, "", false},
		{errors.New("dial tcp 10.1.2.3:5432: refused"), "", false}, // internal text is never a reason
		{nil, "", false},
	} {
		got, ok := keyreason.Of(tc.err)
		if got != tc.want || ok != tc.ok {
			t.Errorf("Of(%v) = (%q, %v), want (%q, %v)", tc.err, got, ok, tc.want, tc.ok)
		}
	}
	// The error texts stay what they were, and errors.Is still finds the sentinel.
	if missing.Error() != "keyfuncs: empty key: X-Api-Key" || !errors.Is(missing, keyreason.ErrEmptyKey) {
		t.Errorf("missing header error: %v", missing)
	}
	if badXFF.Error() != "keyfuncs: invalid header: X-Forwarded-For" || !errors.Is(badXFF, keyreason.ErrInvalidHeader) {
		t.Errorf("invalid header error: %v", badXFF)
	}
	var ke keyreason.Error
	if !errors.As(missing, &ke) || ke != keyreason.ErrEmptyKey {
		t.Errorf("errors.As into Error: %v", ke)
	}
}
