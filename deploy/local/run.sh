#!/usr/bin/env bash
# run.sh [up|start|stop|status] — the product on this machine, for `make run`.
#
#   up     start everything, print where to look, stop it all on Ctrl-C
#   start  start everything and return once it serves (used by the smoke test)
#   stop   stop whatever a previous start left running
#   status list the processes and their state
#
# Real servers where they can be had (installed with apt-get when missing
# and we are root), on loopback, with data under $EDGELIMIT_RUN_DIR
# (default .run/). Where one can't be had, an embedded default, said in one
# line: the in-memory limiter store instead of Redis, franz-go's kfake as
# the embedded Kafka (the default; EDGELIMIT_KAFKA=real for a broker), and
# the consumer and analytics off when there is no ClickHouse.
#
# Two gateways share the limits, as a fleet would. Ports:
# EDGELIMIT_PORT_BASE (default 18000) + 80 and +82 gateways, +81 demo
# upstream, +90 and +93 gateway admin, +84 and +85 the gateways' gRPC (Envoy's
# rate limit API on deploy/ratelimit), +91 consumer admin, +92 embedded
# Kafka, +300 analytics. DEMO_TRAFFIC=1 also runs the demo traffic generator
# (3:1 uneven across the gateways, a hot key, NAT-like IPs).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
source "$here/lib.sh"
source "$here/proc.sh"
cmd=${1:-up}
state=${EDGELIMIT_RUN_DIR:-$root/.run}
mkdir -p "$state"
state=$(cd "$state" && pwd)
base=${EDGELIMIT_PORT_BASE:-18000}
gw_port=$((base + 80)) up_port=$((base + 81)) admin_port=$((base + 90))
gw2_port=$((base + 82)) admin2_port=$((base + 93))
grpc_port=$((base + 84)) grpc2_port=$((base + 85))
cons_port=$((base + 91)) kafka_port=$((base + 92)) an_port=$((base + 300)) an_admin_port=$((base + 301))
servers=(redis clickhouse kafka)

say() { echo "edgelimit: $*" >&2; }

# launch NAME COMMAND...: runs COMMAND in the background with its output in
# $state/logs/NAME.log and its pid in $state/pids/NAME.pid.
launch() {
	local name=$1; shift
	mkdir -p "$state/logs" "$state/pids"
	nohup "$@" </dev/null >"$state/logs/$name.log" 2>&1 &
	echo $! >"$state/pids/$name.pid"
}

http_ok() { curl -fsS -o /dev/null --max-time 2 "$1"; }

# wait_http NAME URL: waits for URL, or shows NAME's log and fails.
wait_http() {
	if ! wait_for "$1" 60 http_ok "$2"; then
		tail -n 30 "$state/logs/$1.log" >&2 || true
		return 1
	fi
}

stop_all() {
	local f
	# Our processes first (traffic, analytics, consumer, gateway flush their
	# work), then the servers they use.
	for n in traffic analytics consumer gateway gateway2 upstream kafka-embedded; do
		f=$state/pids/$n.pid
		[ -f "$f" ] && stop_process "$f" 30
	done
	for s in "${servers[@]}"; do
		"$here/$s.sh" stop "$state" >/dev/null 2>&1 || true
	done
	rm -f "$state/run.env"
}

