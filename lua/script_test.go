package lua

import (
	"context"
	"strings"
	"testing"

	"github.com/ratebudget/ratebudget/internal/redistest"
)

// TestAllowScriptArguments: allow.lua refuses, before writing anything, a window or cost
// that is not a plain decimal (it passes both on to SET, PEXPIRE, INCRBY and rolling-window
// members as they are), and accepts the plain forms.
func TestAllowScriptArguments(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	for _, alg := range []string{"0", "1", "2"} {
		for _, bad := range [][2]string{{"60000.0", "1"}, {"6e4", "1"}, {"060000", "1"}, {" 60000", "1"}, {"60000", "1.0"}, {"60000", "1e0"}, {"60000", "0x1"}, {"60000", "02"}} {
			w, k := bad[0], bad[1]
			err := c.Eval(ctx, allowSource, []string{"k" + alg}, "1", alg, "10", w, "10", k).Err()
			if err == nil || !strings.Contains(err.Error(), "bad argument for check 1") {
				t.Errorf("algorithm %s, window %q, cost %q: %v; want a bad-argument error", alg, w, k, err)
			}
		}
		if n := c.Exists(ctx, "k"+alg).Val(); n != 0 {
			t.Errorf("algorithm %s: a refused call wrote its key", alg)
		}
		v, err := c.Eval(ctx, allowSource, []string{"k" + alg}, "1", alg, "10", "60000", "10", "2").Int64Slice()
		if err != nil || len(v) != 6 || v[0] != 1 || v[2] != 8 {
			t.Errorf("algorithm %s, plain arguments: %v, %v; want admitted with 8 remaining", alg, v, err)
		}
	}
}
