#!/usr/bin/env bash
# grpc.sh: Envoy's rate limit API side by side (issue 12): edgelimit's door
# (gateway/envoyrls, BenchmarkShouldRateLimit: 3 descriptors over 100k keys,
# 64 callers, one and four HTTP/2 connections) and envoyproxy/ratelimit under
# the same load on the same Redis, alternating, ROUNDS times: first the door
# in the benchmark's process, beside the load, and the peer in its own; then
# both as processes under one external client, with each server's and
# Redis's CPU per request. Run inside deploy/local/testenv.sh (make bench
# CASES=grpc does).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
ROUNDS=${ROUNDS:-2}
BENCHTIME=${BENCHTIME:-5s}
: "${EDGELIMIT_REDIS_ADDR:?set EDGELIMIT_REDIS_ADDR (run inside deploy/local/testenv.sh)}"
cache=$root/.run/bench
peer=$cache/bin/service_cmd
if [ ! -x "$peer" ]; then
	echo "== installing the peer: go install github.com/envoyproxy/ratelimit/src/service_cmd@latest"
	GOBIN=$cache/bin go install github.com/envoyproxy/ratelimit/src/service_cmd@latest
fi
tmp=$(mktemp -d)
pid= door= old_door=
cleanup() {
	for p in $pid $door $old_door; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT
mkdir -p "$tmp/runtime/ratelimit/config"
cp "$root/gateway/envoyrls/testdata/bench.yaml" "$tmp/runtime/ratelimit/config/config.yaml"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
gport=$(free_port) hport=$(free_port)
env -i PATH="$PATH" HOME="$HOME" USE_STATSD=false LOG_LEVEL=warn REDIS_SOCKET_TYPE=tcp REDIS_URL="$EDGELIMIT_REDIS_ADDR" \
	RUNTIME_ROOT="$tmp/runtime" RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_APPDIRECTORY=config RUNTIME_WATCH_ROOT=false \
	HOST=127.0.0.1 PORT="$hport" GRPC_HOST=127.0.0.1 GRPC_PORT="$gport" DEBUG_HOST=127.0.0.1 DEBUG_PORT="$(free_port)" \
	"$peer" >"$tmp/peer.log" 2>&1 &
pid=$!
for _ in $(seq 100); do
	curl -fsS -o /dev/null "http://127.0.0.1:$hport/healthcheck" 2>/dev/null && break
	sleep 0.1
done
curl -fsS -o /dev/null "http://127.0.0.1:$hport/healthcheck" || { cat "$tmp/peer.log" >&2; exit 1; }
(cd "$root" && go test -c -o "$tmp/rls.test" ./gateway/envoyrls/ && go build -o "$tmp/" ./cmd/gateway)
bench() { "$tmp/rls.test" -test.run '^$' -test.bench 'BenchmarkShouldRateLimit$' -test.benchtime "$BENCHTIME" | grep '^Benchmark'; }

# The door as a process of its own too (the gateway binary with a gRPC
# listener on the same rules), so that each side's server and Redis CPU per
# request can be read from /proc, under the same external load client;
# beside it the door of the old gateway (BASE, as run.sh builds it).
BASE=${BASE:-22a4478}
old=$("$here/old.sh" "$BASE")
mkdir -p "$tmp/rules"
cp "$root/gateway/envoyrls/testdata/bench.yaml" "$tmp/rules/"
# start_door BINARY: a door on a free port; sets door (its pid) and eport.
start_door() {
	eport=$(free_port)
	env -i PATH="$PATH" HOME="$HOME" EDGELIMIT_LISTEN="127.0.0.1:$(free_port)" EDGELIMIT_ADMIN_LISTEN="127.0.0.1:$(free_port)" \
		EDGELIMIT_UPSTREAM_APP=http://127.0.0.1:1 EDGELIMIT_REDIS_ADDR="$EDGELIMIT_REDIS_ADDR" \
		EDGELIMIT_GRPC_LISTEN="127.0.0.1:$eport" EDGELIMIT_GRPC_CONFIG_DIR="$tmp/rules" \
		"$1" -config "$here/gateway.yaml" >"$tmp/door.log" 2>&1 &
	door=$!
	for _ in $(seq 100); do
		(exec 3<>"/dev/tcp/127.0.0.1/$eport") 2>/dev/null && break
		sleep 0.1
	done
}
start_door "$old"
old_door=$door old_port=$eport
start_door "$tmp/gateway"
rcli() { redis-cli -h "${EDGELIMIT_REDIS_ADDR%:*}" -p "${EDGELIMIT_REDIS_ADDR##*:}" "$@"; }
rpid=$(rcli INFO server | tr -d '\r' | awk -F: '$1 == "process_id" { print $2 }')
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)
# per_process NAME PID ADDR: the 4-connection load against ADDR, then the
# server's and Redis's CPU per request.
per_process() {
	local s0 r0 out n
	rcli CONFIG RESETSTAT >/dev/null
	s0=$(ticks "$2") r0=$(ticks "$rpid")
	# A fixed count, not a time: a timed benchmark ramps b.N up over runs
	# whose requests Redis counts but the last run's N does not.
	out=$(EDGELIMIT_RLS_BENCH_ADDR=$3 "$tmp/rls.test" -test.run '^$' -test.bench '^BenchmarkShouldRateLimit$/^conns=4$' -test.benchtime "${REQUESTS:-30000}x" | grep '^Benchmark')
	n=$(awk '{ print $2 }' <<<"$out")
	awk -v results="$tmp/results" -v name="$1" -v s="$(($(ticks "$2") - s0))" -v r="$(($(ticks "$rpid") - r0))" -v n="$n" -v hz="$hz" -v line="$out" 'BEGIN {
		for (i = 1; i <= split(line, f, /[ \t]+/); i++) if (f[i] == "req/s") rps = f[i - 1]
		printf "   %-22s %8s req/s  server %6.1f us/request  redis %5.1f us/request\n", name, rps, s * 1e6 / hz / n, r * 1e6 / hz / n
		printf "%s %s %.2f %.2f\n", (name ~ /door/ ? "door" : name ~ /^edgelimit/ ? "old" : "peer"), rps, r * 1e6 / hz / n, s * 1e6 / hz / n >> results }'
	# Redis commandstats over the run: calls and usec per request, by command.
	rcli INFO commandstats | tr -d '\r' | awk -F'[:,=]' -v n="$n" '/^cmdstat_/ && $3 > 0 {
		sub(/^cmdstat_/, "", $1); printf "      %-14s %6.3f calls/request %7.2f us/call\n", $1, $3 / n, $5 / $3 }'
}
for r in $(seq "$ROUNDS"); do
	echo "== grpc round $r of $ROUNDS: edgelimit"
	bench
	echo "== grpc round $r of $ROUNDS: envoyproxy/ratelimit"
	EDGELIMIT_RLS_BENCH_ADDR=127.0.0.1:$gport bench
	echo "== grpc round $r of $ROUNDS: CPU per request, each server a process, one external client (4 connections)"
	if [ $((r % 2)) = 1 ]; then
		per_process "edgelimit (door)" "$door" "127.0.0.1:$eport"
		per_process "edgelimit $BASE" "$old_door" "127.0.0.1:$old_port"
		per_process "envoyproxy/ratelimit" "$pid" "127.0.0.1:$gport"
	else
		per_process "envoyproxy/ratelimit" "$pid" "127.0.0.1:$gport"
		per_process "edgelimit $BASE" "$old_door" "127.0.0.1:$old_port"
		per_process "edgelimit (door)" "$door" "127.0.0.1:$eport"
	fi
