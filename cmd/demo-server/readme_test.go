package main

// The README's transcripts, checked: every ```console block of ../../README.md is run and
// must print what it shows.
//
// A block is a list of commands, each a line starting with "$ " (a line ending in "\"
// continues on the next one), followed by the output it prints, stdout and stderr
// together, up to the next "$ " line. All commands of a block run in one bash process,
// in the repository's root, so cd, variables and background processes persist from one
// command to the next. Outputs are compared exactly, after only two normalisations of
// what cannot reproduce: the value of every "Date:" line, and CRLF line ends (curl -i
// prints headers with CRLF). An output that does not end in a newline is a mismatch: the
// next prompt would follow it on the same line.
//
// What a block needs is declared by HTML comments (invisible on GitHub) on the lines
// directly above its fence, one item per comment:
//
//	<!-- transcript: demo FLAGS -->    a demo server with FLAGS, as `go run ./cmd/demo-server FLAGS`
//	                                   would start it, listening on the block's 127.0.0.1:8080
//	                                   (or the address of an -addr in FLAGS), stopped after
//	                                   the block
//	<!-- transcript: redis -->         a private redis-server, the block's 127.0.0.1:6379
//	                                   (redis://127.0.0.1:6379/0), stopped after the block
//	<!-- transcript: skip (REASON) --> not run (reported in the test log); for a block
//	                                   that cannot run in a test
//
// A block without a directive runs as it is. Commands keep the user-facing addresses
// and paths; the test rewrites them, in commands and in FLAGS, to private ones (and back
// in the output):
//   - every 127.0.0.1:PORT goes to the server a directive started for it, or else to a
//     free loopback port, so that a block may start its own servers;
//   - every /tmp/ goes to a directory of the test's own;
//   - `go run ./cmd/demo-server` runs this package's main (already compiled: no
//     compile races the next command), and `go build -o PATH ./cmd/demo-server`
//     installs that command at PATH.
//
// The check needs bash and curl (and redis-server for redis blocks); without them it
// skips, unless RATEBUDGET_REQUIRE_REDIS=1, which makes that a failure.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ratebudget/ratebudget/internal/redistest"
)

const readmePath = "../../README.md"

// transcript is one ```console block of the README.
type transcript struct {
	line       int      // the line of its opening fence (1-based)
	directives []string // the text of its directives, in README order
	commands   []command
}

// command is one "$ " command of a block and the output shown after it.
type command struct {
	line int    // the README line of its "$ "
	text string // without the "$ ", continuation lines joined by newlines
	want string // the lines shown after it, each ending in "\n"
}

var directiveRE = regexp.MustCompile(`^<!--\s*transcript:\s*(.*?)\s*-->$`)

