package redistest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// DocumentedACL returns the ACL rules that docs/FAILURE.md gives the limiter's Redis
// user, as ACL SETUSER's arguments after the user name, for keys under prefix (the
// doc's myapp) and with password (the doc's PASSWORD), for the server [Binary] runs:
// rules, from the doc's first "ACL SETUSER limiter" command, with the second's
// (+client|setinfo) where the server has CLIENT SETINFO (Valkey, Redis 7.2 or later),
// and cluster, from its third, the rules a *redis.ClusterClient needs in addition.
func DocumentedACL(tb testing.TB, prefix, password string) (rules, cluster []any) {
	tb.Helper()
	rules, identity, cluster := DocumentedACLCommands(tb, prefix, password)
	if HasClientSetinfo(tb) {
		rules = append(rules, identity...)
	}
	return rules, cluster
}

// DocumentedACLCommands returns the arguments of docs/FAILURE.md's three "ACL SETUSER
// limiter" commands as they stand (see [DocumentedACL]): a server's rules, the rule for
// CLIENT SETINFO, and a cluster's additional rules.
func DocumentedACLCommands(tb testing.TB, prefix, password string) (rules, identity, cluster []any) {
	tb.Helper()
	_, file, _, _ := runtime.Caller(0)
	doc, err := os.ReadFile(filepath.Join(filepath.Dir(file), "..", "..", "docs", "FAILURE.md"))
	if err != nil {
		tb.Fatalf("redistest: %v", err)
	}
	var commands [][]any
	var cur []any
	in := false
	for _, line := range strings.Split(string(doc), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "```"):
			if cur != nil {
				commands = append(commands, cur)
				cur = nil
			}
			in = !in
		case in && strings.HasPrefix(line, "ACL SETUSER limiter "):
			cur = []any{}
			line = strings.TrimPrefix(line, "ACL SETUSER limiter ")
			fallthrough
		case in && cur != nil:
			for _, f := range strings.Fields(line) {
				f = strings.ReplaceAll(f, "myapp", prefix)
				f = strings.ReplaceAll(f, ">PASSWORD", ">"+password)
				cur = append(cur, f)
			}
		}
	}
	if len(commands) != 3 {
		tb.Fatalf("redistest: docs/FAILURE.md has %d ACL SETUSER limiter commands, want 3 (one server's, CLIENT SETINFO's, a cluster's)", len(commands))
	}
	return commands[0], commands[1], commands[2]
}

// HasClientSetinfo reports whether the server [Binary] runs has CLIENT SETINFO, which
// go-redis sends on every new connection: Valkey, and Redis 7.2 or later. Redis 7.0
// has not, and refuses an ACL rule that names it.
func HasClientSetinfo(tb testing.TB) bool {
	tb.Helper()
	bin := Binary()
	if bin == "" {
		return false
	}
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		tb.Fatalf("redistest: %s --version: %v", bin, err)
	}
	// "Redis server v=7.0.15 sha=..." or "Valkey server v=8.0.1 sha=..."
	text := string(out)
	if strings.HasPrefix(text, "Valkey ") {
		return true
	}
	_, v, _ := strings.Cut(text, " v=")
	major, rest, _ := strings.Cut(v, ".")
	minor, _, _ := strings.Cut(rest, ".")
	ma, _ := strconv.Atoi(major)
	mi, _ := strconv.Atoi(minor)
	return ma > 7 || ma == 7 && mi >= 2
}

// ErrorReplies returns how many error replies starting with code (e.g. "NOPERM") the
// server has sent since it started or since CONFIG RESETSTAT (INFO errorstats).
func (s *Server) ErrorReplies(tb testing.TB, code string) int64 {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	a := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, TLSConfig: s.TLSConfig()})
	defer a.Close()
	stats, err := a.InfoMap(ctx, "errorstats").Result()
	if err != nil {
		tb.Fatalf("redistest: INFO errorstats: %v", err)
	}
	_, num, _ := strings.Cut(stats["Errorstats"]["errorstat_"+code], "=") // count=3
	n, _ := strconv.ParseInt(num, 10, 64)
	return n
}