done
# The targets, on the means over the rounds of the per-process runs.
awk '{ rps[$1] += $2; redis[$1] += $3; server[$1] += $4; n[$1]++ }
	END {
		if (!n["door"] || !n["peer"]) exit
		d = rps["door"] / n["door"]; p = rps["peer"] / n["peer"]; dr = redis["door"] / n["door"]; pr = redis["peer"] / n["peer"]
		od = n["old"] ? rps["old"] / n["old"] : 0; ored = n["old"] ? redis["old"] / n["old"] : 0
		printf "\n%-40s %10s %10s %10s %8s  %s\n", "gRPC, each a process (mean of rounds)", "old", "door", "peer", "door/peer", "target"
		printf "%-40s %10.0f %10.0f %10.0f %7.2fx  >= 1.3x %s\n", "decisions/s", od, d, p, d / p, (d >= 1.3 * p ? "yes" : "NO")
		printf "%-40s %10.1f %10.1f %10.1f %7.2fx  <= 1.0x %s\n", "Redis CPU per decision (us)", ored, dr, pr, dr / pr, (dr <= pr ? "yes" : "NO")
		ds = server["door"] / n["door"]; ps = server["peer"] / n["peer"]; os = n["old"] ? server["old"] / n["old"] : 0
		printf "%-40s %10.1f %10.1f %10.1f %7.2fx  <= 0.75x %s\n", "server CPU per decision (us)", os, ds, ps, ds / ps, (ds <= 0.75 * ps ? "yes" : "NO")
	}' "$tmp/results"
