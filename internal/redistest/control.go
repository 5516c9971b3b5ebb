package redistest

import "testing"

// Freeze stops the server process with SIGSTOP: connections stay open and nothing
// answers, a faithful hung store. The test's cleanup thaws it before killing it. Where
// there is no SIGSTOP (Windows, Plan 9, js), it skips the test.
func (s *Server) Freeze(tb testing.TB) {
	tb.Helper()
	if sigStop == nil {
		tb.Skip("redistest: no SIGSTOP on this platform to freeze redis-server with")
	}
	if err := s.cmd.Process.Signal(sigStop); err != nil {
		tb.Fatalf("redistest: SIGSTOP: %v", err)
	}
	tb.Cleanup(func() { _ = s.cmd.Process.Signal(sigCont) })
}

// Thaw resumes a frozen server with SIGCONT.
func (s *Server) Thaw(tb testing.TB) {
	tb.Helper()
	if sigCont == nil {
		tb.Skip("redistest: no SIGCONT on this platform to thaw redis-server with")
	}
	if err := s.cmd.Process.Signal(sigCont); err != nil {
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

// Restart kills the server process, waits for it to exit, and starts a new one with the
// same command line on the same port (empty: the server has no persistence). It
// returns once the new process answers.
func (s *Server) Restart(tb testing.TB) {
	tb.Helper()
	s.stop()
	if err := s.run(); err != nil {
		tb.Fatalf("redistest: restart: %v", err)
	}
}
