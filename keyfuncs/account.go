package keyfuncs

import (
	"net/http"
	"strings"

	"github.com/ratebudget/ratebudget/internal/keyreason"
)

// Header returns a key function whose key is the value of the named request header, for
// identifiers that are not secret and that a trusted component sets, such as an account
// or tenant id added by an authenticating gateway. A header a client can set freely is
// not an identity: a client can rotate it to get fresh budgets.
//
// When the header has several lines the last one wins. A missing or empty header is an
// error (the middleware answers 400, "header X-Account is missing or empty"); an empty
// name fails every request with a *[ratebudget.ConfigError] (package middleware answers
// 500 and logs it). A value longer than 256 bytes, holding bytes outside printable ASCII
// (0x20-0x7E), a '{' or '}', or starting with '~', is an error too (400, "header
// X-Account is malformed"): it is refused, not truncated or hashed, so keys stay short and readable and a Redis Cluster
// hash tag can never come from a request. For secrets (API keys, tokens) use
// [HashedHeader].
func Header(name string) func(*http.Request) (string, error) {
	name = http.CanonicalHeaderKey(strings.TrimSpace(name))
	if name == "" {
		return misbuilt("Header", "needs a header name")
	}
	invalid := &headerError{keyreason.ErrInvalidHeader, name}
	missing := &headerError{keyreason.ErrEmptyKey, name}
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

// HashedHeader returns a key function whose key is the digest of the named request header:
// HMAC-SHA-256 under hmacKey, or SHA-256 when hmacKey is empty (see [Hash]). Use it for
// secrets such as API keys: the secret never reaches the store, logs or metrics, and the
// key is always 65 bytes whatever the header's length. A missing or empty header is an
// error (400, "header X-Api-Key is missing or empty"), an empty name a
// *[ratebudget.ConfigError] on every request. hmacKey is copied.
//
// The identity is the secret, not its spelling, so that a client holding one secret
// cannot multiply its budget by sending it in several forms the server accepts alike.
// Whitespace around the value is dropped (HTTP/1.1 drops it; HTTP/2 does not). An
// Authorization or Proxy-Authorization value is read as credentials (RFC 9110 section
// 11.4), scheme, whitespace, token: the scheme is case-insensitive ("Bearer", "bearer"),
// any run of spaces or tabs after it counts as one space, and base64 that decoders read
// alike is one value: a Basic credential (r.BasicAuth ignores the unused bits of the
// last character; padding may be left out) and the segments of a JSON Web Token after
// Bearer or DPoP (JWT libraries ignore those bits, and may allow padding). The token
// itself is case-sensitive and otherwise kept as sent. A credential already written in
// that form, a registered scheme as registered ("Basic", "Bearer"), one space and
// canonical base64, is hashed exactly as sent; other schemes are read in lower case.
// Other headers are hashed as sent, but for the whitespace around them.
//
// When the header has several lines, the empty ones are ignored and the others must
// spell one secret; lines that differ are an error (400, "header X-Api-Key is
// malformed"). The server authenticates
// one line (r.Header.Get reads the first), so keying by another would let a client add
// a line with a fresh value to each request and get a fresh budget each time.
//
// It is not Hash(Header(name), hmacKey): [Header] refuses values longer than 256 bytes or
// outside printable ASCII, such as long bearer tokens, which HashedHeader hashes like any
// other.
//
// Hashing does not authenticate: an unknown API key still gets its own budget. Check keys
// before (or in addition to) limiting by them.
func HashedHeader(name string, hmacKey []byte) func(*http.Request) (string, error) {
	name = http.CanonicalHeaderKey(strings.TrimSpace(name))
	if name == "" {
		return misbuilt("HashedHeader", "needs a header name")
	}
	h := newHasher(hmacKey)
	missing := &headerError{keyreason.ErrEmptyKey, name}
	invalid := &headerError{keyreason.ErrInvalidHeader, name}
	canonical := strings.TrimSpace
	if name == "Authorization" || name == "Proxy-Authorization" {
		canonical = credentials
	}
	return func(r *http.Request) (string, error) {
		v, ok := oneValue(r.Header[name], canonical)
		if !ok {
			return "", invalid
		}
		if v == "" {
			return "", missing
		}
		return h.sum(v), nil
	}
}

// oneValue returns the value that the non-empty lines of a header agree on, in the form
// canonical gives them, or "" when every line is empty. It reports false when two lines
// differ.
func oneValue(lines []string, canonical func(string) string) (string, bool) {
	v := ""
	for _, l := range lines {
		switch c := canonical(l); {
		case c == "":
		case v == "":
			v = c
		case c != v:
			return "", false
		}
	}
	return v, true
}

// lastValue returns the trimmed last line of a header.
func lastValue(vs []string) string {
	if len(vs) == 0 {
		return ""
	}
	return strings.TrimSpace(vs[len(vs)-1])
}
