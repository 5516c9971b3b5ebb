package keyfuncs

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"hash"
	"io"
	"net/http"
	"strconv"
	"sync"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/keyreason"
)

// keyFunc is the shape of every key function of this package, of middleware.Rule's
// Identity and Scope, and of httprate's KeyFunc.
type keyFunc = func(r *http.Request) (string, error)

// Bounds on keys.
const (
	// maxValueLen is the longest identifier, in bytes, that [Header] accepts and that
	// [Func] keeps as it is (longer ones are rejected or hashed).
	maxValueLen = 256
	// maxJoinedLen is the longest output of [Join] kept readable; longer encodings are
	// replaced by a fixed-size digest (hashedLen bytes).
	maxJoinedLen = 512
	// hashedLen is the length of every digest this package produces: "~" followed by the
	// 64 lowercase hex digits of a SHA-256 or HMAC-SHA-256.
	hashedLen = 1 + 2*sha256.Size
)

// hashMark starts every digest. Readable keys never start with it, so a digest cannot
// collide with a readable key.
const hashMark = '~'

// globalKey is the identity [Global] gives every request. It starts with the digest
// mark '~' but is not a digest, so no key built by this package from request data can
// equal it.
const globalKey = "~global"

// Global returns a key function for service-wide rules: every request gets the identity
// "~global", so all callers share one budget. It is the explicit way to ask for a
// shared budget; an empty key from any key function is refused by the middleware
// instead of being shared. The identity starts with '~' but is not a digest, so no key
// this package builds from request data can equal it. The function never fails and is
// safe for concurrent use.
func Global() func(*http.Request) (string, error) {
	return func(*http.Request) (string, error) { return globalKey, nil }
}

// Func adapts a function to a key function with this package's key hygiene: an empty
// result is an error (the middleware answers 400, "identity could not be determined");
// a result of 1 to 256 bytes of printable ASCII (0x20-0x7E) without '{'
// or '}' and not starting with '~' is kept as it is; any other result is replaced by its
// SHA-256 digest (65 bytes: "~" and 64 hex digits), so keys stay bounded and can never
// carry a Redis Cluster hash tag. Errors from fn are returned as they are.
//
// Use it for an identity that an authentication middleware stored in the request's
// context (an account id, a tenant), or for a fixed scope that groups routes:
//
//	accounts := keyfuncs.Func(func(r *http.Request) (string, error) {
//		u, _ := auth.UserFrom(r.Context())
//		return u.AccountID, nil // "" (no user) is an error: 400
//	})
//	search := keyfuncs.Func(func(*http.Request) (string, error) { return "search", nil })
//
// Func is for identifiers that are not secret. Hash secrets with [Hash]. A nil fn fails
// every request with a *[ratebudget.ConfigError] (package middleware answers 500 and
// logs it).
//
// A function passed as it is keeps none of this hygiene: inside [Join] its empty key is
// encoded as "0:", one budget shared by every request without an identity.
func Func(fn func(r *http.Request) (string, error)) func(*http.Request) (string, error) {
	if fn == nil {
		return misbuilt("Func", "needs a function, got nil")
	}
	return func(r *http.Request) (string, error) {
		s, err := fn(r)
		if err != nil {
			return "", err
		}
		if s == "" {
			return "", keyreason.ErrEmptyKey
		}
		return clean(s), nil
	}
}

// Hash returns a key function that replaces the key fn returns by its digest: HMAC-SHA-256
// under hmacKey, or SHA-256 when hmacKey is empty. The result is always 65
// bytes ("~" and 64 hex digits). Use it for secrets such as API keys or session tokens,
// so they never reach the store, logs or metrics. Prefer an HMAC key (16 bytes or more,
// kept secret): a plain SHA-256 of a known or guessable value can be recomputed by anyone
// who reads the store. hmacKey is copied.
//
// Errors from fn are returned as they are; an empty key with a nil error is an error too,
// as in [Func] (a secret is never empty). A nil fn fails every request with a
// *[ratebudget.ConfigError].
func Hash(fn func(*http.Request) (string, error), hmacKey []byte) func(*http.Request) (string, error) {
	if fn == nil {
		return misbuilt("Hash", "needs a KeyFunc, got nil")
	}
	h := newHasher(hmacKey)
	return func(r *http.Request) (string, error) {
		s, err := fn(r)
		if err != nil {
			return "", err
		}
		if s == "" {
			return "", keyreason.ErrEmptyKey
		}
		return h.sum(s), nil
	}
}

