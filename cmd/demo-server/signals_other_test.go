//go:build !unix

package main

import (
	"os/exec"
	"testing"
)

// needSignals skips t: here no signal but a kill can be sent to a process, there are no
// process groups, and an exit status does not tell that a signal ended the process.
func needSignals(t *testing.T) {
	t.Helper()
	t.Skip("needs Unix signals and process groups")
}

// inGroup leaves cmd as it is: there are no process groups here (see needSignals).
func inGroup(*exec.Cmd) {}

// killGroup kills cmd's process alone (see inGroup).
func killGroup(cmd *exec.Cmd) error { return cmd.Process.Kill() }
