package memory_test

import (
	"syscall"
	"time"
	"unsafe"
)

// threadCPU returns the CPU time the calling thread has used (CLOCK_THREAD_CPUTIME_ID),
// which, unlike wall time, does not count the time the thread waited for a CPU: on a
// shared machine it tells the work of one call from the other processes' load. The
// caller must hold its thread (runtime.LockOSThread). ok is false where the clock cannot
// be read.
func threadCPU() (d time.Duration, ok bool) {
	const clockThreadCPUTime = 3
	var ts syscall.Timespec
	if _, _, errno := syscall.RawSyscall(syscall.SYS_CLOCK_GETTIME, clockThreadCPUTime, uintptr(unsafe.Pointer(&ts)), 0); errno != 0 {
		return 0, false
	}
	return time.Duration(ts.Nano()), true
}
