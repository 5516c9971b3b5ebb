//go:build !unix

package redistest

import "os"

// sigStop and sigCont are nil where a process cannot be frozen (see Server.Freeze).
var sigStop, sigCont os.Signal
