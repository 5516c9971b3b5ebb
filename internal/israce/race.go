//go:build race

package israce

// Enabled reports whether the race detector is on.
const Enabled = true
