package redistest

import (
	"syscall"
	"testing"
)

// Freeze stops the server process with SIGSTOP: connections stay open and nothing
// answers, a faithful hung store. The test's cleanup thaws it before killing it.
func (s *Server) Freeze(tb testing.TB) {
	tb.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		tb.Fatalf("redistest: SIGSTOP: %v", err)
	}
	tb.Cleanup(func() { _ = s.cmd.Process.Signal(syscall.SIGCONT) })
}

// Thaw resumes a frozen server with SIGCONT.
func (s *Server) Thaw(tb testing.TB) {
	tb.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		tb.Fatalf("redistest: SIGCONT: %v", err)
	}
}

// Kill ends the server process: new connections are refused.
func (s *Server) Kill(tb testing.TB) {
	tb.Helper()
	if err := s.cmd.Process.Kill(); err != nil {
		tb.Fatalf("redistest: kill: %v", err)
	}
}
