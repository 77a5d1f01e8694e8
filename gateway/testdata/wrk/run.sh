#!/usr/bin/env bash
# run.sh: the gateway benchmarks of issue #11, the new gateway (this
# working tree) beside an old one (git revision BASE) and the peer
# (envoyproxy/ratelimit), on the same servers. Run inside
# deploy/local/testenv.sh (make bench does): it needs the standalone Redis
# (EDGELIMIT_REDIS_ADDR) and, for the events case, Kafka
# (EDGELIMIT_KAFKA_BROKERS).
#
# Every case runs for both gateways in alternation, ROUNDS times (old
# first in odd rounds, new first in even ones, so a machine that slows
# down as the run goes on does not favour one side), and the table at the
# end gives each figure's mean over the rounds beside its target. The
# figures of one run are noisy on a busy machine; old and new side by side
# on the same servers are what to compare.
#
#   BASE=9379a1c      the old gateway's revision (default: the issue's)
#   CASES=all         or a comma-separated subset of: check memory proxy
#                     body events openloop hot denied peer
#   ROUNDS=2 DURATION=10s CONNS=64 (wrk's -c) IDENTITIES=100000 (memory)
#
# The gateways are driven only through their config file, environment and
# HTTP, so any revision that reads gateway.yaml can be the old one; each
# starts with an empty environment plus the variables below, whatever the
# test stack exports (a Sentinel or Cluster address would send an old
# gateway elsewhere).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
BASE=${BASE:-22a4478}
CASES=${CASES:-all}
ROUNDS=${ROUNDS:-2}
DURATION=${DURATION:-10s}
CONNS=${CONNS:-64}
IDENTITIES=${IDENTITIES:-100000}
: "${EDGELIMIT_REDIS_ADDR:?set EDGELIMIT_REDIS_ADDR (run inside deploy/local/testenv.sh)}"
command -v wrk >/dev/null || { echo "wrk is not installed (apt-get install wrk)" >&2; exit 1; }

