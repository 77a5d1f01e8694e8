#!/usr/bin/env bash
# run.sh: the gateway's wrk benchmark on loopback (run inside
# deploy/local/testenv.sh for Redis, or with EDGELIMIT_REDIS_ADDR set).
# Builds cmd/gateway and cmd/demo, starts the demo upstream and one
# gateway, and runs wrk against: the limiter off (/off, an exempt route),
# 3 rules per key over 100k random keys, one hot key within its limits,
# and one hot key over them. Prints wrk's
# requests/s and latency percentiles, then the gateway's own check latency.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
DURATION=${DURATION:-10s}
CONNS=${CONNS:-64}
: "${EDGELIMIT_REDIS_ADDR:?set EDGELIMIT_REDIS_ADDR (run inside deploy/local/testenv.sh)}"
command -v wrk >/dev/null || { echo "wrk is not installed (apt-get install wrk)" >&2; exit 1; }

tmp=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT

(cd "$root" && go build -o "$tmp/" ./cmd/gateway ./cmd/demo)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
up=127.0.0.1:$(free_port) gw=127.0.0.1:$(free_port) admin=127.0.0.1:$(free_port)

"$tmp/demo" upstream -listen "$up" >"$tmp/upstream.log" 2>&1 &
pids+=($!)
EDGELIMIT_LISTEN=$gw EDGELIMIT_ADMIN_LISTEN=$admin EDGELIMIT_UPSTREAM_APP=http://$up \
	EDGELIMIT_REDIS_CLUSTER_ADDRS= EDGELIMIT_REDIS_SENTINEL_ADDRS= EDGELIMIT_REDIS_SENTINEL_MASTER= EDGELIMIT_KAFKA_BROKERS= \
	"$tmp/gateway" -config "$here/gateway.yaml" >"$tmp/gateway.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
	curl -fsS -o /dev/null "http://$admin/readyz" 2>/dev/null && break
	sleep 0.1
done
curl -fsS -o /dev/null "http://$admin/readyz" || { cat "$tmp/gateway.log" >&2; exit 1; }

for scenario in off random hot hotdenied; do
	# off is random's requests on the exempt route: one script, so the
	# baseline differs from the limited case in the route alone.
	script=$scenario prefix=
	if [ "$scenario" = off ]; then script=random prefix=/off; fi
	# Warm up connections and the script cache, then measure.
	wrk -t2 -c"$CONNS" -d2s -s "$here/$script.lua" "http://$gw" -- "$prefix" >/dev/null
	echo "== wrk -t2 -c$CONNS -d$DURATION --latency ($scenario)"
	wrk -t2 -c"$CONNS" -d"$DURATION" --latency -s "$here/$script.lua" "http://$gw" -- "$prefix" |
		grep -E 'Requests/sec|^ +(50|99)%|Non-2xx|Socket errors'
done
echo "== gateway check latency histogram (store=shared)"
curl -fsS "http://$admin/metrics" | grep -E '^edgelimit_gateway_check_duration_seconds_(bucket|count)\{le="(0.0005|0.001|0.0025)"|store="shared"' | grep -E 'status="ok"' | head -8
curl -fsS "http://$admin/metrics" | grep -E '^edgelimit_gateway_(fail_open_total|store_unavailable_total)'
