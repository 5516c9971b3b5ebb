#!/usr/bin/env bash
# The circuit breaker under a starved host: the demo server on a private Redis, loaded by
# internal/loadgen over loopback.
#   1. Redis healthy, busy loops on every core: how many requests got 503 (none should:
#      the store is fine, only the host is slow).
#   2. Redis stopped for 4s, then started again on the same port, no busy loops: how long
#      after Redis answered PING again requests still got 503 (the breaker's recovery).
#   3. The same stop with busy loops: the slowest answer while Redis is down.
# Usage: cmd/demo-server/faultload.sh [demo binary] [busy loops] [clients]
# The demo binary defaults to one built from this tree; pass another to compare builds.
# Needs: redis-server, redis-cli, curl, Go. Sends traffic to 127.0.0.1 only.
set -euo pipefail
cd "$(dirname "$0")/../.."
for tool in redis-server redis-cli curl go; do
	command -v "$tool" >/dev/null 2>&1 || { echo "faultload.sh needs $tool (Debian: apt-get install redis-server redis-tools curl; Go from https://go.dev/dl/)" >&2; exit 1; }
done
tmp=$(mktemp -d)
demo_bin=${1:-}; hogs=${2:-4}; clients=${3:-32}
rport=$((20000 + RANDOM % 10000)); hport=$((rport + 1))
hog_pids=()
stop_hogs() { for p in "${hog_pids[@]}"; do kill "$p" 2>/dev/null || true; done; hog_pids=(); }
start_hogs() { for _ in $(seq "$hogs"); do (while :; do :; done) & hog_pids+=($!); done; }
cleanup() {
	stop_hogs
	[ -n "${demo:-}" ] && kill "$demo" 2>/dev/null
	redis-cli -p "$rport" shutdown nosave >/dev/null 2>&1 || true
	rm -rf "$tmp"
}
trap cleanup EXIT
if [ -z "$demo_bin" ]; then
	go build -o "$tmp/demo" ./cmd/demo-server
	demo_bin=$tmp/demo
fi
go build -o "$tmp/loadgen" ./internal/loadgen
start_redis() {
	redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no --dir "$tmp" --logfile "$tmp/redis.log" --daemonize yes
	for _ in $(seq 200); do redis-cli -p "$rport" ping >/dev/null 2>&1 && return; sleep 0.01; done
	echo "redis did not start" >&2; exit 1
}
start_redis
"$demo_bin" -addr "127.0.0.1:$hport" -redis "redis://127.0.0.1:$rport/0" -limit 1000000000 -window 1h >"$tmp/demo.log" 2>&1 &
demo=$!
up=
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$hport/healthz" >/dev/null && up=1 && break; sleep 0.05; done
[ -n "$up" ] || { echo "the demo server did not answer /healthz within 5s:" >&2; cat "$tmp/demo.log" >&2; exit 1; }
url="http://127.0.0.1:$hport/api/hello"
transitions() { curl -s "http://127.0.0.1:$hport/metrics" | awk '/^ratebudget_breaker_transitions_total/ {printf "%s ", $0}'; echo; }

echo "== 1. Redis healthy, $hogs busy loops, $clients clients, 10s"
start_hogs
"$tmp/loadgen" -url "$url" -c "$clients" -d 10s -runs 0 | grep -v '^('
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
stop_hogs
echo "breaker transitions so far: $(transitions)"

fault() { # args: label; prints what the stop did
	"$tmp/loadgen" -url "$url" -c "$clients" -d 11s -runs 0 -samples "$tmp/samples" >"$tmp/fault.out" &
	local lg=$!
	sleep 3
	local stopped up
	stopped=$(date +%s%3N)
	redis-cli -p "$rport" shutdown nosave >/dev/null 2>&1 || true
	sleep 4
	start_redis
	up=$(date +%s%3N)
	wait "$lg"
	grep -v '^(' "$tmp/fault.out"
	awk -v s="$stopped" -v u="$up" '
		$1 >= s && $1 < u && $3 > slow { slow = $3 }
		$1 >= s && $2 != 200 && first == "" { first = $1 }
		$1 >= u && $2 != 200 { last = $1; n++ }
		END {
			printf "Redis down from +0 to +%d ms (PING answered); first non-200 at +%d ms; slowest answer while down %.0f ms\n", u - s, first - s, slow
			if (n) printf "after PING: %d non-200 answers, the last %d ms after PING\n", n, last - u
			else print "after PING: no non-200 answer"
		}' "$tmp/samples"
}
echo "== 2. Redis stopped at +3s for 4s, no busy loops, $clients clients"
fault
echo "breaker transitions so far: $(transitions)"
echo "== 3. the same with $hogs busy loops"
start_hogs
fault
stop_hogs
echo "breaker transitions so far: $(transitions)"
