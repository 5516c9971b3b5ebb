#!/usr/bin/env bash
# End-to-end cost of the limiter: the demo server with its Redis limiter, over its
# dedicated connection (the default) and through the client's pool (-redis-pool),
# against the same server without a limiter (-no-limit), loaded over loopback by wrk, in
# alternation.
# Every request is admitted (the limit is huge), so both serve the same work and the
# ratio is the price of one Redis decision per request.
#
# Usage: cmd/demo-server/loadtest.sh [rounds] [seconds] [connections]
# Needs: redis-server, wrk (Debian packages), Go.
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-3}; secs=${2:-5}; conns=${3:-64}
tmp=$(mktemp -d)
rport=$((20000 + RANDOM % 10000)); hport=$((rport + 1))
redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no --dir "$tmp" --logfile "$tmp/redis.log" --daemonize yes --pidfile "$tmp/redis.pid"
cleanup() {
	[ -n "${demo:-}" ] && kill "$demo" 2>/dev/null
	local rpid
	rpid=$(cat "$tmp/redis.pid" 2>/dev/null) && kill "$rpid" 2>/dev/null
	for _ in $(seq 50); do [ -n "$rpid" ] && kill -0 "$rpid" 2>/dev/null || break; sleep 0.1; done
	rm -rf "$tmp"
}
trap cleanup EXIT
go build -o "$tmp/demo" ./cmd/demo-server

cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; } # utime + stime, in clock ticks
tick=$(getconf CLK_TCK)

serve() { # args: extra demo flags; prints requests/s, then demo and Redis CPU µs per request
	"$tmp/demo" -addr "127.0.0.1:$hport" -redis "redis://127.0.0.1:$rport/0" -limit 1000000000 -window 1h -store-timeout 1s "$@" >"$tmp/demo.log" 2>&1 &
	demo=$!
	for _ in $(seq 100); do curl -sf "http://127.0.0.1:$hport/healthz" >/dev/null && break; sleep 0.05; done
	local rpid d0 r0 rps
	rpid=$(cat "$tmp/redis.pid"); d0=$(cpu "$demo"); r0=$(cpu "$rpid")
	rps=$(wrk -t2 -c"$conns" -d"${secs}s" "http://127.0.0.1:$hport/api/hello" | awk '/Requests\/sec/ {print $2}')
	echo "$rps $(echo "($(cpu "$demo") - $d0) * 1000000 / $tick / ($rps * $secs)" | bc -l) $(echo "($(cpu "$rpid") - $r0) * 1000000 / $tick / ($rps * $secs)" | bc -l)"
	kill "$demo"; wait "$demo" 2>/dev/null || true; demo=
}

printf '%-6s %11s %11s %6s %11s %6s %11s %6s   %s\n' round "no limiter" "dedicated" ratio "pool" ratio "coalesced" ratio \
	"CPU µs/request: demo without; demo, redis with dedicated; with pool; coalesced"
for r in $(seq "$rounds"); do
	read -r off doff _ < <(serve -no-limit)
	read -r on don ron < <(serve)
	read -r pool dpool rpool < <(serve -redis-pool)
	read -r co dco rco < <(serve -coalesce 256)
	printf '%-6s %11.0f %11.0f %6.2f %11.0f %6.2f %11.0f %6.2f   %.1f; %.1f, %.1f; %.1f, %.1f; %.1f, %.1f\n' "$r" "$off" \
		"$on" "$(echo "$on / $off" | bc -l)" "$pool" "$(echo "$pool / $off" | bc -l)" "$co" "$(echo "$co / $off" | bc -l)" \
		"$doff" "$don" "$ron" "$dpool" "$rpool" "$dco" "$rco"
done
