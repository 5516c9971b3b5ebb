package policy

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/ratebudget/ratebudget/keyfuncs"
)

// clientIP compiles the file's client_ip section (nil when the file has none) into the
// key function of identity ip, which groups addresses by the section's prefixes, and
// the one match.ip reads: the whole address, from the same source, so that the two
// never disagree about who the client is. keyfuncs.ClientIP decides what is valid: each
// field is tried on its own before the next joins it, so that an error names the field
// at fault.
func (c *compiler) clientIP(s *clientIPSpec) (ident, addr func(*http.Request) (string, error), err error) {
	if s == nil {
		s = &clientIPSpec{}
	}
	const path = "client_ip"
	var src []keyfuncs.IPOption // where the address comes from: proxies, header, strictness
	if s.TrustedProxies != nil {
		if len(s.TrustedProxies) == 0 {
			_, err := keyfuncs.ClientIP(keyfuncs.TrustedProxies(), keyfuncs.FromHeader("X-Forwarded-For"))
			return nil, nil, c.fail(path+".trusted_proxies", "%s", kfProblem(err, "TrustedProxies"))
		}
		for i, cidr := range s.TrustedProxies {
			if _, err := keyfuncs.ClientIP(keyfuncs.TrustedProxies(cidr), keyfuncs.FromHeader("X-Forwarded-For")); err != nil {
				why := strings.TrimPrefix(kfProblem(err, "TrustedProxies"), strconv.Quote(cidr)+": ")
				return nil, nil, c.fail(fmt.Sprintf("%s.trusted_proxies[%d]", path, i), "invalid CIDR %q: %s", cidr, why)
			}
		}
		src = append(src, keyfuncs.TrustedProxies(s.TrustedProxies...))
	}
	if _, given := c.pos[path+".header"]; given || s.Header != "" {
		if _, err := keyfuncs.ClientIP(append(src, keyfuncs.FromHeader(s.Header))...); err != nil {
			if why, ok := valueProblem(err, "FromHeader"); ok {
				return nil, nil, c.fail(path+".header", "%s", why)
			}
			return nil, nil, c.fail(path+".header", "needs trusted_proxies: a forwarding header is believed only from a trusted proxy")
		}
		src = append(src, keyfuncs.FromHeader(s.Header))
	} else if len(src) > 0 {
		if _, err := keyfuncs.ClientIP(src...); err != nil {
			return nil, nil, c.fail(path+".trusted_proxies", "has no effect without header: name the forwarding header the proxies write")
		}
	}
	if s.RequireForwarding {
		if _, err := keyfuncs.ClientIP(append(src, keyfuncs.RequireForwarding())...); err != nil {
			return nil, nil, c.fail(path+".require_forwarding", "needs header: it refuses a request from a trusted proxy that has no forwarding header")
		}
		src = append(src, keyfuncs.RequireForwarding())
	}
	// keyfuncs.Prefixes sets both prefixes: a field left out keeps its default. Each
	// field is tried with the others' values already checked, so an error is its own.
	v4, v6 := 32, 64
	for _, f := range []struct {
		name, arg string
		bits      *int64
		set       *int
	}{
		{"ipv4_prefix", "ipv4", s.IPv4Prefix, &v4},
		{"ipv6_prefix", "ipv6", s.IPv6Prefix, &v6},
	} {
		if f.bits == nil {
			continue
		}
		bits := int(max(min(*f.bits, 1<<16), -1<<16)) // far out of range either way, and an int anywhere
		*f.set = bits
		if _, err := keyfuncs.ClientIP(keyfuncs.Prefixes(v4, v6)); err != nil {
			why := strings.TrimPrefix(kfProblem(err, "Prefixes"), f.arg+": ")
			why = strings.Replace(why, strconv.Itoa(bits), strconv.FormatInt(*f.bits, 10), 1)
			return nil, nil, c.fail(path+"."+f.name, "must be a prefix length: %s", why)
		}
	}
	if ident, err = keyfuncs.ClientIP(append(src[:len(src):len(src)], keyfuncs.Prefixes(v4, v6))...); err != nil {
		return nil, nil, c.fail(path, "%s", kfProblem(err, ""))
	}
	whole := append(src[:len(src):len(src)], keyfuncs.Prefixes(32, 128))
	if addr, err = keyfuncs.ClientIP(whole...); err != nil {
		return nil, nil, c.fail(path, "%s", kfProblem(err, ""))
	}
	return ident, addr, nil
}

// valueProblem is the problem of keyfuncs.ClientIP's error err when it is about the value
// given to option ("keyfuncs: FromHeader: invalid header name"), without the package's
// and the option's names; false when err is about how options combine.
func valueProblem(err error, option string) (string, bool) {
	return strings.CutPrefix(strings.TrimPrefix(err.Error(), "keyfuncs: "), option+": ")
}

// kfProblem is keyfuncs.ClientIP's error err as a problem of the file's field that gave
// option, without the package's and the option's names.
func kfProblem(err error, option string) string {
	if why, ok := valueProblem(err, option); ok {
		return why
	}
	return strings.TrimPrefix(err.Error(), "keyfuncs: ")
}