# start_all returns non-zero at the first thing that fails. It is called
# from `if`, where set -e does not apply, so every step says so itself.
start_all() {
	need_pkg curl curl || return 1
	if [ -f "$state/run.env" ]; then
		say "already started (see $state/run.env); run 'make stop' first"
		return 1
	fi
	rm -rf "$state/logs" "$state/pids"
	# The processes below get exactly the addresses this script chose; an
	# address from the caller's environment would contradict them.
	unset EDGELIMIT_REDIS_CLUSTER_ADDRS EDGELIMIT_REDIS_SENTINEL_ADDRS EDGELIMIT_REDIS_SENTINEL_MASTER

	say "building binaries"
	# The version the binaries report (-version, edgelimit_build_info).
	local version revision
	version=$(git -C "$root" describe --tags --always --dirty 2>/dev/null || echo dev)
	revision=$(git -C "$root" rev-parse HEAD 2>/dev/null || true)
	(cd "$root" && go build -ldflags "-X github.com/edgelimit/edgelimit/internal/boot.Version=$version -X github.com/edgelimit/edgelimit/internal/boot.Revision=$revision" \
		-o "$state/bin/" ./cmd/...) || return 1

	# Redis, or the in-memory store.
	# EDGELIMIT_PRIVATE: the standalone server only, no Cluster.
	if EDGELIMIT_PRIVATE=1 "$here/redis.sh" start "$state" >"$state/redis-start.log" 2>&1; then
		source "$state/redis.env"
		redis_addr=$EDGELIMIT_REDIS_ADDR
	else
		redis_addr=
		say "Redis unavailable ($(tail -n 1 "$state/redis-start.log")): the gateway uses its in-memory store; directives from analytics are off"
	fi

	# Kafka: the embedded kfake by default, a real broker on request.
	if [ "${EDGELIMIT_KAFKA:-embedded}" = real ] &&
		"$here/kafka.sh" start "$state" >"$state/kafka-start.log" 2>&1; then
		source "$state/kafka.env"
		brokers=$EDGELIMIT_KAFKA_BROKERS
	else
		[ "${EDGELIMIT_KAFKA:-embedded}" = real ] && say "real Kafka broker unavailable ($(tail -n 1 "$state/kafka-start.log")); using the embedded one"
		launch kafka-embedded "$state/bin/demo" kafka -listen "127.0.0.1:$kafka_port"
		wait_for "embedded kafka" 30 bash -c "exec 3<>/dev/tcp/127.0.0.1/$kafka_port" || return 1
		brokers=127.0.0.1:$kafka_port
		say "Kafka: embedded (franz-go kfake, in memory) on $brokers; EDGELIMIT_KAFKA=real for a real broker"
	fi

	# ClickHouse, or no consumer and analytics.
	if "$here/clickhouse.sh" start "$state" >"$state/clickhouse-start.log" 2>&1; then
		source "$state/clickhouse.env"
		ch_addr=$EDGELIMIT_CLICKHOUSE_ADDR
	else
		ch_addr=
		say "ClickHouse unavailable ($(tail -n 1 "$state/clickhouse-start.log")): consumer and analytics are off"
	fi

	secret=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
	token=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
	export EDGELIMIT_KEY_HASH_SECRET=$secret EDGELIMIT_ANALYTICS_TOKEN=$token
	export EDGELIMIT_REDIS_ADDR=$redis_addr EDGELIMIT_KAFKA_BROKERS=$brokers EDGELIMIT_CLICKHOUSE_ADDR=$ch_addr

	launch upstream "$state/bin/demo" upstream -listen "127.0.0.1:$up_port"
	wait_http upstream "http://127.0.0.1:$up_port/healthz" || return 1

	export EDGELIMIT_GRPC_CONFIG_DIR=$root/deploy/ratelimit
	EDGELIMIT_LISTEN=127.0.0.1:$gw_port EDGELIMIT_ADMIN_LISTEN=127.0.0.1:$admin_port \
		EDGELIMIT_GRPC_LISTEN=127.0.0.1:$grpc_port EDGELIMIT_UPSTREAM_DEMO=http://127.0.0.1:$up_port \
		launch gateway "$state/bin/gateway" -config "$root/deploy/demo/gateway.yaml"
	EDGELIMIT_LISTEN=127.0.0.1:$gw2_port EDGELIMIT_ADMIN_LISTEN=127.0.0.1:$admin2_port \
		EDGELIMIT_GRPC_LISTEN=127.0.0.1:$grpc2_port EDGELIMIT_GATEWAY_ID=demo-gateway-2 EDGELIMIT_UPSTREAM_DEMO=http://127.0.0.1:$up_port \
		launch gateway2 "$state/bin/gateway" -config "$root/deploy/demo/gateway.yaml"
	wait_http gateway "http://127.0.0.1:$admin_port/readyz" || return 1
	wait_http gateway2 "http://127.0.0.1:$admin2_port/readyz" || return 1

	if [ -n "$ch_addr" ]; then
		EDGELIMIT_CONSUMER_ADMIN_LISTEN=127.0.0.1:$cons_port \
			launch consumer "$state/bin/consumer" -config "$root/deploy/demo/consumer.yaml"
		wait_http consumer "http://127.0.0.1:$cons_port/healthz" || return 1
		EDGELIMIT_ANALYTICS_LISTEN=127.0.0.1:$an_port EDGELIMIT_ANALYTICS_ADMIN_LISTEN=127.0.0.1:$an_admin_port \
			launch analytics "$state/bin/analytics" serve -config "$root/deploy/demo/analytics.yaml"
		wait_http analytics "http://127.0.0.1:$an_port/healthz" || return 1
	fi

	if [ -n "${DEMO_TRAFFIC:-}" ]; then
		launch traffic "$state/bin/demo" traffic -gateway "http://127.0.0.1:$gw_port,http://127.0.0.1:$gw2_port" \
			-weights 3,1 -duration "${DEMO_DURATION:-10m}"
	fi

	{
		echo "export EDGELIMIT_GATEWAY_URL=http://127.0.0.1:$gw_port"
		echo "export EDGELIMIT_GATEWAY_ADMIN_URL=http://127.0.0.1:$admin_port"
		echo "export EDGELIMIT_GATEWAY2_URL=http://127.0.0.1:$gw2_port"
		echo "export EDGELIMIT_GATEWAY_GRPC_ADDR=127.0.0.1:$grpc_port"
		echo "export EDGELIMIT_GATEWAY2_GRPC_ADDR=127.0.0.1:$grpc2_port"
		echo "export EDGELIMIT_REDIS_ADDR=$redis_addr"
		echo "export EDGELIMIT_KAFKA_BROKERS=$brokers"
		echo "export EDGELIMIT_CLICKHOUSE_ADDR=$ch_addr"
		[ -n "$ch_addr" ] && echo "export EDGELIMIT_CLICKHOUSE_HTTP=${EDGELIMIT_CLICKHOUSE_HTTP:-}"
		[ -n "$ch_addr" ] && echo "export EDGELIMIT_ANALYTICS_URL=http://127.0.0.1:$an_port"
		[ -n "$ch_addr" ] && echo "export EDGELIMIT_CONSUMER_ADMIN_URL=http://127.0.0.1:$cons_port"
		echo "export EDGELIMIT_ANALYTICS_TOKEN=$token"
	} >"$state/run.env"
}

