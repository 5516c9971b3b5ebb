package keyfuncs

import (
	"net/http"
	"strings"
)

// Header returns a KeyFunc whose key is the value of the named request header, for
// identifiers that are not secret and that a trusted component sets, such as an account
// or tenant id added by an authenticating gateway. A header a client can set freely is
// not an identity: a client can rotate it to get fresh budgets.
//
// When the header has several lines the last one wins. A missing or empty header is
// [ErrEmptyKey]; an empty name fails every request with a *[ratebudget.ConfigError]
// (package middleware answers 500 and logs it). A value longer than 256 bytes, holding bytes outside printable
// ASCII (0x20-0x7E), a '{' or '}', or starting with '~', is [ErrInvalidHeader]: it is
// refused, not truncated or hashed, so keys stay short and readable and a Redis Cluster
// hash tag can never come from a request. For secrets (API keys, tokens) use
// [HashedHeader].
func Header(name string) KeyFunc {
	name = http.CanonicalHeaderKey(strings.TrimSpace(name))
	if name == "" {
		return misbuilt("Header", "needs a header name")
	}
	invalid := &headerError{ErrInvalidHeader, name}
	missing := &headerError{ErrEmptyKey, name}
	return func(r *http.Request) (string, error) {
		v := lastValue(r.Header[name])
		if v == "" {
			return "", missing
		}
		if !readable(v) {
			return "", invalid
		}
		return v, nil
	}
}

// HashedHeader returns a KeyFunc whose key is the digest of the named request header:
// HMAC-SHA-256 under hmacKey, or SHA-256 when hmacKey is empty (see [Hash]). Use it for
// secrets such as API keys: the secret never reaches the store, logs or metrics, and the
// key is always 65 bytes whatever the header's length. When the header has
// several lines the last one wins; a missing or empty header is [ErrEmptyKey], an empty
// name a *[ratebudget.ConfigError] on every request. hmacKey is copied.
//
// It is not Hash(Header(name), hmacKey): [Header] refuses values longer than 256 bytes or
// outside printable ASCII, such as long bearer tokens, which HashedHeader hashes like any
// other.
//
// Hashing does not authenticate: an unknown API key still gets its own budget. Check keys
// before (or in addition to) limiting by them.
func HashedHeader(name string, hmacKey []byte) KeyFunc {
	name = http.CanonicalHeaderKey(strings.TrimSpace(name))
	if name == "" {
		return misbuilt("HashedHeader", "needs a header name")
	}
	h := newHasher(hmacKey)
	missing := &headerError{ErrEmptyKey, name}
	return func(r *http.Request) (string, error) {
		v := lastValue(r.Header[name])
		if v == "" {
			return "", missing
		}
		return h.sum(v), nil
	}
}

// lastValue returns the trimmed last line of a header.
func lastValue(vs []string) string {
	if len(vs) == 0 {
		return ""
	}
	return strings.TrimSpace(vs[len(vs)-1])
}
