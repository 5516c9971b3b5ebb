//go:build unix

package main

import (
	"os/exec"
	"syscall"
	"testing"
)

// needSignals lets t run: here signals can be sent to a process or its group, and its
// exit status tells which one ended it.
func needSignals(*testing.T) {}

// inGroup starts cmd in a process group of its own, killed whole when cmd's context ends.
func inGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return killGroup(cmd) }
}

// killGroup kills the process group of a started cmd (see inGroup), so that the
// processes it left running end too.
func killGroup(cmd *exec.Cmd) error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