print_where() {
	source "$state/run.env"
	cat >&2 <<MSG

edgelimit is up (state and logs in $state).
  gateways           $EDGELIMIT_GATEWAY_URL and $EDGELIMIT_GATEWAY2_URL (proxy /api/ to the demo upstream)
  gateway metrics    $EDGELIMIT_GATEWAY_ADMIN_URL/metrics
  envoy rate limit   $EDGELIMIT_GATEWAY_GRPC_ADDR and $EDGELIMIT_GATEWAY2_GRPC_ADDR (gRPC, deploy/ratelimit)
MSG
	if [ -n "$EDGELIMIT_CLICKHOUSE_ADDR" ]; then
		cat >&2 <<MSG
  consumer metrics   $EDGELIMIT_CONSUMER_ADMIN_URL/metrics
  dashboard          $EDGELIMIT_ANALYTICS_URL/ (sign in with the token $EDGELIMIT_ANALYTICS_TOKEN)
  ClickHouse         $EDGELIMIT_CLICKHOUSE_ADDR (native)
MSG
	fi
	cat >&2 <<MSG

Try it (the demo plan allows 10 requests at once, then 5 per second):
  curl -si -H 'X-API-Key: demo-key-1' $EDGELIMIT_GATEWAY_URL/api/items
Demo traffic (a hot key, NAT-like IPs):  DEMO_TRAFFIC=1 make run
Ctrl-C stops everything.
MSG
}

case $cmd in
up)
	trap 'stop_all; exit 130' INT TERM
	trap 'stop_all' EXIT
	start_all
	print_where
	# Wait for Ctrl-C; the traps stop everything.
	while sleep 3600; do :; done
	;;
start)
	if ! start_all; then
		stop_all
		exit 1
	fi
	print_where
	;;
stop)
	stop_all
	;;
status)
	for f in "$state"/pids/*.pid; do
		[ -e "$f" ] || continue
		n=$(basename "$f" .pid)
		if running "$f"; then echo "$n: running (pid $(cat "$f"))"; else echo "$n: stopped"; fi
	done
	;;
*)
	echo "usage: $0 [up|start|stop|status]" >&2
	exit 2
	;;
esac