// parseTranscripts reads the console blocks of a Markdown text and the directives above
// them. A directive that is not followed by a console block, or a block whose output
// precedes its first command, is an error.
func parseTranscripts(text string) ([]transcript, error) {
	lines := strings.Split(strings.ReplaceAll(text, "\r\n", "\n"), "\n")
	var out []transcript
	var pending []string // directives seen directly above the current line
	pendingLine := 0
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if m := directiveRE.FindStringSubmatch(strings.TrimSpace(l)); m != nil {
			if len(pending) == 0 {
				pendingLine = i + 1
			}
			pending = append(pending, m[1])
			continue
		}
		if strings.TrimSpace(l) != "```console" {
			if len(pending) > 0 {
				return nil, fmt.Errorf("README.md:%d: transcript directive not directly above a ```console fence", pendingLine)
			}
			continue
		}
		tr := transcript{line: i + 1, directives: pending}
		pending = nil
		i++
		for ; i < len(lines) && strings.TrimSpace(lines[i]) != "```"; i++ {
			l := lines[i]
			if !strings.HasPrefix(l, "$ ") {
				if len(tr.commands) == 0 {
					return nil, fmt.Errorf("README.md:%d: output before the block's first \"$ \" command", i+1)
				}
				tr.commands[len(tr.commands)-1].want += l + "\n"
				continue
			}
			c := command{line: i + 1, text: strings.TrimPrefix(l, "$ ")}
			for strings.HasSuffix(c.text, `\`) && i+1 < len(lines) {
				i++
				c.text += "\n" + lines[i]
			}
			tr.commands = append(tr.commands, c)
		}
		if i == len(lines) {
			return nil, fmt.Errorf("README.md:%d: console block not closed", tr.line)
		}
		if len(tr.commands) == 0 {
			return nil, fmt.Errorf("README.md:%d: console block without a \"$ \" command", tr.line)
		}
		out = append(out, tr)
	}
	if len(pending) > 0 {
		return nil, fmt.Errorf("README.md:%d: transcript directive not directly above a ```console fence", pendingLine)
	}
	return out, nil
}

func TestReadmeTranscripts(t *testing.T) {
	src, err := os.ReadFile(readmePath)
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := parseTranscripts(string(src))
	if err != nil {
		t.Fatal(err)
	}
	if len(blocks) == 0 {
		t.Fatal("README.md has no ```console block: the parser or the README changed")
	}
	needSignals(t) // the transcripts' processes are a process group, killed whole
	for _, tool := range []string{"bash", "curl"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("RATEBUDGET_REQUIRE_REDIS") == "1" {
				t.Fatalf("the README's transcripts need %s, which is not in $PATH (RATEBUDGET_REQUIRE_REDIS=1)", tool)
			}
			t.Skipf("the README's transcripts need %s, which is not in $PATH", tool)
		}
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	demo := demoCommand(t)
	for _, b := range blocks {
		t.Run(fmt.Sprintf("README.md:%d", b.line), func(t *testing.T) {
			runTranscript(t, b, root, demo)
		})
	}
}

// demoCommand writes a script that runs this test binary as the demo server (see
// TestMain) and returns its path.
func demoCommand(t *testing.T) string {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "demo-server")
	script := "#!/bin/sh\n" + mainEnv + "=1 exec " + shellQuote(exe) + " \"$@\"\n"
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

var (
	loopbackRE = regexp.MustCompile(`127\.0\.0\.1:[0-9]+`)
	tmpRE      = regexp.MustCompile(`(^|[^\w./-])/tmp/`)
	goRunRE    = regexp.MustCompile(`\bgo run \./cmd/demo-server\b`)
	goBuildRE  = regexp.MustCompile(`\bgo build -o (\S+) \./cmd/demo-server\b`)
	dateRE     = regexp.MustCompile(`(?m)^Date: .*$`)
)

// rewriter maps the README's addresses and paths to the test's and back.
type rewriter struct {
	addrs   map[string]string // user-facing 127.0.0.1:PORT → the real one
	tmp     string            // the directory that stands for /tmp
	demoCmd string            // the demo server's command
}

func (r *rewriter) command(s string) string {
	s = loopbackRE.ReplaceAllStringFunc(s, func(a string) string {
		if real, ok := r.addrs[a]; ok {
			return real
		}
		return a
	})
	s = tmpRE.ReplaceAllString(s, "${1}"+strings.ReplaceAll(r.tmp, "$", "$$")+"/")
	s = goBuildRE.ReplaceAllString(s, "cp "+strings.ReplaceAll(shellQuote(r.demoCmd), "$", "$$")+" $1")
	return goRunRE.ReplaceAllString(s, shellQuote(r.demoCmd))
}

func (r *rewriter) output(s string) string {
	s = loopbackRE.ReplaceAllStringFunc(s, func(a string) string {
		for user, real := range r.addrs {
			if real == a {
				return user
			}
		}
		return a
	})
	return strings.ReplaceAll(s, r.tmp+"/", "/tmp/")
}

// reserve maps every user-facing loopback address of cmds that no server holds yet to
// a free loopback port.
func (r *rewriter) reserve(t *testing.T, cmds ...string) {
	for _, c := range cmds {
		for _, a := range loopbackRE.FindAllString(c, -1) {
			if _, ok := r.addrs[a]; !ok {
				r.addrs[a] = freeAddr(t)
			}
		}
	}
}

func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func runTranscript(t *testing.T, b transcript, root, demoCmd string) {
	rw := &rewriter{addrs: map[string]string{}, tmp: t.TempDir(), demoCmd: demoCmd}
	// Redis first: a demo's -redis flag names it.
	var demos [][]string
	for _, d := range b.directives {
		f := strings.Fields(d)
		switch {
		case strings.HasPrefix(d, "skip"):
			t.Logf("README.md:%d not run: %s", b.line, d)
			return
		case len(f) == 1 && f[0] == "redis":
			if _, ok := rw.addrs["127.0.0.1:6379"]; ok {
				t.Fatalf("README.md:%d: two redis directives", b.line)
			}
			rw.addrs["127.0.0.1:6379"] = redistest.Start(t).Addr
		case len(f) > 0 && f[0] == "demo":
			demos = append(demos, f[1:])
		default:
			t.Fatalf("README.md:%d: unknown transcript directive %q (want demo FLAGS, redis or skip (REASON))", b.line, d)
		}
	}
	for _, flags := range demos {
		startTranscriptDemo(t, b.line, rw, flags)
	}
	var cmds []string
	for _, c := range b.commands {
		cmds = append(cmds, c.text)
	}
	rw.reserve(t, cmds...)

	// One script: each command, then a marker line with its index and exit status.
	marker := "transcript-marker-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	var script strings.Builder
	script.WriteString("exec 2>&1\ncd " + shellQuote(root) + " || exit 1\n")
	for i, c := range b.commands {
		fmt.Fprintf(&script, "%s\nprintf '%%s %%d %%d\\n' %s %d $?\n", rw.command(c.text), marker, i)
	}
	got, err := runBash(t, script.String())
	if err != nil {
		t.Fatalf("README.md:%d: %v\noutput so far:\n%s", b.line, err, rw.output(got))
	}
	outs, statuses := splitByMarker(got, marker, len(b.commands))
	for i, c := range b.commands {
		if i >= len(statuses) { // the block's shell ended in or before this command
			t.Errorf("README.md:%d: $ %s\ndid not finish (the block's shell ended); its output:\n%s",
				c.line, c.text, rw.output(strings.Join(outs[i:], "")))
			break
		}
		out := rw.output(outs[i])
		want, have := normalise(c.want), normalise(out)
		if want == have {
			continue
		}
		msg := fmt.Sprintf("README.md:%d: $ %s\n(exit status %s)\n", c.line, c.text, statuses[i])
		if have != "" && !strings.HasSuffix(have, "\n") {
			msg += "the output does not end in a newline (the next prompt would follow it on the same line)\n"
		}
		t.Errorf("%s--- README\n+++ run\n%s", msg, lineDiff(want, have))
	}
}

// startTranscriptDemo runs the demo in process with a directive's flags until the test
// ends, on a free port standing for the flags' -addr (default 127.0.0.1:8080).
func startTranscriptDemo(t *testing.T, line int, rw *rewriter, flags []string) {
	user := "127.0.0.1:8080"
	var args []string
	for i := 0; i < len(flags); i++ {
		f := flags[i]
		switch {
		case (f == "-addr" || f == "--addr") && i+1 < len(flags):
			user = flags[i+1]
			i++
		case strings.HasPrefix(f, "-addr=") || strings.HasPrefix(f, "--addr="):
			user = f[strings.Index(f, "=")+1:]
		default:
			args = append(args, f)
		}
	}
	if _, ok := rw.addrs[user]; ok {
		t.Fatalf("README.md:%d: two servers for %s", line, user)
	}
	rw.reserve(t, args...) // e.g. a -redis URL without a redis directive: nothing there
	for i := range args {
		args[i] = rw.command(args[i])
	}
	t.Logf("README.md:%d: demo-server %s", line, strings.Join(flags, " "))
	rw.addrs[user] = strings.TrimPrefix(startDemo(t, args...), "http://")
	waitHealthy(t, "http://"+rw.addrs[user]+"/healthz")
}

// waitHealthy polls url until it answers 200, for at most 30 seconds.
func waitHealthy(t *testing.T, url string) {
	c := &http.Client{Timeout: 5 * time.Second}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := c.Get(url)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			err = fmt.Errorf("status %d", resp.StatusCode)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not answer 200 within 30s: %v", url, err)
		}
		time.Sleep(20 * time.Millisecond) // polling a server for readiness; no event to wait on
	}
}

