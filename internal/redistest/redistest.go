// Package redistest starts a private redis-server process for tests and benchmarks that
// need a real Redis but no Docker engine.
package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is a redis-server process owned by one test.
type Server struct {
	// Addr is the server's TCP address on the loopback interface (its TLS port for a
	// server started by [StartTLS]).
	Addr string
	// CAFile is, for a server started by [StartTLS], the PEM file of the CA that signed
	// its certificate; it is "" otherwise.
	CAFile string
	cmd    *exec.Cmd
	ca     *testCA // nil without TLS
	// exited is closed when cmd has exited; line is cmd's command line after the
	// binary, for a restart.
	exited chan struct{}
	bin    string
	line   []string
	dir    string
}

// Binary returns the path of redis-server (from $REDIS_SERVER, else $PATH), or "" if
// there is none.
func Binary() string {
	if p := os.Getenv("REDIS_SERVER"); p != "" {
		return p
	}
	p, err := exec.LookPath("redis-server")
	if err != nil {
		return ""
	}
	return p
}

// Start starts a redis-server on a free loopback port, without persistence, and stops it
// when the test ends. It skips the test if there is no redis-server binary, unless
// RATEBUDGET_REQUIRE_REDIS=1, which makes that a failure. args are added to the
// server's command line (e.g. "--cluster-enabled", "yes").
func Start(tb testing.TB, args ...string) *Server {
	tb.Helper()
	return startWith(tb, "", nil, args)
}

// startWith is Start with a configuration file (e.g. a Sentinel's, which it rewrites),
// if conf is not "", first on the command line as redis-server wants it, and TLS only
// with certificates of ca if ca is not nil.
func startWith(tb testing.TB, conf string, ca *testCA, args []string) *Server {
	tb.Helper()
	bin := Binary()
	if bin == "" {
		if os.Getenv("RATEBUDGET_REQUIRE_REDIS") == "1" {
			tb.Fatal("redistest: no redis-server binary and RATEBUDGET_REQUIRE_REDIS=1")
		}
		tb.Skip("redistest: no redis-server binary in $PATH (set REDIS_SERVER)")
	}
	var lastErr error
	for range 5 { // the free port can be taken between Close and the server's bind
		s, err := start(tb, bin, conf, ca, args)
		if err == nil {
			return s
		}
		lastErr = err
	}
	tb.Fatalf("redistest: %v", lastErr)
	return nil
}

func start(tb testing.TB, bin, conf string, ca *testCA, args []string) (*Server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	dir := tb.TempDir()
	var line []string
	if conf != "" {
		line = append(line, conf)
	}
	if ca != nil {
		line = append(line, ca.args(strconv.Itoa(port))...)
	} else {
		line = append(line, "--port", strconv.Itoa(port))
	}
	line = append(line, "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir,
		"--logfile", filepath.Join(dir, "redis.log"))
	s := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), ca: ca, bin: bin, line: append(line, args...), dir: dir}
	if ca != nil {
		s.CAFile = ca.caFile
	}
	if err := s.run(); err != nil {
		return nil, err
	}
	tb.Cleanup(s.stop)
	return s, nil
}

// stop kills the server's process and waits for it to exit.
func (s *Server) stop() {
	_ = s.cmd.Process.Kill()
	<-s.exited
}

// run starts s's process with its command line and waits until it answers, as that
// process.
func (s *Server) run() error {
	cmd := exec.Command(s.bin, s.line...)
	if err := cmd.Start(); err != nil {
		return err
	}
	var waitErr error
	exited := make(chan struct{})
	go func() { waitErr = cmd.Wait(); close(exited) }()
	s.cmd, s.exited = cmd, exited
	port := s.Addr[strings.LastIndexByte(s.Addr, ':')+1:]
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, DialTimeout: time.Second, TLSConfig: s.TLSConfig()})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case <-exited:
			log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
			return fmt.Errorf("redis-server exited (%v): %s", waitErr, log)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		pid, err := c.InfoMap(ctx, "server").Result()
		cancel()
		if err == nil {
			if got := pid["Server"]["process_id"]; got != strconv.Itoa(cmd.Process.Pid) {
				s.stop()
				return fmt.Errorf("port %s answered by another process (%s)", port, got)
			}
			return nil
		}
		if time.Now().After(deadline) {
			s.stop()
			return errors.New("redis-server did not answer in 10s")
		}
		time.Sleep(10 * time.Millisecond) // polling a starting process; no event to wait on
	}
}

// Client returns a client of s configured as the limiter recommends (no retries, the
// context bounds the socket), over TLS for a server started by [StartTLS], closed when
// the test ends.
func (s *Server) Client(tb testing.TB) *redis.Client {
	c := redis.NewClient(&redis.Options{
		Addr:                  s.Addr,
		MaxRetries:            -1,
		ContextTimeoutEnabled: true,
		DialTimeout:           2 * time.Second,
		ReadTimeout:           2 * time.Second,
		WriteTimeout:          2 * time.Second,
		TLSConfig:             s.TLSConfig(),
	})
	tb.Cleanup(func() { c.Close() })
	return c
}
