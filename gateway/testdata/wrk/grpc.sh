#!/usr/bin/env bash
# grpc.sh: Envoy's rate limit API side by side (issue 12): edgelimit's door
# (gateway/envoyrls, BenchmarkShouldRateLimit: 3 descriptors over 100k keys,
# 64 callers, one and four HTTP/2 connections) and envoyproxy/ratelimit under
# the same load on the same Redis, alternating, ROUNDS times. Run inside
# deploy/local/testenv.sh (make bench CASES=grpc does). The edgelimit door
# runs in the benchmark's process, beside the load; the peer in its own.
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
pid=
cleanup() {
	[ -z "$pid" ] || kill "$pid" 2>/dev/null || true
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
(cd "$root" && go test -c -o "$tmp/rls.test" ./gateway/envoyrls/)
bench() { "$tmp/rls.test" -test.run '^$' -test.bench 'BenchmarkShouldRateLimit$' -test.benchtime "$BENCHTIME" | grep '^Benchmark'; }
for r in $(seq "$ROUNDS"); do
	echo "== grpc round $r of $ROUNDS: edgelimit"
	bench
	echo "== grpc round $r of $ROUNDS: envoyproxy/ratelimit"
	EDGELIMIT_RLS_BENCH_ADDR=127.0.0.1:$gport bench
done
