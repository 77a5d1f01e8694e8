#!/usr/bin/env bash
# redis-cluster-ha.sh start|stop STATE_DIR: a Redis Cluster of three masters,
# each with one replica, on free loopback ports, for failover tests
# (internal/testenv.Private(t, "redis-cluster-ha")); data under
# STATE_DIR/redis-cluster-ha. cluster-node-timeout 1000: a dead master's
# replica takes over within seconds.
# start writes STATE_DIR/redis-cluster-ha.env with
# EDGELIMIT_REDIS_CLUSTER_ADDRS (the three masters).
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/proc.sh"
cmd=${1:?start or stop}
state=${2:?state dir}
state=$(mkdir -p "$state" && cd "$state" && pwd)
dir=$state/redis-cluster-ha

case $cmd in
start)
	need_pkg redis-server redis-server
	need_pkg redis-cli redis-tools
	mkdir -p "$dir"
	addrs=()
	for i in 1 2 3 4 5 6; do
		p=$(free_port)
		mkdir -p "$dir/node$i"
		redis-server --bind 127.0.0.1 --port "$p" --dir "$dir/node$i" \
			--save "" --appendonly no --daemonize yes \
			--pidfile "$dir/node$i.pid" --logfile "$dir/node$i.log" \
			--cluster-enabled yes --cluster-port "$(free_port)" \
			--cluster-config-file "$dir/node$i/nodes.conf" --cluster-node-timeout 1000
		wait_for "redis node$i on $p" 20 redis-cli -p "$p" ping
		addrs+=("127.0.0.1:$p")
	done
	start_watchdog "$0" "$state" "$dir"
	# The first three become masters, the last three their replicas.
	redis-cli --cluster create "${addrs[@]}" --cluster-replicas 1 --cluster-yes >"$dir/cluster-create.log" 2>&1
	for a in "${addrs[@]}"; do
		wait_for "cluster state ok on $a" 30 bash -c "redis-cli -p ${a##*:} cluster info | grep -q cluster_state:ok"
	done
	wait_for "three replicas in sync" 30 bash -c \
		"[ \$(for a in ${addrs[*]}; do redis-cli -p \${a##*:} info replication; done | grep -c master_link_status:up) -eq 3 ]"
	echo "export EDGELIMIT_REDIS_CLUSTER_ADDRS=$(IFS=,; echo "${addrs[*]:0:3}")" >"$state/redis-cluster-ha.env"
	echo "redis-cluster-ha: ${addrs[*]}" >&2
	;;
stop)
	stop_watchdog "$dir"
	for f in "$dir"/*.pid; do
		[ -e "$f" ] && stop_process "$f"
	done
	rm -f "$state/redis-cluster-ha.env"
	;;
*)
	echo "usage: $0 start|stop STATE_DIR" >&2
	exit 2
	;;
esac
