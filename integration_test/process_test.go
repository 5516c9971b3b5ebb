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
	"github.com/ratebudget/ratebudget/lua"
)

const (
	processes      = 8
	trials         = 20
	perProcess     = 3 // requests each process sends per trial
	processLimit   = 5
	processWindow  = time.Minute
	protocolPrefix = "@@ "
)

// TestCrossProcess: 8 OS processes, each with its own client, fire together at one
// budget; exactly the limit is admitted in every trial, for every time rule. The
// children are reused across trials; a Redis list releases them together.
func TestCrossProcess(t *testing.T) {
	requireRedis(t)
	control := newClient(t, 4)
	prefix := uniquePrefix(t)
	type child struct {
		cmd   *exec.Cmd
		stdin io.WriteCloser
		out   *bufio.Scanner
	}
	children := make([]child, processes)
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
		t.Cleanup(func() {
			stdin.Close()
			_ = cmd.Wait()
		})
	}
	// readLine returns the child's next protocol line.
	readLine := func(c child) string {
		for c.out.Scan() {
			if line, ok := strings.CutPrefix(c.out.Text(), protocolPrefix); ok {
				return line
			}
		}
		t.Fatalf("child exited: %v", c.out.Err())
		return ""
	}
	ctx := ctxT(t)
	start := time.Now()
	for _, alg := range []ratebudget.Algorithm{ratebudget.FixedWindow, ratebudget.TokenBucket, ratebudget.RollingWindow} {
		for trial := range trials {
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
				t.Fatalf("%v trial %d: %d processes × %d requests admitted %d, want exactly %d", alg, trial, processes, perProcess, admitted, processLimit)
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
	c := redis.NewClient(clientOptions(os.Getenv("RATEBUDGET_HELPER_ADDR"), 4))
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
		if err := c.BLPop(ctx, 10*time.Second, release).Err(); err != nil {
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
