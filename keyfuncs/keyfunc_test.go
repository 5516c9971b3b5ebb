package keyfuncs_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/keyreason"
	"github.com/ratebudget/ratebudget/keyfuncs"
)

func TestJoinStrings(t *testing.T) {
	t.Parallel()
	tt := []struct {
		name  string
		parts []string
		want  string
	}{
		{name: "none", parts: nil, want: ""},
		{name: "one_empty", parts: []string{""}, want: "0:"},
		{name: "colon_left", parts: []string{"a:b", "c"}, want: "3:a:b1:c"},
		{name: "colon_right", parts: []string{"a", "b:c"}, want: "1:a3:b:c"},
		{name: "braces_escaped", parts: []string{"/u/{id}", "%"}, want: "11:/u/%7Bid%7D3:%25"},
	}
	for _, tc := range tt {
		t.Run(tc.name, func(t *testing.T) {
			if got := keyfuncs.JoinStrings(tc.parts...); got != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
	long := keyfuncs.JoinStrings(strings.Repeat("x", keyfuncs.MaxJoinedLen))
	if len(long) != keyfuncs.HashedLen || long[0] != '~' {
		t.Fatalf("long join not hashed: %q", long)
	}
	if other := keyfuncs.JoinStrings(strings.Repeat("x", keyfuncs.MaxJoinedLen-1), "x"); other == long {
		t.Fatalf("different long joins collide")
	}
}

func TestJoin(t *testing.T) {
	t.Parallel()
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = "203.0.113.7:1"
	r.Header.Set("X-Tenant", "acme")
	ip, _ := keyfuncs.ClientIP()
	got, err := keyfuncs.Join(keyfuncs.Header("X-Tenant"), ip)(r)
	if err != nil || got != "4:acme11:203.0.113.7" {
		t.Fatalf("got (%q, %v)", got, err)
	}
	if _, err := keyfuncs.Join(keyfuncs.Header("X-Missing"), ip)(r); !errors.Is(err, keyreason.ErrEmptyKey) {
		t.Fatalf("missing part: got %v, want ErrEmptyKey", err)
	}
	if _, err := keyfuncs.Join()(r); !isConfigError(err) {
		t.Fatalf("no parts: got %v", err)
	}
	if _, err := keyfuncs.Join(ip, nil)(r); !isConfigError(err) {
		t.Fatalf("nil part: got %v", err)
	}
	// Many parts (beyond Join's stack buffer) still work.
	fns := make([]keyFunc, 20)
	for i := range fns {
		fns[i] = fixed("p")
	}
	if got, err := keyfuncs.Join(fns...)(r); err != nil || got != strings.Repeat("1:p", 20) {
		t.Fatalf("20 parts: got (%q, %v)", got, err)
	}
}

// fixed is a constant key through Func, the way to write a fixed scope.
func fixed(s string) keyFunc {
	return keyfuncs.Func(func(*http.Request) (string, error) { return s, nil })
}

func TestGlobalAndFixed(t *testing.T) {
	t.Parallel()
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	if got, err := keyfuncs.Global()(r); got != "~global" || err != nil {
		t.Fatalf("Global: (%q, %v), want \"~global\"", got, err)
	}
	if got, err := fixed("")(r); got != "" || !errors.Is(err, keyreason.ErrEmptyKey) {
		t.Fatalf("fixed(\"\"): (%q, %v), want ErrEmptyKey (a shared budget is asked for with Global)", got, err)
	}
	if got, err := fixed("search")(r); got != "search" || err != nil {
		t.Fatalf("fixed: (%q, %v)", got, err)
	}
	if got, _ := fixed("{tag}")(r); len(got) != keyfuncs.HashedLen || strings.ContainsAny(got, "{}") {
		t.Fatalf("fixed key with braces not hashed: %q", got)
	}
}

func TestHeader(t *testing.T) {
	t.Parallel()
	fn := keyfuncs.Header("x-account")
	tt := []struct {
		name    string
		values  []string
		want    string
		wantErr error
	}{
		{name: "plain", values: []string{"acct-42"}, want: "acct-42"},
		{name: "last_wins", values: []string{"victim", "acct-42"}, want: "acct-42"},
		{name: "trimmed", values: []string{"  acct-42 "}, want: "acct-42"},
		{name: "missing", values: nil, wantErr: keyreason.ErrEmptyKey},
		{name: "empty", values: []string{" "}, wantErr: keyreason.ErrEmptyKey},
		{name: "too_long", values: []string{strings.Repeat("a", keyfuncs.MaxValueLen+1)}, wantErr: keyreason.ErrInvalidHeader},
		{name: "max_len_ok", values: []string{strings.Repeat("a", keyfuncs.MaxValueLen)}, want: strings.Repeat("a", keyfuncs.MaxValueLen)},
		{name: "hash_tag", values: []string{"a{slot}"}, wantErr: keyreason.ErrInvalidHeader},
		{name: "non_ascii", values: []string{"caf\xc3\xa9"}, wantErr: keyreason.ErrInvalidHeader},
		{name: "control", values: []string{"a\x01b"}, wantErr: keyreason.ErrInvalidHeader},
		{name: "digest_mark", values: []string{"~abc"}, wantErr: keyreason.ErrInvalidHeader},
	}
	for _, tc := range tt {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			for _, v := range tc.values {
				r.Header.Add("X-Account", v)
			}
			got, err := fn(r)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) || got != "" {
					t.Fatalf("got (%q, %v), want %v", got, err, tc.wantErr)
				}
				if err != nil && !strings.Contains(err.Error(), "X-Account") {
					t.Fatalf("error %q does not name the header", err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got (%q, %v), want %q", got, err, tc.want)
			}
		})
	}
}

func TestHashedHeader(t *testing.T) {
	t.Parallel()
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("X-API-Key", "sk_live_secret")
	plain, err := keyfuncs.HashedHeader("X-API-Key", nil)(r)
	if err != nil {
		t.Fatal(err)
	}
	// SHA-256("sk_live_secret")
	if len(plain) != keyfuncs.HashedLen || plain[0] != '~' || strings.Contains(plain, "secret") {
		t.Fatalf("bad digest %q", plain)
	}
	key := []byte("k1")
	mac1, _ := keyfuncs.HashedHeader("X-API-Key", key)(r)
	key[0] = 'x' // the key is copied at construction
	mac2, _ := keyfuncs.HashedHeader("X-API-Key", []byte("k1"))(r)
	mac3, _ := keyfuncs.HashedHeader("X-API-Key", []byte("k2"))(r)
	if mac1 != mac2 || mac1 == mac3 || mac1 == plain {
		t.Fatalf("HMAC digests: %q %q %q %q", mac1, mac2, mac3, plain)
	}
	r.Header.Set("X-API-Key", strings.Repeat("x", 1<<16))
	if long, _ := keyfuncs.HashedHeader("X-API-Key", key)(r); len(long) != keyfuncs.HashedLen {
		t.Fatalf("long secret: %d bytes", len(long))
	}
	r.Header.Del("X-API-Key")
	if _, err := keyfuncs.HashedHeader("X-API-Key", key)(r); !errors.Is(err, keyreason.ErrEmptyKey) {
		t.Fatalf("missing: %v", err)
	}
}

type ctxKey struct{}

func TestContextFuncHash(t *testing.T) {
	t.Parallel()
	// An identity an authentication middleware stored in the context.
	fn := keyfuncs.Func(func(r *http.Request) (string, error) {
		s, _ := r.Context().Value(ctxKey{}).(string)
		return s, nil
	})
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	if _, err := fn(r); !errors.Is(err, keyreason.ErrEmptyKey) {
		t.Fatalf("absent: %v", err)
	}
	with := func(v string) *http.Request { return r.WithContext(context.WithValue(r.Context(), ctxKey{}, v)) }
	if _, err := fn(with("")); !errors.Is(err, keyreason.ErrEmptyKey) {
		t.Fatalf("empty: %v", err)
	}
	if got, err := fn(with("acct 7")); got != "acct 7" || err != nil {
		t.Fatalf("plain: (%q, %v)", got, err)
	}
	for _, v := range []string{strings.Repeat("a", 300), "{x}", "~x", "caf\xc3\xa9"} {
		got, err := fn(with(v))
		if err != nil || len(got) != keyfuncs.HashedLen || got[0] != '~' {
			t.Fatalf("%q: got (%q, %v), want a digest", v, got, err)
		}
	}
	boom := errors.New("boom")
	if _, err := keyfuncs.Func(func(*http.Request) (string, error) { return "", boom })(r); err != boom {
		t.Fatalf("Func error: %v", err)
	}
	if _, err := keyfuncs.Hash(func(*http.Request) (string, error) { return "", nil }, nil)(r); !errors.Is(err, keyreason.ErrEmptyKey) {
		t.Fatalf("Hash of empty: %v", err)
	}
	if _, err := keyfuncs.Func(nil)(r); !isConfigError(err) {
		t.Fatalf("nil function: %v", err)
	}
}

func TestErrorsAreClassifiable(t *testing.T) {
	t.Parallel()
	fn := keyfuncs.Header("X-Account")
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("X-Account", "{x}")
	_, err := fn(r)
	var kerr keyreason.Error
	if !errors.As(err, &kerr) || kerr != keyreason.ErrInvalidHeader {
		t.Fatalf("errors.As: %v -> %v", err, kerr)
	}
}

// keyFunc is the shape of every key function of package keyfuncs.
type keyFunc = func(*http.Request) (string, error)

// isConfigError reports whether err is, or wraps, a *ratebudget.ConfigError.
func isConfigError(err error) bool {
	var ce *ratebudget.ConfigError
	return errors.As(err, &ce)
}
