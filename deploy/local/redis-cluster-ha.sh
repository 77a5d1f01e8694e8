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
server_args redis-cluster-ha "start|stop" "$@"

case $cmd in
start)
	need_pkg redis-server redis-server
	need_pkg redis-cli redis-tools
	mkdir -p "$dir"
	addrs=()
	for i in 1 2 3 4 5 6; do
		p=$(free_port)
		start_redis "$dir" "node$i" "$p" --cluster-enabled yes --cluster-port "$(free_port)" \
			--cluster-config-file "$dir/node$i/nodes.conf" --cluster-node-timeout 1000
		addrs+=("127.0.0.1:$p")
	done
	start_watchdog "$0" "$state" "$dir"
	# The first three become masters, the last three their replicas.
	create_cluster "$dir/cluster-create.log" 1 redis-cli -- "${addrs[@]}"
	wait_for "three replicas in sync" 30 bash -c \
		"[ \$(for a in ${addrs[*]}; do redis-cli -p \${a##*:} info replication; done | grep -c master_link_status:up) -eq 3 ]"
	echo "export EDGELIMIT_REDIS_CLUSTER_ADDRS=$(IFS=,; echo "${addrs[*]:0:3}")" >"$state/redis-cluster-ha.env"
	echo "redis-cluster-ha: ${addrs[*]}" >&2
	;;
stop)
	stop_all "$dir" "$state/redis-cluster-ha.env"
	;;
esac