all_cases=(check memory proxy body events openloop hot denied peer)
want() { [ "$CASES" = all ] || [[ ",$CASES," == *",$1,"* ]]; }
for c in ${CASES//,/ }; do
	[ "$c" = all ] || [[ " ${all_cases[*]} " == *" $c "* ]] || [[ " limiter ceiling grpc analytics go " == *" $c "* ]] ||
		{ echo "run.sh: unknown case $c; the cases are: ${all_cases[*]}" >&2; exit 2; }
done
selected=0
for c in "${all_cases[@]}"; do want "$c" && selected=1; done
[ "$selected" = 1 ] || exit 0
echo "== gateway, issue 11's cases: the new gateway beside the old (BASE) and the peer (gateway/testdata/wrk/run.sh)"

rhost=${EDGELIMIT_REDIS_ADDR%:*} rport=${EDGELIMIT_REDIS_ADDR##*:}
rcli() { redis-cli -h "$rhost" -p "$rport" "$@"; }

tmp=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# The binaries. The old gateway is built from `git archive BASE` (no
# worktree to clean up) and kept under .run/bench by commit, so a second
# run skips the build; so is the peer, installed with go install.
cache=$root/.run/bench
mkdir -p "$cache/bin"
base_sha=$(git -C "$root" rev-parse --verify "$BASE^{commit}")
old=$("$here/old.sh" "$BASE")
(cd "$root" && go build -o "$tmp/" ./cmd/gateway ./cmd/demo)
new=$tmp/gateway
peer=$cache/bin/service_cmd
if want peer && [ ! -x "$peer" ]; then
	echo "== installing the peer: go install github.com/envoyproxy/ratelimit/src/service_cmd@latest"
	start=$SECONDS
	GOBIN=$cache/bin go install github.com/envoyproxy/ratelimit/src/service_cmd@latest
	echo "   took $((SECONDS - start)) s; cached as $peer"
fi
echo "== old: $BASE ($(git -C "$root" log -1 --format='%h %cs %s' "$base_sha" | cut -c1-70))"
echo "== new: this tree ($(git -C "$root" log -1 --format='%h' HEAD)$(git -C "$root" diff --quiet HEAD -- . || echo ' + uncommitted changes'))"
if want peer; then echo "== peer: $(go version -m "$peer" | awk '$1 == "mod" { print $2, $3 }')"; fi

up=127.0.0.1:$(free_port)
"$tmp/demo" upstream -listen "$up" >"$tmp/upstream.log" 2>&1 &
pids+=($!)

# The events case's config: gateway.yaml with decision events on, to the
# real broker (EDGELIMIT_KAFKA_BROKERS).
sed '/^kafka:/,/^  disabled: true/d' "$here/gateway.yaml" >"$tmp/events.yaml"

# start_gateway BINARY CONFIG [VAR=VALUE...]: starts a gateway, sets gw,
# admin and gw_pid, and returns once it is ready.
start_gateway() {
	local bin=$1 cfg=$2
	shift 2
	gw=127.0.0.1:$(free_port) admin=127.0.0.1:$(free_port)
	env -i PATH="$PATH" HOME="$HOME" EDGELIMIT_LISTEN="$gw" EDGELIMIT_ADMIN_LISTEN="$admin" \
		EDGELIMIT_UPSTREAM_APP="http://$up" EDGELIMIT_REDIS_ADDR="$EDGELIMIT_REDIS_ADDR" "$@" \
		"$bin" -config "$cfg" >"$tmp/gateway.log" 2>&1 &
	gw_pid=$!
	pids+=("$gw_pid")
	for _ in $(seq 100); do
		curl -fsS -o /dev/null "http://$admin/readyz" 2>/dev/null && return 0
		kill -0 "$gw_pid" 2>/dev/null || break
		sleep 0.1
	done
	echo "gateway $bin did not get ready:" >&2
	cat "$tmp/gateway.log" >&2
	exit 1
}
stop_gateway() {
	kill "$gw_pid" 2>/dev/null || true
	wait "$gw_pid" 2>/dev/null || true
}

# wrk_run TARGET LABEL MODE [ARG]: flushes Redis (every side meets the
# same keys), warms up for 2 s, then runs wrk for DURATION and sets
# requests, rps, p99_ms, non2xx, and over the measured run alone Redis's
# CPU seconds (cpu), commands (cmds, those a script calls included),
# script calls (scripts: EVAL, EVALSHA, FCALL and their _RO forms) and the
# server's own CPU per request in microseconds (server_us, from
# /proc/PID/stat: the gateway's, or the peer's when TARGET is the peer).
wrk_run() {
	local target=$1 label=$2 s0 s1 u0 u1 p0 p1 pid=$gw_pid
	shift 2
	[ "$target" = "$gw" ] || pid=${peer_pid:-}
	rcli FLUSHALL >/dev/null
	wrk -t2 -c"$CONNS" -d2s -s "$here/bench.lua" "http://$target" -- "$@" >/dev/null
	s0=$(redis_counters) u0=$(unavailable "$target") p0=$(proc_ticks "$pid")
	wrk -t2 -c"$CONNS" -d"$DURATION" --latency -s "$here/bench.lua" "http://$target" -- "$@" >"$tmp/wrk.out"
	s1=$(redis_counters) u1=$(unavailable "$target") p1=$(proc_ticks "$pid")
	if [ "$u1" != "$u0" ]; then
		echo "   WARNING $label: $((u1 - u0)) checks the store did not decide (store_unavailable_total)"
		record unavailable "$label" "$((u1 - u0))"
	fi
	# The INFO of s0 is one command of the run.
	read -r cpu cmds scripts < <(echo "$s0 $s1" | awk '{ printf "%.6f %d %d\n", $4 - $1, $5 - $2 - 1, $6 - $3 }')
	# wrk prints "  99%    1.23ms" and "12345 requests in 10.00s, ...".
	read -r requests rps p99_ms non2xx < <(awk '
		/requests in/ { n = $1 }
		/^Requests\/sec/ { r = $2 }
		/^ +99%/ { v = $2; u = v; sub(/[0-9.]+/, "", u); sub(/[a-z]+$/, "", v)
			p = v * (u == "us" ? 0.001 : u == "s" ? 1000 : u == "m" ? 60000 : 1) }
		/Non-2xx/ { x = $NF }
		END { printf "%d %.0f %.3f %d\n", n, r, p, x + 0 }' "$tmp/wrk.out")
	server_us=$(awk -v a="$p0" -v b="$p1" -v n="$requests" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.1f", (b - a) * 1e6 / hz / n }')
	printf '   %-22s %8s req/s  p99 %7s ms  %s requests, %s non-2xx, server CPU %s us/req\n' "$label" "$rps" "$p99_ms" "$requests" "$non2xx" "$server_us"
}
# proc_ticks PID: the process's user + system CPU in clock ticks.
proc_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
# redis_counters prints Redis's CPU seconds (used_cpu_sys + used_cpu_user),
# total_commands_processed and the calls of scripts, from one INFO.
redis_counters() {
	rcli INFO cpu stats commandstats | tr -d '\r' | awk -F'[:=,]' '
		/^used_cpu_(sys|user):/ { s += $2 }
		/^total_commands_processed:/ { n = $2 }
		/^cmdstat_(eval|evalsha|eval_ro|evalsha_ro|fcall|fcall_ro):/ { e += $3 }
		END { printf "%.6f %d %d\n", s, n, e }'
}
redis_info() { rcli INFO "$1" | tr -d '\r' | awk -F: -v k="$2" '$1 == k { print $2 }'; }
# unavailable TARGET: the gateway's store_unavailable_total (0 for the peer).
unavailable() {
	if [ "$1" = "$gw" ]; then metric_sum '^edgelimit_gateway_store_unavailable_total'; else echo 0; fi
}
per_request() { awk -v a="$1" -v n="$requests" -v k="$2" -v f="$3" 'BEGIN { printf f, a * k / n }'; }
metric_sum() { curl -fsS "http://$admin/metrics" | awk -v re="$1" '$1 ~ re { s += $NF } END { printf "%.0f\n", s }'; }

# record METRIC SIDE VALUE: one round's figure, for the table.
record() { echo "$1 $2 $3" >>"$tmp/results"; }
: >"$tmp/results"

# case_* SIDE: one case for one gateway, already started (gw, admin).
# case_check SIDE BINARY: /v1/check with 100k random keys (cases 1 and 3);
# with the events case selected too, it is that case's events-off run.
case_check() {
	if want events; then events_pair "$1" "$2" check; else check_run "$1" check; fi
}
# check_run SIDE WHAT: the check load; WHAT check records its figures.
check_run() {
	wrk_run "$gw" "$2 $1" check
	[ "$2" = check ] || return 0
	record check_rps "$1" "$rps"
	record check_p99 "$1" "$p99_ms"
	record check_us "$1" "$server_us"
	record cpu_us "$1" "$(per_request "$cpu" 1e6 %.2f)"
	record check_cmds "$1" "$(per_request "$cmds" 1 %.2f)"
	record check_scripts "$1" "$(per_request "$scripts" 1 %.3f)"
	eval "sat_$1=$rps" # case_openloop's saturating rate
}
# case_events SIDE BINARY: without the check case, its own events-off run.
case_events() { events_pair "$1" "$2" "events off"; }
# events_pair SIDE BINARY WHAT: the check load with events off (check_run
# WHAT) and on, one right after the other on the same side: off first in
# odd rounds, on first in even ones, so that neither order favours a side
# of the pair. It leaves the last of the two gateways running.
events_pair() {
	local side=$1 bin=$2 off on
	if [ $((round % 2)) = 1 ]; then
		check_run "$side" "$3"
		off=$rps
		events_on "$side" "$bin"
		on=$rps
	else
		events_on "$side" "$bin"
		on=$rps
		stop_gateway
		start_gateway "$bin" "$here/gateway.yaml"
		check_run "$side" "$3"
		off=$rps
	fi
	record events_cost "$side" "$(awk -v a="$on" -v b="$off" 'BEGIN { printf "%.1f", 100 * (1 - a / b) }')"
}
# events_on SIDE BINARY: restarts the gateway with decision events on, to
# a fresh topic on the real broker, and runs the check load (rps).
events_on() {
	local published dropped topic
	stop_gateway
	topic=bench-$1-$RANDOM
	"$tmp/demo" topic -brokers "${EDGELIMIT_KAFKA_BROKERS:?the events case needs Kafka}" "$topic"
	start_gateway "$2" "$tmp/events.yaml" EDGELIMIT_KAFKA_BROKERS="$EDGELIMIT_KAFKA_BROKERS" EDGELIMIT_KAFKA_TOPIC="$topic"
	wrk_run "$gw" "events on $1" check
	published=$(metric_sum '^edgelimit_events_published_total')
	dropped=$(metric_sum '^edgelimit_events_dropped_total')
	echo "      events published $published, dropped $dropped"
	[ "$published" -gt 0 ] || { echo "events $1: no event published:" >&2; cat "$tmp/gateway.log" >&2; exit 1; }
}
case_memory() {
	local m0 m1 out n keys u0 u1
	rcli FLUSHALL >/dev/null
	# One key at full concurrency first: the gateway's Redis connections
	# (each with its buffers in used_memory) are open before m0, and only
	# the hot key's state is stored.
	wrk -t2 -c"$CONNS" -d1s -s "$here/bench.lua" "http://$gw" -- check hot-key >/dev/null
	m0=$(redis_info memory used_memory) u0=$(unavailable "$gw")
	# Each request a new client IP, open-loop at more than any gateway
	# here sustains: those dropped for want of a free connection simply
	# never become identities, and the 200s are counted. Each costs 50 of
	# the minute rule's 100: a bucket that would be full again needs no
	# state, so at cost 1 every state expires within 2 s and used_memory
	# would hold only the last seconds' identities; at 50 none expires
	# before it is read (the minute rule's after 30 s).
	out=$("$tmp/demo" load -url "http://$gw/v1/check" -body '{"ip":"{ip}","cost":50}' -sequential -conns "$CONNS" \
		-rate "$((IDENTITIES / 5))" -duration 5s)
	m1=$(redis_info memory used_memory) u1=$(unavailable "$gw")
	keys=$(rcli DBSIZE)
	# An identity the store did not decide (fail-open) left no state.
	n=$(($(sed -n 's/.* status_200=\([0-9]*\).*/\1/p' <<<"$out") - (u1 - u0)))
	[ "${n:-0}" -gt 0 ] || { echo "memory $1: no identity allowed: $out" >&2; exit 1; }
	printf '   %-22s %d identities, %d keys, used_memory +%d B  (%s)\n' "memory $1" "$n" "$keys" "$((m1 - m0))" "$out"
	record mem_keys "$1" "$(awk -v k="$keys" -v n="$n" 'BEGIN { printf "%.2f", k / n }')"
	record mem_b "$1" "$(((m1 - m0) / n))"
}
# case_proxy: the exempt route first in odd rounds, the limited first in
# even ones, like events_pair.
case_proxy() {
	local off limited off_us limited_us
	if [ $((round % 2)) = 1 ]; then
		wrk_run "$gw" "proxy exempt $1" proxy /off
		off=$rps off_us=$server_us
		wrk_run "$gw" "proxy limited $1" proxy
		limited=$rps limited_us=$server_us
	else
		wrk_run "$gw" "proxy limited $1" proxy
		limited=$rps limited_us=$server_us
		wrk_run "$gw" "proxy exempt $1" proxy /off
		off=$rps off_us=$server_us
	fi
	record proxy_pct "$1" "$(awk -v a="$limited" -v b="$off" 'BEGIN { printf "%.1f", 100 * a / b }')"
	record proxy_off_rps "$1" "$off"
	record proxy_limited_rps "$1" "$limited"
	record proxy_off_us "$1" "$off_us"
	record proxy_limited_us "$1" "$limited_us"
	record proxy_extra_us "$1" "$(awk -v a="$limited_us" -v b="$off_us" 'BEGIN { printf "%.1f", a - b }')"
}
# case_body: a small JSON POST on the limited route, which the gateway
# reads for API keys while it streams to the upstream (gateway/override.go).
case_body() {
	wrk_run "$gw" "proxy body $1" body
	record body_rps "$1" "$rps"
}
case_openloop() {
	local sat out
	sat=$(eval "echo \${sat_$1:-}")
	if [ -z "$sat" ]; then # no check case this round: find the rate
		wrk_run "$gw" "saturate $1" check
		sat=$rps
	fi
	rcli FLUSHALL >/dev/null
	out=$("$tmp/demo" load -url "http://$gw/v1/check" -body '{"ip":"{ip}"}' -conns 256 \
		-rate "$((sat / 2))" -duration "$DURATION" -metrics "http://$admin/metrics")
	printf '   %-22s at %d/s: %s\n' "openloop $1" "$((sat / 2))" "$out"
	record open_p99 "$1" "$(sed -n 's/.* server_p99_ms=\([0-9.]*\).*/\1/p' <<<"$out")"
	record open_client_p99 "$1" "$(sed -n 's/.* p99_ms=\([0-9.]*\).*/\1/p' <<<"$out")"
}
case_hot() {
	wrk_run "$gw" "hot $1" check hot-key
	record hot_rps "$1" "$rps"
}
case_denied() {
	wrk_run "$gw" "denied $1" check hot-denied
	record denied_rps "$1" "$rps"
	record denied_us "$1" "$server_us"
	record denied_scripts "$1" "$(per_request "$scripts" 1 %.3f)"
}
# case_peer: envoyproxy/ratelimit with its README's variables (Redis over
# TCP, no statsd, the config directory), the same load through /json.
case_peer() {
	local port
	mkdir -p "$tmp/runtime/ratelimit/config"
	cp "$here/peer.yaml" "$tmp/runtime/ratelimit/config/config.yaml"
	port=$(free_port)
	# LOCAL_CACHE_SIZE_IN_BYTES: its cache of over-limit keys, beside our
	# deny cache in the denied case.
	env -i PATH="$PATH" HOME="$HOME" USE_STATSD=false LOG_LEVEL=warn REDIS_SOCKET_TYPE=tcp REDIS_URL="$EDGELIMIT_REDIS_ADDR" \
		LOCAL_CACHE_SIZE_IN_BYTES=1048576 RUNTIME_ROOT="$tmp/runtime" RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_APPDIRECTORY=config RUNTIME_WATCH_ROOT=false \
		HOST=127.0.0.1 PORT="$port" GRPC_HOST=127.0.0.1 GRPC_PORT="$(free_port)" DEBUG_HOST=127.0.0.1 DEBUG_PORT="$(free_port)" \
		"$peer" >"$tmp/peer.log" 2>&1 &
	local pid=$!
	pids+=("$pid")
	peer_pid=$pid
	for _ in $(seq 100); do
		curl -fsS -o /dev/null "http://127.0.0.1:$port/healthcheck" 2>/dev/null && break
		sleep 0.1
	done
	curl -fsS -o /dev/null "http://127.0.0.1:$port/healthcheck" || { cat "$tmp/peer.log" >&2; exit 1; }
	wrk_run "127.0.0.1:$port" "peer" peer
	record check_rps peer "$rps"
	record check_us peer "$server_us"
	record check_p99 peer "$p99_ms"
	record cpu_us peer "$(per_request "$cpu" 1e6 %.2f)"
	record check_cmds peer "$(per_request "$cmds" 1 %.2f)"
	record check_scripts peer "$(per_request "$scripts" 1 %.3f)"
	if want denied; then
		wrk_run "127.0.0.1:$port" "peer denied" peer 10.9.9.9
		record denied_rps peer "$rps"
		record denied_us peer "$server_us"
	fi
	kill "$pid"
	wait "$pid" 2>/dev/null || true
}

for round in $(seq "$ROUNDS"); do
	sides=(old new)
	[ $((round % 2)) = 1 ] || sides=(new old)
	# The load average says how busy the machine was besides this run.
	echo "== round $round of $ROUNDS: ${sides[*]}, wrk -t2 -c$CONNS -d$DURATION (load average $(cut -d' ' -f1-3 /proc/loadavg))"
	for c in check memory proxy body events openloop hot denied; do
		want "$c" || continue
		if [ "$c" = events ] && want check; then continue; fi # run by case_check
		for side in "${sides[@]}"; do
			bin=$new
			[ "$side" = new ] || bin=$old
			start_gateway "$bin" "$here/gateway.yaml"
			"case_$c" "$side" "$bin"
			stop_gateway
		done
	done
	if want peer; then case_peer; fi
done

# The table: each figure's mean over the rounds; "met" judges the new
# gateway against the target.
awk -v base="$BASE" '
	$1 == "unavailable" { bad += $NF; next }
	{ s[$1 " " $2] += $3; n[$1 " " $2]++ }
	function v(m, side) { return (m " " side) in n ? s[m " " side] / n[m " " side] : "" }
	function f(x, fmt) { return x == "" ? "-" : sprintf(fmt, x) }
	function row(label, m, fmt, target, ok,   o, w, p) {
		o = v(m, "old"); w = v(m, "new"); p = v(m, "peer")
		if (o == "" && w == "" && p == "") return
		printf "%-44s %10s %10s %10s  %-16s %s\n", label, f(o, fmt), f(w, fmt), f(p, fmt), target, ok
	}
	function met(c) { return c ? "yes" : "NO" }
	function le(m, t,   w) { w = v(m, "new"); return w == "" ? "-" : met(w <= t) }
	function ge(m, t,   w) { w = v(m, "new"); return w == "" ? "-" : met(w >= t) }
	# peer(m, k, dir): new against k times the peer, at least (dir 1) or at most (-1).
	function peer(m, k, dir,   w, p) { w = v(m, "new"); p = v(m, "peer"); return w == "" || p == "" ? "-" : sprintf("%s (%.2fx)", met(dir > 0 ? w >= k * p : w <= k * p), w / p) }
	function ratio(m, k,   o, w) { o = v(m, "old"); w = v(m, "new"); return o == "" || w == "" ? "-" : sprintf("%s (%.2fx)", met(w >= k * o), w / o) }
	# old_le(m): new at most old.
	function old_le(m,   o, w) { o = v(m, "old"); w = v(m, "new"); return o == "" || w == "" ? "-" : sprintf("%s (%.2fx)", met(w <= o), w / o) }
	END {
		printf "\n%-44s %10s %10s %10s  %-16s %s\n", "case (mean of the rounds; old = " base ")", "old", "new", "peer", "target", "met?"
		row("1 Redis CPU per HTTP decision (us)", "cpu_us", "%.2f", "<= 1.0x peer", peer("cpu_us", 1, -1))
		row("  script calls per check", "check_scripts", "%.3f", "-", "-")
		row("  Redis commands per check (in scripts too)", "check_cmds", "%.2f", "-", "-")
		row("2 Redis memory per identity (B)", "mem_b", "%.0f", "<= 229", le("mem_b", 229))
		row("  Redis keys per identity", "mem_keys", "%.2f", "-", "-")
		row("3 /v1/check vs peer /json (req/s)", "check_rps", "%.0f", ">= 1.6x peer", peer("check_rps", 1.6, 1))
		row("  /v1/check p99 (ms, wrk)", "check_p99", "%.2f", "-", "-")
		row("  server CPU per check (us)", "check_us", "%.1f", "-", "-")
		row("4 proxy limited / exempt route (%)", "proxy_pct", "%.1f", ">= 75", ge("proxy_pct", 75))
		row("  proxy exempt route (req/s)", "proxy_off_rps", "%.0f", "-", "-")
		row("  proxy limited route (req/s)", "proxy_limited_rps", "%.0f", "-", "-")
		row("  gateway CPU, exempt route (us/req)", "proxy_off_us", "%.1f", "-", "-")
		row("  gateway CPU, limited route (us/req)", "proxy_limited_us", "%.1f", "-", "-")
		row("  limited - exempt gateway CPU (us/req)", "proxy_extra_us", "%.1f", "<= 25", le("proxy_extra_us", 25))
		row("  proxy limited, JSON POST body (req/s)", "body_rps", "%.0f", "-", "-")
		row("5 events on: req/s lost (%)", "events_cost", "%.1f", "<= 5", le("events_cost", 5))
		row("6 check p99 at half load (ms, histogram)", "open_p99", "%.3f", "<= 1", le("open_p99", 1))
		row("  request p99 at half load (ms, client)", "open_client_p99", "%.2f", "-", "-")
		row("7 hot key within limits (req/s)", "hot_rps", "%.0f", "-", "-")
		row("8 over-limit key: deny cache vs the peer (req/s)", "denied_rps", "%.0f", ">= 1.8x peer", peer("denied_rps", 1.8, 1))
		row("  deny cache vs old (req/s)", "denied_rps", "%.0f", ">= 1.0x old", ratio("denied_rps", 1))
		row("  server CPU per denial (us)", "denied_us", "%.1f", "<= old", old_le("denied_us"))
		row("  script calls per denial", "denied_scripts", "%.3f", "-", "-")
		if (bad) printf "WARNING: %d checks were not decided by the store (see above): those figures flatter their gateway\n", bad
	}' "$tmp/results"
echo "(load average at the end: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores)"
