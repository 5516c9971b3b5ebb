//go:build unix

package cputime

import (
	"syscall"
	"time"
)

// Process returns the CPU time this process has used, user and system, every thread
// included (the garbage collector's too). Where it cannot be read (no getrusage: Windows,
// Plan 9, js, wasip1) the error is errors.ErrUnsupported.
func Process() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, err
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}
