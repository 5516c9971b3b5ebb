package keyfuncs

import (
	"encoding/base64"
	"strings"
	"testing"
)

// FuzzCredentials: the canonical spelling is a fixed point, is empty only for an empty
// value, and keeps the base64 of a Basic credential decoding to the same bytes.
func FuzzCredentials(f *testing.F) {
	for _, s := range []string{
		"Bearer abc", " bearer \t abc ", "Basic YWxpY2U6cHd=", "basic YWxpY2U6cHc", "Bearer a.b.c",
		"DPoP eyJ9.eyJ9.c2lnbmF0dXJl=", "Digest a=\"b\", c=d", "sk_live", "Bearer", "B\u00a0x",
		"Basic ==", "Bearer a..b", "Bearer .....", "x\xff y",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		c := credentials(v)
		if again := credentials(c); again != c {
			t.Fatalf("%q: canonical %q is read as %q", v, c, again)
		}
		if (c == "") != (strings.TrimSpace(v) == "") {
			t.Fatalf("%q: canonical %q", v, c)
		}
		scheme, rest, ok := strings.Cut(c, " ")
		if !ok || scheme != "Basic" {
			return
		}
		in := strings.Fields(v)
		if len(in) != 2 {
			return
		}
		want, err := base64.StdEncoding.DecodeString(in[1])
		if err != nil {
			return
		}
		if got, err := base64.StdEncoding.Strict().DecodeString(rest); err != nil || string(got) != string(want) {
			t.Fatalf("%q: canonical %q decodes to (%q, %v), want %q", v, c, got, err, want)
		}
	})
}