// joinStrings encodes parts into one key without collisions, as described at [Join].
// joinStrings() is "".
func joinStrings(parts ...string) string {
	n := 0
	for _, p := range parts {
		e := escapedLen(p)
		n += e + len(strconv.Itoa(e)) + 1
	}
	if n == 0 {
		return ""
	}
	b := make([]byte, 0, n)
	for _, p := range parts {
		b = strconv.AppendInt(b, int64(escapedLen(p)), 10)
		b = append(b, ':')
		b = appendEscaped(b, p)
	}
	if len(b) > maxJoinedLen {
		return sha256Hex(b)
	}
	return string(b)
}

// Join returns a key function that calls each fn in order and joins their keys into one, for
// example a client IP with an account, or a tenant with a route. The first error is
// returned as it is.
//
// The encoding has no collisions: each part is written as its length in decimal, a
// colon, and the part, so ("a:b", "c") gives "3:a:b1:c" and ("a", "b:c") gives
// "1:a3:b:c". Inside a part, '%', '{' and '}' are written as "%25", "%7B" and "%7D" (the
// length counts the escaped form), so the result never holds a brace. When the encoding
// is longer than 512 bytes it is replaced by its SHA-256 digest (65 bytes, starting with
// '~', which no encoding starts with). So different part lists never give the same key
// (for digests, up to SHA-256 collisions). An empty part is encoded like any other part,
// so Join's result is never empty. Join of no functions, or of a nil one, fails every
// request with a *[ratebudget.ConfigError].
func Join(fns ...func(*http.Request) (string, error)) func(*http.Request) (string, error) {
	if len(fns) == 0 {
		return misbuilt("Join", "needs at least one KeyFunc")
	}
	fns = append([]keyFunc(nil), fns...)
	for i, fn := range fns {
		if fn == nil {
			return misbuilt("Join", "got a nil KeyFunc at "+strconv.Itoa(i))
		}
	}
	return func(r *http.Request) (string, error) {
		var buf [8]string
		parts := buf[:0]
		for _, fn := range fns {
			s, err := fn(r)
			if err != nil {
				return "", err
			}
			parts = append(parts, s)
		}
		return joinStrings(parts...), nil
	}
}

// misbuilt is the key function of a constructor given arguments it cannot use: every request
// fails with a configuration error naming the constructor, which package middleware
// answers with 500 (the server's mistake, not the client's) and logs.
func misbuilt(constructor, problem string) keyFunc {
	return failing(&ratebudget.ConfigError{Field: "keyfuncs." + constructor, Problem: problem})
}

// failing returns a key function that always returns err: how a constructor without an
// error result reports an unusable argument, loudly and on every request.
func failing(err error) keyFunc {
	return func(*http.Request) (string, error) { return "", err }
}

// readable reports whether s is kept as it is in a key: 1..maxValueLen bytes of printable
// ASCII without braces, not starting with the digest mark.
func readable(s string) bool {
	if len(s) == 0 || len(s) > maxValueLen || s[0] == hashMark {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '{' || c == '}' {
			return false
		}
	}
	return true
}

// clean returns s when it is readable and its SHA-256 digest otherwise.
func clean(s string) string {
	if readable(s) {
		return s
	}
	return sha256Hex([]byte(s))
}

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return digestString(sum[:])
}

func digestString(sum []byte) string {
	var out [hashedLen]byte
	out[0] = hashMark
	hex.Encode(out[1:], sum)
	return string(out[:])
}

// hasher computes the digests of [Hash] and [HashedHeader]. HMAC states are pooled:
// hmac.New costs several allocations, Reset none.
type hasher struct {
	pool *sync.Pool // nil: plain SHA-256
}

func newHasher(key []byte) hasher {
	if len(key) == 0 {
		return hasher{}
	}
	key = append([]byte(nil), key...)
	return hasher{pool: &sync.Pool{New: func() any { return hmac.New(sha256.New, key) }}}
}

func (h hasher) sum(s string) string {
	if h.pool == nil {
		sum := sha256.Sum256([]byte(s))
		return digestString(sum[:])
	}
	m := h.pool.Get().(hash.Hash)
	m.Reset()
	io.WriteString(m, s)
	var buf [sha256.Size]byte
	out := digestString(m.Sum(buf[:0]))
	h.pool.Put(m)
	return out
}

func escapedLen(p string) int {
	n := len(p)
	for i := 0; i < len(p); i++ {
		switch p[i] {
		case '%', '{', '}':
			n += 2
		}
	}
	return n
}

func appendEscaped(b []byte, p string) []byte {
	for i := 0; i < len(p); i++ {
		switch c := p[i]; c {
		case '%':
			b = append(b, "%25"...)
		case '{':
			b = append(b, "%7B"...)
		case '}':
			b = append(b, "%7D"...)
		default:
			b = append(b, c)
		}
	}
	return b
}
