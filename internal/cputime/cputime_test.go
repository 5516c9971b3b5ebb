package cputime_test

import (
	"errors"
	"runtime"
	"testing"

	"github.com/ratebudget/ratebudget/internal/cputime"
)

// Process counts the CPU time of work done between two readings, and reports
// errors.ErrUnsupported, not a zero time, where it cannot be read.
func TestProcessAdvances(t *testing.T) {
	before, err := cputime.Process()
	if errors.Is(err, errors.ErrUnsupported) {
		t.Skipf("no process CPU time on %s", runtime.GOOS)
	}
	if err != nil {
		t.Fatal(err)
	}
	// Spin until the reading moves: the clock's resolution is coarse (a tick), and
	// how long that takes on a loaded machine is not bounded here.
	x := 0
	for {
		for i := range 1_000_000 {
			x ^= i
		}
		after, err := cputime.Process()
		if err != nil {
			t.Fatal(err)
		}
		if after < before {
			t.Fatalf("CPU time went back: %v then %v", before, after)
		}
		if after > before {
			break
		}
	}
	runtime.KeepAlive(x)
}
