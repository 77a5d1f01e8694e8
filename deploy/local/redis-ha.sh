#!/usr/bin/env bash
# redis-ha.sh start|stop|halt STATE_DIR: a Redis primary, one replica and
# three Sentinels (master name "edgelimit-ha", quorum 2) on free loopback
# ports, for failover tests (internal/testenv.Private(t, "redis-ha")); data
# under STATE_DIR/redis-ha. The Sentinels call the primary down after 1s
# (down-after-milliseconds 1000), so a failover takes seconds, not the
# default 30s.
# start writes STATE_DIR/redis-ha.env with EDGELIMIT_REDIS_SENTINEL_ADDRS,
# EDGELIMIT_REDIS_SENTINEL_MASTER, EDGELIMIT_TEST_REDIS_PRIMARY_ADDR and
# EDGELIMIT_TEST_REDIS_REPLICA_ADDR.
# halt kills the primary with SIGKILL, as a crash would (it is not resumed:
# the replica takes over).
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/proc.sh"
server_args redis-ha "start|stop|halt" "$@"
master=edgelimit-ha

case $cmd in
start)
	need_pkg redis-server redis-server
	need_pkg redis-cli redis-tools
	mkdir -p "$dir"
	p=$(free_port)
	r=$(free_port)
	start_redis "$dir" primary "$p"
	start_redis "$dir" replica "$r" --replicaof 127.0.0.1 "$p"
	wait_for "replica in sync" 20 bash -c "redis-cli -p $r info replication | grep -q master_link_status:up"
	start_watchdog "$0" "$state" "$dir"
	addrs=()
	for i in 1 2 3; do
		s=$(free_port)
		mkdir -p "$dir/sentinel$i"
		printf '%s\n' "bind 127.0.0.1" "port $s" "daemonize yes" \
			"pidfile $dir/sentinel$i.pid" "logfile $dir/sentinel$i.log" "dir $dir/sentinel$i" \
			"sentinel monitor $master 127.0.0.1 $p 2" \
			"sentinel down-after-milliseconds $master 1000" \
			"sentinel failover-timeout $master 5000" \
			"sentinel parallel-syncs $master 1" >"$dir/sentinel$i.conf"
		redis-server "$dir/sentinel$i.conf" --sentinel
		addrs+=("127.0.0.1:$s")
	done
	# Ready when every Sentinel knows the replica and the two others:
	# only then can they agree on a failover.
	for a in "${addrs[@]}"; do
		wait_for "sentinel ${a##*:} to see its peers" 30 bash -c \
			"redis-cli -p ${a##*:} sentinel master $master | tr -d '\r' | paste - - | grep -qP '^num-other-sentinels\t2$' &&
			 redis-cli -p ${a##*:} sentinel master $master | tr -d '\r' | paste - - | grep -qP '^num-slaves\t1$'"
	done
	{
		echo "export EDGELIMIT_REDIS_SENTINEL_ADDRS=$(IFS=,; echo "${addrs[*]}")"
		echo "export EDGELIMIT_REDIS_SENTINEL_MASTER=$master"
		echo "export EDGELIMIT_TEST_REDIS_PRIMARY_ADDR=127.0.0.1:$p"
		echo "export EDGELIMIT_TEST_REDIS_REPLICA_ADDR=127.0.0.1:$r"
	} >"$state/redis-ha.env"
	echo "redis-ha: primary 127.0.0.1:$p, replica 127.0.0.1:$r, sentinels ${addrs[*]}" >&2
	;;
halt)
	[ -f "$dir/primary.pid" ] && kill -9 "$(cat "$dir/primary.pid")" 2>/dev/null
	rm -f "$dir/primary.pid"
	;;
stop)
	stop_all "$dir" "$state/redis-ha.env"
	;;
esac
