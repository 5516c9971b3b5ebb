//go:build !race

// Package israce reports whether the binary was built with the race detector, which
// allocates on its own: tests that pin allocation counts skip under it (make test runs
// them in a second pass without it).
package israce

// Enabled reports whether the race detector is on.
const Enabled = false
