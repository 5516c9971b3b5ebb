package meta

import (
	"math"
	"testing"
	"time"
)

func TestStructuredFieldValues(t *testing.T) {
	t.Parallel()
	policy := appendPolicy(nil, &Info{Policy: "a\"b\\c\x01", Limit: 7, Window: 1500 * time.Millisecond})
	if got, want := string(policy), `"a\"b\\c";q=7;w=2`; got != want {
		t.Errorf("policy item = %s, want %s", got, want)
	}
	rl := appendRateLimit(nil, &Info{Policy: "api", Remaining: -1, Available: 1500 * time.Millisecond}, true)
	if got, want := string(rl), `"api";r=0;t=2`; got != want {
		t.Errorf("draft-10 RateLimit item = %s, want %s", got, want)
	}
}

// The IETF fields are RFC 9651 structured fields, whose integers have at most 15 digits:
// a larger q or r would make a recipient discard the whole field, so they are clamped
// to the largest sf-integer.
func TestStructuredFieldIntegerRange(t *testing.T) {
	t.Parallel()
	in := &Info{Policy: "p", Limit: math.MaxInt64, Remaining: 1e15, Window: time.Duration(math.MaxInt64), Available: time.Duration(math.MaxInt64)}
	if got, want := string(appendPolicy(nil, in)), `"p";q=999999999999999;w=9223372037`; got != want {
		t.Errorf("policy item = %s, want %s", got, want)
	}
	if got, want := string(appendRateLimit(nil, in, false)), `"p";r=999999999999999;t=9223372036`; got != want {
		t.Errorf("RateLimit item = %s, want %s", got, want)
	}
	in.Remaining = 999999999999999
	if got, want := string(appendRateLimit(nil, in, true)), `"p";r=999999999999999;t=9223372037`; got != want {
		t.Errorf("draft-10 RateLimit item = %s, want %s", got, want)
	}
}