// runBash runs script in a bash process of its own process group and returns what it
// printed. Processes the script leaves running are killed when it ends; the whole group
// is killed if the script runs for longer than two minutes.
func runBash(t *testing.T, script string) (string, error) {
	outPath := filepath.Join(t.TempDir(), "output")
	out, err := os.Create(outPath)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "--noprofile", "--norc", "-c", script)
	cmd.Stdin = nil
	// A file, not a pipe: processes left in the background cannot hold Wait up.
	cmd.Stdout, cmd.Stderr = out, out
	// curl must not send the test's loopback traffic to a proxy from the environment.
	cmd.Env = append(os.Environ(), "no_proxy=127.0.0.1,localhost", "NO_PROXY=127.0.0.1,localhost")
	inGroup(cmd)
	runErr := cmd.Run()
	if cmd.Process != nil {
		_ = killGroup(cmd)
	}
	got, err := os.ReadFile(outPath)
	if err != nil {
		t.Fatal(err)
	}
	if ctx.Err() != nil {
		return string(got), errors.New("the block did not finish within 2 minutes")
	}
	var ee *exec.ExitError
	if runErr != nil && !errors.As(runErr, &ee) {
		return string(got), runErr
	}
	return string(got), nil
}

// splitByMarker cuts a script's output at the marker lines written after each command,
// returning each command's output and exit status. A command whose output does not end
// in a newline has the marker on its last line; that output is returned without one.
func splitByMarker(s, marker string, n int) (outs, statuses []string) {
	for i := range n {
		tag := fmt.Sprintf("%s %d ", marker, i)
		j := strings.Index(s, tag)
		if j < 0 {
			outs = append(outs, s)
			return outs, statuses
		}
		outs = append(outs, s[:j])
		rest := s[j+len(tag):]
		k := strings.IndexByte(rest, '\n')
		if k < 0 {
			k = len(rest)
		}
		statuses = append(statuses, rest[:k])
		s = strings.TrimPrefix(rest[k:], "\n")
	}
	return outs, statuses
}

