package integration_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratebudget/ratebudget"
	"github.com/ratebudget/ratebudget/internal/algname"
	"github.com/ratebudget/ratebudget/lua"
)

const (
	processes    = 8
	trials       = 20
	perProcess   = 3 // requests each process sends per trial
	processLimit = 5
	// processWindow is far longer than a trial can take (a token every 12 minutes), so
	// that exactly the limit is admitted however slow the machine.
	processWindow  = time.Hour
	protocolPrefix = "@@ "
	// processTimeout bounds every Redis command of the test and of its children, and
	// each trial. The test asserts exactness, not speed: under -race, with 8 children
	// and other builds on 2 cores, a reply can take seconds.
	processTimeout = time.Minute
)

// processClient is a client whose timeouts allow for a starved machine.
func processClient(addr string) *redis.Client {
	opts := clientOptions(addr, 4)
	opts.DialTimeout = processTimeout
	opts.ReadTimeout = processTimeout
	opts.WriteTimeout = processTimeout
	opts.PoolTimeout = processTimeout
	return redis.NewClient(opts)
}

// TestCrossProcess: 8 OS processes, each with its own client, fire together at one
// budget; exactly the limit is admitted in every trial, for every time rule. The
// children are reused across trials; a Redis list releases them together.
func TestCrossProcess(t *testing.T) {
	requireRedis(t)
	control := processClient(redisAddr)
	t.Cleanup(func() { control.Close() })
	prefix := uniquePrefix(t)
	type child struct {
		cmd   *exec.Cmd
		stdin io.WriteCloser
		out   *bufio.Scanner
	}
	children := make([]child, processes)
	// At the end every child sees its input close, and all exit together (a -race
	// binary waits a second before it exits).
	t.Cleanup(func() {
		for _, c := range children {
			if c.cmd != nil {
				c.stdin.Close()
			}
		}
		for _, c := range children {
			if c.cmd != nil {
				_ = c.cmd.Wait()
			}
		}
	})
	for i := range children {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
		cmd.Env = append(os.Environ(), helperEnv+"=1", "RATEBUDGET_HELPER_ADDR="+redisAddr, "RATEBUDGET_HELPER_PREFIX="+prefix)
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		children[i] = child{cmd, stdin, bufio.NewScanner(stdout)}
	}
	// readLine returns the child's next protocol line; the child's other output (its
	// test log, which says why it failed) is logged.
	readLine := func(c child) string {
		for c.out.Scan() {
			if line, ok := strings.CutPrefix(c.out.Text(), protocolPrefix); ok {
				return line
			}
			t.Logf("child %d: %s", c.cmd.Process.Pid, c.out.Text())
		}
		t.Fatalf("child %d exited: %v", c.cmd.Process.Pid, c.out.Err())
		return ""
	}
	start := time.Now()
	for _, alg := range []ratebudget.Algorithm{ratebudget.FixedWindow, ratebudget.TokenBucket, ratebudget.RollingWindow} {
		for trial := range trials {
			// One bound per trial, not for the whole test: the test may take as long as
			// the machine needs.
			ctx, cancel := context.WithTimeout(context.Background(), processTimeout)
			defer cancel()
			release := fmt.Sprintf("%s:release:%v:%d", prefix, alg, trial)
			for _, c := range children {
				fmt.Fprintf(c.stdin, "%d %d %s\n", alg, trial, release)
			}
			for _, c := range children {
				if line := readLine(c); line != "ready" {
					t.Fatalf("child: %q, want ready", line)
				}
			}
			// All children wait in BLPOP: one command releases them together.
			tokens := make([]any, processes)
			for i := range tokens {
				tokens[i] = "go"
			}
			if err := control.RPush(ctx, release, tokens...).Err(); err != nil {
				t.Fatal(err)
			}
			admitted := 0
			for _, c := range children {
				line := readLine(c)
				n, err := strconv.Atoi(strings.TrimPrefix(line, "admitted "))
				if err != nil {
					t.Fatalf("child: %q", line)
				}
				admitted += n
			}
			if admitted != processLimit {
				t.Fatalf("%s trial %d: %d processes × %d requests admitted %d, want exactly %d", algname.Of(alg), trial, processes, perProcess, admitted, processLimit)
			}
		}
	}
	t.Logf("%d processes, %d trials × 3 time rules: exactly %d admitted each time (%v)", processes, trials, processLimit, time.Since(start).Round(time.Millisecond))
}

// TestHelperProcess is a child of TestCrossProcess; it does nothing in a normal run.
// It reads "<algorithm> <trial> <release key>" lines, reports ready, waits for the
// release, spends and reports how many requests were admitted.
func TestHelperProcess(t *testing.T) {
	if os.Getenv(helperEnv) != "1" {
		t.Skip("runs only as a child of TestCrossProcess")
	}
	c := processClient(os.Getenv("RATEBUDGET_HELPER_ADDR"))
	defer c.Close()
	l, err := lua.New(c, lua.WithPrefix(os.Getenv("RATEBUDGET_HELPER_PREFIX")))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		var alg, trial int
		var release string
		if _, err := fmt.Sscanf(in.Text(), "%d %d %s", &alg, &trial, &release); err != nil {
			t.Fatal(err)
		}
		rule := ratebudget.Rule{Name: "xproc", Algorithm: ratebudget.Algorithm(alg), Limit: processLimit, Window: processWindow}
		checks := []ratebudget.Check{{Rule: rule, Identity: fmt.Sprintf("trial-%d", trial), Cost: 1}}
		fmt.Println(protocolPrefix + "ready")
		// The release comes once every child is ready: on the first trial, once the
		// slowest child has started.
		if err := c.BLPop(ctx, processTimeout, release).Err(); err != nil {
			t.Fatal(err)
		}
		admitted := 0
		for range perProcess {
			d, err := l.Allow(ctx, checks)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				admitted++
			}
		}
		fmt.Printf("%sadmitted %d\n", protocolPrefix, admitted)
	}
}
