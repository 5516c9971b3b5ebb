#!/usr/bin/env bash
# What a Redis outage costs the demo's clients, on loopback, fail-closed, 50 ms deadline:
#   1. one request every 100 ms; Redis stopped (SIGSTOP) at +1s, resumed (SIGCONT) at +3s:
#      the latency of each 503, and the first 200 after SIGCONT;
#   2. 40 clients looping on /api/hello (internal/loadgen), the same stall: the answers'
#      times before and during the stall (on 2 cores 40 clients queue for the CPU: the
#      median before the stall is the floor), how many took 45 ms or more (a wait on the
#      store), and the first 200 after SIGCONT;
#   3. wrk -t2 -c16 on /api/hello; Redis shut down at +2s and started again on the same
#      port 2s later: the first 200 after Redis first answered PING (redis-cli polled
#      without pause), as seen by one loadgen client beside wrk, which timestamps answers.
# Usage: cmd/demo-server/outage.sh [demo binary] [runs of 3.]
# Needs: redis-server, redis-cli, curl, wrk, Go. Sends traffic to 127.0.0.1 only.
set -euo pipefail
cd "$(dirname "$0")/../.."
for tool in redis-server redis-cli curl wrk go; do
	command -v "$tool" >/dev/null 2>&1 || { echo "outage.sh needs $tool (Debian: apt-get install redis-server redis-tools curl wrk)" >&2; exit 1; }
done
tmp=$(mktemp -d)
demo_bin=${1:-}; runs=${2:-3}
rport=$((20000 + RANDOM % 10000)); hport=$((rport + 1))
cleanup() {
	[ -n "${demo:-}" ] && kill "$demo" 2>/dev/null
	[ -f "$tmp/redis.pid" ] && kill -CONT "$(cat "$tmp/redis.pid")" 2>/dev/null
	redis-cli -p "$rport" shutdown nosave >/dev/null 2>&1 || true
	rm -rf "$tmp"
}
trap cleanup EXIT
if [ -z "$demo_bin" ]; then
	go build -o "$tmp/demo" ./cmd/demo-server
	demo_bin=$tmp/demo
fi
go build -o "$tmp/loadgen" ./internal/loadgen
now() { date +%s%3N; }
# start_redis starts Redis and prints the time of its first PONG (polled without pause).
start_redis() {
	redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no --dir "$tmp" \
		--logfile "$tmp/redis.log" --pidfile "$tmp/redis.pid" --daemonize yes
	for _ in $(seq 5000); do
		if [ "$(redis-cli -p "$rport" ping 2>/dev/null)" = PONG ]; then now; return; fi
	done
	echo "redis did not start" >&2; exit 1
}
start_redis >/dev/null
"$demo_bin" -addr "127.0.0.1:$hport" -redis "redis://127.0.0.1:$rport/0" -limit 1000000000 -window 1h >"$tmp/demo.log" 2>&1 &
demo=$!
up=
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$hport/healthz" >/dev/null && up=1 && break; sleep 0.05; done
[ -n "$up" ] || { echo "the demo server did not answer /healthz within 5s:" >&2; cat "$tmp/demo.log" >&2; exit 1; }
url="http://127.0.0.1:$hport/api/hello"
pid() { cat "$tmp/redis.pid"; }

echo "== 1. one request every 100 ms, SIGSTOP for 2 s"
: >"$tmp/slow.txt"
(
	for _ in $(seq 40); do
		curl -s -o /dev/null -w "$(now) %{http_code} %{time_total}\n" "$url" >>"$tmp/slow.txt"
		sleep 0.1
	done
) &
sender=$!
sleep 1; kill -STOP "$(pid)"; stopped=$(now)
sleep 2; kill -CONT "$(pid)"; cont=$(now)
wait "$sender"
awk -v s="$stopped" -v c="$cont" '
	$2 == 503 { n++; ms = $3 * 1000; lat = lat sprintf(" %.1f", ms); if (ms > 2) slow++ }
	$1 >= c && $2 == 200 && first == "" { first = $1 - c }
	END { printf "503 answers: %d, of which over 2 ms: %d; latencies (ms):%s\nfirst 200 after SIGCONT: +%s ms (request every 100 ms)\n", n, slow, lat, first }' "$tmp/slow.txt"

echo "== 2. 40 looping clients, SIGSTOP for 2 s"
"$tmp/loadgen" -url "$url" -c 40 -d 5s -runs 0 -samples "$tmp/loop" >/dev/null &
lg=$!
sleep 1; kill -STOP "$(pid)"; stopped=$(now)
sleep 2; kill -CONT "$(pid)"; cont=$(now)
wait "$lg"
sort -n -k3 "$tmp/loop" | awk -v s="$stopped" -v c="$cont" '
	$1 < s { h[++hn] = $3 }
	$1 >= s && $1 < c { d[++n] = $3; if ($3 >= 45) waited++; if ($2 != 503) other++ }
	END { printf "before the stall: %d answers, median %.1f ms; during the stall: %d answers (not 503: %d), median %.1f ms, p99 %.1f ms, slowest %.1f ms, %d took 45 ms or more\n", hn, h[int(hn/2)+1], n, other, d[int(n/2)+1], d[int(n*0.99)+1], d[n], waited }'
awk -v c="$cont" '$1 >= c && $2 == 200 && first == "" { first = $1 - c } END { printf "first 200 after SIGCONT: +%d ms\n", first }' "$tmp/loop"

echo "== 3. wrk -t2 -c16, Redis restarted on the same port, $runs runs"
for run in $(seq "$runs"); do
	wrk -t2 -c16 -d7s "$url" >"$tmp/wrk.out" 2>&1 &
	wk=$!
	"$tmp/loadgen" -url "$url" -c 1 -d 7s -runs 0 -samples "$tmp/restart" >/dev/null &
	lg=$!
	sleep 2
	redis-cli -p "$rport" shutdown nosave >/dev/null 2>&1 || true
	sleep 2
	pong=$(start_redis)
	wait "$lg" "$wk"
	awk -v p="$pong" '$1 >= p && $2 == 200 && first == "" { first = $1 - p } END { printf "run '"$run"': first 200 %+d ms after the first PONG; ", first }' "$tmp/restart"
	awk '/Requests\/sec/ { rps = $2 } /Non-2xx/ { bad = $NF } END { printf "wrk %s req/s, %d non-2xx\n", rps, bad }' "$tmp/wrk.out"
done
