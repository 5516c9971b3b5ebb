//go:build !linux

package memory_test

import "time"

// threadCPU reports that the calling thread's CPU time cannot be read here (see the Linux
// version).
func threadCPU() (time.Duration, bool) { return 0, false }
