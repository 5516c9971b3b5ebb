//go:build !unix

package cputime

import (
	"errors"
	"time"
)

// Process reports errors.ErrUnsupported: there is no getrusage here (see the Unix
// version).
func Process() (time.Duration, error) { return 0, errors.ErrUnsupported }
