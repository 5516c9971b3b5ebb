package keyfuncs

import (
	"strings"
	"unicode"
)

// credentials returns the canonical spelling of an Authorization or Proxy-Authorization
// value, credentials = auth-scheme [ 1*SP ( token68 / #auth-param ) ] (RFC 9110 section
// 11.4), so that spellings a server reads as one credential are one identity:
// surrounding whitespace is dropped, the scheme is written in one case, the run of
// whitespace after it is one space, and the base64 of a Basic credential or of a JSON Web
// Token's segments (Bearer, DPoP) is written canonically (see canonicalBase64). The rest
// is kept as sent: a token68 is case-sensitive, and an auth-param list (Digest) changes
// with every request anyway. A value that is not a scheme followed by whitespace and
// more (a bare API key, "Bearer" alone) is only trimmed. A canonical value is returned
// as it is, without allocating.
func credentials(v string) string {
	v = strings.TrimSpace(v)
	i := 0
	for i < len(v) && isTchar(v[i]) {
		i++
	}
	if i == 0 || i == len(v) {
		return v
	}
	rest := strings.TrimLeftFunc(v[i:], unicode.IsSpace)
	if len(rest) == len(v)-i {
		return v // the scheme is followed by something other than whitespace
	}
	scheme := canonicalScheme(v[:i])
	switch scheme {
	case "Basic":
		rest, _ = canonicalBase64(rest, false, true)
	case "Bearer", "DPoP":
		rest = canonicalJWT(rest)
	}
	if scheme == v[:i] && v[i] == ' ' && rest == v[i+1:] {
		return v
	}
	return scheme + " " + rest
}

// canonicalScheme returns the spelling of s, a scheme, that keys use. A scheme is
// case-insensitive (RFC 9110 section 11.1). Those of the IANA HTTP Authentication Scheme
// Registry are written as registered, so that a credential spelled as its specification
// spells it is hashed as sent; any other scheme is written in lower case.
func canonicalScheme(s string) string {
	for _, r := range [...]string{
		"Basic", "Bearer", "Concealed", "Digest", "DPoP", "GNAP", "HOBA", "Mutual",
		"Negotiate", "OAuth", "PrivateToken", "SCRAM-SHA-1", "SCRAM-SHA-256", "vapid",
	} {
		if strings.EqualFold(s, r) {
			return r
		}
	}
	for i := 0; i < len(s); i++ {
		if 'A' <= s[i] && s[i] <= 'Z' {
			return strings.ToLower(s)
		}
	}
	return s
}

// canonicalJWT returns a JSON Web Token (three or five base64url segments separated by
// dots, a JWS or JWE in compact form) with every segment in its canonical base64url
// spelling, unpadded. JWT libraries accept other spellings of the same bytes (golang-jwt
// by default ignores the unused bits of a segment's last character, and accepts padding
// when told to), so a holder of one token could otherwise present it in up to 16
// spellings per segment. Any other token is returned as it is.
func canonicalJWT(tok string) string {
	var segs [5]string
	n, rest := 0, tok
	for {
		i := strings.IndexByte(rest, '.')
		if i < 0 || n == len(segs)-1 {
			segs[n], n = rest, n+1
			break
		}
		segs[n], rest, n = rest[:i], rest[i+1:], n+1
	}
	if n != 3 && n != 5 || strings.IndexByte(segs[n-1], '.') >= 0 {
		return tok
	}
	changed := false
	for i, seg := range segs[:n] {
		c, ok := canonicalBase64(seg, true, false)
		if !ok {
			return tok
		}
		changed = changed || len(c) != len(seg) || c != seg
		segs[i] = c
	}
	if !changed {
		return tok
	}
	return strings.Join(segs[:n], ".")
}

// canonicalBase64 returns the canonical spelling of s, base64 in the standard or (url)
// the URL-safe alphabet, with or without '=' padding: padded to a multiple of four
// characters when pad is set and unpadded otherwise, and with the unused low bits of
// the last character cleared. Decoders ignore those bits unless told to be strict (Go's
// encoding/base64 does, so r.BasicAuth reads "YWxpY2U6cHc=" and "YWxpY2U6cHd=" as the
// same password). It returns s itself when s is canonical, and s and false when s is not
// base64 in that alphabet.
func canonicalBase64(s string, url, pad bool) (string, bool) {
	data := s
	for k := 0; k < 2 && strings.HasSuffix(data, "="); k++ {
		data = data[:len(data)-1]
	}
	n := len(data)
	if n%4 == 1 || n == 0 && s != "" {
		return s, false
	}
	for i := 0; i < n; i++ {
		if c := data[i]; c-'A' >= 26 && c-'a' >= 26 && c-'0' >= 10 && b64Value(c, url) < 0 {
			return s, false
		}
	}
	pads := 0
	if pad {
		pads = (4 - n%4) % 4
	}
	last := byte(0)
	if n > 0 {
		last = data[n-1]
		if unused := [4]int{0, 0, 4, 2}[n%4]; unused > 0 {
			v := b64Value(last, url) &^ (1<<unused - 1)
			last = b64Char(v, url)
		}
	}
	if len(s) == n+pads && (n == 0 || last == data[n-1]) {
		return s, true
	}
	b := make([]byte, 0, n+pads)
	b = append(b, data[:n-1]...)
	b = append(b, last)
	b = append(b, "=="[:pads]...)
	return string(b), true
}

// b64Value returns the value of the base64 character c, or -1.
func b64Value(c byte, url bool) int {
	switch {
	case 'A' <= c && c <= 'Z':
		return int(c - 'A')
	case 'a' <= c && c <= 'z':
		return int(c-'a') + 26
	case '0' <= c && c <= '9':
		return int(c-'0') + 52
	case c == '+' && !url, c == '-' && url:
		return 62
	case c == '/' && !url, c == '_' && url:
		return 63
	}
	return -1
}

func b64Char(v int, url bool) byte {
	const std = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
	if url {
		switch v {
		case 62:
			return '-'
		case 63:
			return '_'
		}
	}
	return std[v]
}
