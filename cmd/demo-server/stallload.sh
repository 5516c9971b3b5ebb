#!/usr/bin/env bash
# A stalled Redis must cost no budget: the demo server on a private Redis with
# -limit 20 -window 60s; 40 clients loop on GET /api/flaky?status=500 for 4s (5xx are
# given back: never charged); Redis gets SIGSTOP at +1s and SIGCONT at +3s. Then 25
# requests to /api/flaky?status=200 must find the budget whole: 20 x 200, 5 x 429.
# Each trial starts a fresh Redis and demo server.
# Usage: cmd/demo-server/stallload.sh [trials] [demo binary]
# The demo binary defaults to one built from this tree; pass another to compare builds.
# Needs: redis-server, redis-cli, curl, Go. Sends traffic to 127.0.0.1 only.
set -euo pipefail
cd "$(dirname "$0")/../.."
for tool in redis-server redis-cli curl go; do
	command -v "$tool" >/dev/null 2>&1 || { echo "stallload.sh needs $tool (Debian: apt-get install redis-server redis-tools curl; Go from https://go.dev/dl/)" >&2; exit 1; }
done
trials=${1:-3}; demo_bin=${2:-}
tmp=$(mktemp -d)
redis_pid=; demo=
cleanup() {
	[ -n "$redis_pid" ] && kill -CONT "$redis_pid" 2>/dev/null || true
	[ -n "$demo" ] && kill "$demo" 2>/dev/null || true
	[ -n "$redis_pid" ] && kill "$redis_pid" 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT
if [ -z "$demo_bin" ]; then
	go build -o "$tmp/demo" ./cmd/demo-server
	demo_bin=$tmp/demo
fi
go build -o "$tmp/loadgen" ./internal/loadgen
metric() { curl -s "http://127.0.0.1:$hport/metrics" | awk -v m="$1" '$1 == m || index($1, m "{") == 1 { s += $2 } END { printf "%d", s }'; }
for trial in $(seq "$trials"); do
	rport=$((20000 + RANDOM % 10000)); hport=$((rport + 1))
	redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no --dir "$tmp" --logfile "$tmp/redis.log" &
	redis_pid=$!
	for _ in $(seq 200); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.01; done
	"$demo_bin" -addr "127.0.0.1:$hport" -redis "redis://127.0.0.1:$rport/0" -limit 20 -window 60s >"$tmp/demo.log" 2>&1 &
	demo=$!
	up=
	for _ in $(seq 100); do curl -sf "http://127.0.0.1:$hport/healthz" >/dev/null && up=1 && break; sleep 0.05; done
	[ -n "$up" ] || { echo "the demo server did not answer /healthz within 5s:" >&2; cat "$tmp/demo.log" >&2; exit 1; }
	"$tmp/loadgen" -url "http://127.0.0.1:$hport/api/flaky?status=500" -c 40 -d 4s -runs 0 >"$tmp/load.out" &
	lg=$!
	sleep 1; kill -STOP "$redis_pid"
	sleep 2; kill -CONT "$redis_pid"
	wait "$lg"
	after=$(for _ in $(seq 25); do curl -s -o /dev/null -w '%{http_code}\n' "http://127.0.0.1:$hport/api/flaky?status=200"; done | sort | uniq -c | awk '{printf "%s x %s, ", $1, $2}')
	key=$(redis-cli -p "$rport" --scan --pattern 'rb-demo:*:flaky:*' | head -1)
	pttl=$(redis-cli -p "$rport" pttl "$key")
	printf 'trial %d: load %s; after: %sPTTL %s ms; settle failures %s, repairs pending %s, dropped %s\n' "$trial" \
		"$(grep '^status' "$tmp/load.out" | tr '\n' ' ')" "$after" "$pttl" \
		"$(metric ratebudget_settle_failures_total)" "$(metric ratebudget_repairs_pending)" \
		"$(metric ratebudget_repairs_dropped_total)"
	kill "$demo"; wait "$demo" 2>/dev/null || true; demo=
	kill "$redis_pid"; wait "$redis_pid" 2>/dev/null || true; redis_pid=
done
