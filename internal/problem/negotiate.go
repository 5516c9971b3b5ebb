package problem

// AcceptsJSON reports whether a body should be application/problem+json rather than
// text/plain for the values of a request's Accept fields, by proactive negotiation
// (RFC 9110 §12.5.1): each representation takes the weight (q) of the most specific media range
// that matches it, and q=0 means "not acceptable".
//
//   - application/problem+json is matched by application/problem+json and
//     application/json (a problem+json body is JSON), then application/*, then */*.
//   - text/plain is matched by text/plain, then text/*, then */*.
//
// JSON is chosen when its weight is higher, or when the weights are equal and positive
// and the client named JSON or application/* (so "application/json, text/plain" gives
// JSON). Everything else gives text/plain: no Accept header, a bare */* (what curl and
// browsers send), a JSON-based type other than these two (application/x-ndjson,
// application/ld+json, ...) and an Accept header that allows neither (a refusal is sent
// anyway; RFC 9110 permits disregarding Accept). Malformed elements (a weight that is
// not a qvalue) are ignored. Several Accept fields form one list. The work is linear in
// the fields' length and allocates nothing.
func AcceptsJSON(accept []string) bool {
	var js, ts match // JSON and text
	for _, v := range accept {
		for len(v) > 0 {
			var elem string
			elem, v = nextElement(v)
			typ, sub, q, ok := parseRange(elem)
			if !ok {
				continue
			}
			js.consider(jsonSpecificity(typ, sub), q)
			ts.consider(textSpecificity(typ, sub), q)
		}
	}
	if js.q == 0 {
		return false
	}
	return js.q > ts.q || js.q == ts.q && js.spec > specAny
}

// Specificity of a media range that matches a representation.
const (
	specNone    = iota // does not match
	specAny            // */*
	specType           // type/*
	specExactly        // type/subtype
)

// match is the most specific range seen so far for one representation and its weight.
type match struct {
	spec int
	q    int // thousandths
}

func (m *match) consider(spec, q int) {
	switch {
	case spec == specNone:
	case spec > m.spec:
		m.spec, m.q = spec, q
	case spec == m.spec && q > m.q:
		m.q = q
	}
}

func jsonSpecificity(typ, sub string) int {
	switch {
	case typ == "*" && sub == "*":
		return specAny
	case !asciiEqualFold(typ, "application"):
		return specNone
	case sub == "*":
		return specType
	case asciiEqualFold(sub, "json") || asciiEqualFold(sub, "problem+json"):
		return specExactly
	}
	return specNone
}

func textSpecificity(typ, sub string) int {
	switch {
	case typ == "*" && sub == "*":
		return specAny
	case !asciiEqualFold(typ, "text"):
		return specNone
	case sub == "*":
		return specType
	case asciiEqualFold(sub, "plain"):
		return specExactly
	}
	return specNone
}

// nextElement splits off the first comma-separated element of v, honouring quoted
// strings in parameters (a comma inside quotes does not end an element).
func nextElement(v string) (elem, rest string) {
	quoted := false
	for i := 0; i < len(v); i++ {
		switch c := v[i]; {
		case quoted && c == '\\':
			i++ // the escaped byte, whatever it is
		case c == '"':
			quoted = !quoted
		case c == ',' && !quoted:
			return v[:i], v[i+1:]
		}
	}
	return v, ""
}

// parseRange parses one media-range with its parameters and returns the type, subtype
// and weight in thousandths (1000 when absent). ok is false for an empty or malformed
// element, which the caller ignores.
func parseRange(elem string) (typ, sub string, q int, ok bool) {
	elem = trimOWS(elem)
	mt, params := elem, ""
	for i := 0; i < len(elem); i++ {
		if elem[i] == ';' {
			mt, params = trimOWS(elem[:i]), elem[i+1:]
			break
		}
	}
	slash := -1
	for i := 0; i < len(mt); i++ {
		if mt[i] == '/' {
			slash = i
			break
		}
	}
	if slash <= 0 || slash == len(mt)-1 {
		return "", "", 0, false
	}
	typ, sub = mt[:slash], mt[slash+1:]
	if !isToken(typ) || !isToken(sub) || typ == "*" && sub != "*" {
		return "", "", 0, false
	}
	q = 1000
	for len(params) > 0 {
		var p string
		p, params = nextParam(params)
		eq := -1
		for i := 0; i < len(p); i++ {
			if p[i] == '=' {
				eq = i
				break
			}
		}
		if eq < 0 || !asciiEqualFold(trimOWS(p[:eq]), "q") {
			continue // another parameter: it does not change the weight here
		}
		w, good := parseQ(trimOWS(p[eq+1:]))
		if !good {
			return "", "", 0, false
		}
		q = w
	}
	return typ, sub, q, true
}

// nextParam splits off the first ';'-separated parameter, honouring quoted strings.
func nextParam(v string) (p, rest string) {
	quoted := false
	for i := 0; i < len(v); i++ {
		switch c := v[i]; {
		case quoted && c == '\\':
			i++
		case c == '"':
			quoted = !quoted
		case c == ';' && !quoted:
			return v[:i], v[i+1:]
		}
	}
	return v, ""
}

// parseQ parses an RFC 9110 qvalue: "0" [ "." 0*3DIGIT ] or "1" [ "." 0*3("0") ].
func parseQ(s string) (int, bool) {
	if len(s) == 0 || len(s) > 5 || s[0] != '0' && s[0] != '1' {
		return 0, false
	}
	n := int(s[0]-'0') * 1000
	if len(s) == 1 {
		return n, true
	}
	if s[1] != '.' {
		return 0, false
	}
	scale := 100
	for i := 2; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' || n == 1000 && c != '0' {
			return 0, false
		}
		n += int(c-'0') * scale
		scale /= 10
	}
	return n, true
}

func trimOWS(s string) string {
	for len(s) > 0 && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for len(s) > 0 && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	return s
}

// isToken reports whether s is a non-empty RFC 9110 token.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			switch c {
			case '!', '#', '$', '%', '&', '\'', '*', '+', '-', '.', '^', '_', '`', '|', '~':
			default:
				return false
			}
		}
	}
	return true
}

func asciiEqualFold(s, lower string) bool {
	if len(s) != len(lower) {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lower[i] {
			return false
		}
	}
	return true
}