func normalise(s string) string {
	s = strings.ReplaceAll(s, "\r\n", "\n")
	return dateRE.ReplaceAllString(s, "Date: (any)")
}

// lineDiff is a line-by-line diff of want and got: common lines indented, lines only in
// want marked "-", lines only in got "+".
func lineDiff(want, got string) string {
	a := strings.SplitAfter(want, "\n")
	b := strings.SplitAfter(got, "\n")
	// lcs[i][j]: the length of the longest common subsequence of a[i:] and b[j:].
	lcs := make([][]int, len(a)+1)
	for i := range lcs {
		lcs[i] = make([]int, len(b)+1)
	}
	for i := len(a) - 1; i >= 0; i-- {
		for j := len(b) - 1; j >= 0; j-- {
			if a[i] == b[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	var d strings.Builder
	line := func(prefix, l string) {
		if l == "" {
			return
		}
		if !strings.HasSuffix(l, "\n") {
			l += "\n\\ no newline at end\n"
		}
		d.WriteString(prefix + l)
	}
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case i < len(a) && j < len(b) && a[i] == b[j]:
			line("  ", a[i])
			i, j = i+1, j+1
		case i < len(a) && (j == len(b) || lcs[i+1][j] >= lcs[i][j+1]):
			line("- ", a[i])
			i++
		default:
			line("+ ", b[j])
			j++
		}
	}
	return d.String()
}

func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// The parser and the diff are what a README author meets first when a block is wrong.
func TestReadmeTranscriptParser(t *testing.T) {
	md := "text\n<!-- transcript: redis -->\n<!-- transcript: demo -limit 3 -->\n```console\n" +
		"$ echo a \\\n  b\na b\n$ true\n```\n\n```console\n$ echo x\nx\n\n```\n"
	got, err := parseTranscripts(md)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].line != 4 || len(got[0].directives) != 2 || got[0].directives[1] != "demo -limit 3" ||
		len(got[0].commands) != 2 || got[0].commands[0].text != "echo a \\\n  b" || got[0].commands[0].want != "a b\n" ||
		got[0].commands[1].want != "" || got[1].commands[0].want != "x\n\n" || len(got[1].directives) != 0 {
		t.Fatalf("parsed %+v", got)
	}
	for _, bad := range []string{
		"<!-- transcript: demo -->\ntext\n```console\n$ true\n```\n", // directive away from its block
		"```console\nout\n$ true\n```\n",                             // output before a command
		"```console\n$ true\n",                                       // not closed
		"```console\n```\n",                                          // no command
	} {
		if _, err := parseTranscripts(bad); err == nil {
			t.Errorf("parsed %q without error", bad)
		}
	}
	outs, st := splitByMarker("a\nM 0 0\nbM 1 1\nM 2 0\n", "M", 3)
	if len(outs) != 3 || outs[0] != "a\n" || outs[1] != "b" || outs[2] != "" || st[1] != "1" {
		t.Fatalf("split %q %q", outs, st)
	}
	if d := lineDiff("x\ny\n", "x\nz\n"); d != "  x\n- y\n+ z\n" {
		t.Fatalf("diff %q", d)
	}
}

// TestReadmeIsShort: the README is for users, at most 250 lines; evidence and figures
// belong in docs/.
func TestReadmeIsShort(t *testing.T) {
	src, err := os.ReadFile(readmePath)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(src), "\n"); n > 250 {
		t.Fatalf("README.md has %d lines, at most 250: move detail to docs/", n)
	}
}
