#!/usr/bin/env bash
# End-to-end cost of the limiter: the demo server with its Redis limiter against the same
# server without a limiter (-no-limit), loaded over loopback by wrk, in alternation. The
# limiter runs three ways: as the demo runs it (one server, with coalescing), without
# coalescing (-coalesce 0), and without coalescing or -one-server (-coalesce 0
# -one-server=false: a request's checks of several slots are decided slot by slot).
# Every request is admitted (the limit is huge), so all serve the same work and the
# ratio is the price of a Redis decision per request. By default every request comes from
# one client, so all spend one budget (a hot budget: coalescing groups them); with
# budgets=many, wrk sends a random X-Forwarded-For from 65,536 addresses through a trusted
# proxy, so requests spend many budgets and coalescing has little to group. With
# budgets=service, requests go to the report route with one of 65,536 API keys: each
# spends its account's budget and the route's service-wide budget, in another slot (two
# script calls per request; coalescing groups the service-wide one).
#
# Usage: cmd/demo-server/loadtest.sh [rounds] [seconds] [connections] [one|many|service]
# Needs: redis-server, wrk, curl, bc (Debian packages), Go.
set -euo pipefail
cd "$(dirname "$0")/../.."
for tool in redis-server wrk curl bc go; do
	command -v "$tool" >/dev/null 2>&1 || { echo "loadtest.sh needs $tool (Debian: apt-get install redis-server wrk curl bc; Go from https://go.dev/dl/)" >&2; exit 1; }
done
rounds=${1:-3}; secs=${2:-5}; conns=${3:-64}; budgets=${4:-one}
rco_=(); ron_=(); rpool_=()
tmp=$(mktemp -d)
spread=()
case $budgets in
one) ;;
many)
	cat >"$tmp/spread.lua" <<'LUA'
request = function()
	return wrk.format(nil, nil, {["X-Forwarded-For"] = "10.7." .. math.random(0, 255) .. "." .. math.random(0, 255)})
end
LUA
	spread=(-s "$tmp/spread.lua")
	;;
service)
	cat >"$tmp/spread.lua" <<'LUA'
request = function()
	local id = math.random(0, 65535)
	return wrk.format(nil, "/api/accounts/" .. id .. "/report", {["X-API-Key"] = "key-" .. id})
end
LUA
	spread=(-s "$tmp/spread.lua")
	;;
*) echo "budgets must be one, many or service, got $budgets" >&2; exit 2 ;;
esac
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
	"$tmp/demo" -addr "127.0.0.1:$hport" -redis "redis://127.0.0.1:$rport/0" -limit 1000000000 -window 1h -store-timeout 1s -trusted-proxies 127.0.0.1/32 "$@" >"$tmp/demo.log" 2>&1 &
	demo=$!
	local up=
	for _ in $(seq 100); do curl -sf "http://127.0.0.1:$hport/healthz" >/dev/null && up=1 && break; sleep 0.05; done
	[ -n "$up" ] || { echo "the demo server did not answer /healthz within 5s:" >&2; cat "$tmp/demo.log" >&2; exit 1; }
	local rpid d0 r0 rps
	rpid=$(cat "$tmp/redis.pid"); d0=$(cpu "$demo"); r0=$(cpu "$rpid")
	rps=$(wrk -t2 -c"$conns" -d"${secs}s" "${spread[@]}" "http://127.0.0.1:$hport/api/hello" | awk '/Requests\/sec/ {print $2}')
	echo "$rps $(echo "($(cpu "$demo") - $d0) * 1000000 / $tick / ($rps * $secs)" | bc -l) $(echo "($(cpu "$rpid") - $r0) * 1000000 / $tick / ($rps * $secs)" | bc -l)"
	kill "$demo"; wait "$demo" 2>/dev/null || true; demo=
}

printf '%-6s %11s %11s %6s %11s %6s %11s %6s   %s\n' round "no limiter" "coalesced" ratio "one call" ratio "slots" ratio \
	"CPU µs/request: demo without; demo, redis with coalesced; one call; slots"
for r in $(seq "$rounds"); do
	# Each round starts at another variant, so that none always runs first or last.
	for k in 0 1 2 3; do
		case $(((k + r - 1) % 4)) in
		0) read -r off doff _ < <(serve -no-limit) ;;
		1) read -r co dco rco < <(serve) ;;
		2) read -r on don ron < <(serve -coalesce 0) ;;
		3) read -r pool dpool rpool < <(serve -coalesce 0 -one-server=false) ;;
		esac
	done
	rco_+=("$(echo "$co / $off" | bc -l)"); ron_+=("$(echo "$on / $off" | bc -l)"); rpool_+=("$(echo "$pool / $off" | bc -l)")
	printf '%-6s %11.0f %11.0f %6.2f %11.0f %6.2f %11.0f %6.2f   %.1f; %.1f, %.1f; %.1f, %.1f; %.1f, %.1f\n' "$r" "$off" \
		"$co" "${rco_[-1]}" "$on" "${ron_[-1]}" "$pool" "${rpool_[-1]}" "$doff" "$dco" "$rco" "$don" "$ron" "$dpool" "$rpool"
done
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2)}'; }
printf '%-6s %11s %11s %6.2f %11s %6.2f %11s %6.2f\n' median "" "" "$(median "${rco_[@]}")" "" "$(median "${ron_[@]}")" "" "$(median "${rpool_[@]}")"
