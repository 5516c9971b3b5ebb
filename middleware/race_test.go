//go:build race

package middleware_test

// raceEnabled: the race detector allocates on its own, so allocation counts are
// asserted only without it (make test runs those tests in a second pass).
const raceEnabled = true
