//go:build unix

package redistest

import (
	"os"
	"syscall"
)

// sigStop and sigCont freeze and thaw a process (see Server.Freeze).
var sigStop, sigCont os.Signal = syscall.SIGSTOP, syscall.SIGCONT
