#!/usr/bin/env bash
# redis-cluster-tls.sh start|stop STATE_DIR: a Redis Cluster of three
# masters that speaks TLS only (plain ports 0, the cluster bus over TLS
# too) and has the default user off and one ACL user, for tests of the
# Cluster link (internal/testenv.Private(t, "redis-cluster-tls")). The
# certificates are the test stack's (EDGELIMIT_TEST_TLS_DIR, from tls.sh).
# start writes STATE_DIR/redis-cluster-tls.env with
# EDGELIMIT_TEST_REDIS_TLS_CLUSTER_ADDRS, EDGELIMIT_TEST_REDIS_USER and
# EDGELIMIT_TEST_REDIS_PASSWORD.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/proc.sh"
server_args redis-cluster-tls "start|stop" "$@"

case $cmd in
start)
	need_pkg redis-server redis-server
	need_pkg redis-cli redis-tools
	tls=${EDGELIMIT_TEST_TLS_DIR:?set by testenv.sh (tls.sh)}
	mkdir -p "$dir"
	pw=$(openssl rand -hex 16)
	cli=(redis-cli --tls --cacert "$tls/ca.pem" --user edgelimit --pass "$pw" --no-auth-warning)
	addrs=()
	for i in 1 2 3; do
		p=$(free_port)
		mkdir -p "$dir/node$i"
		cat >"$dir/node$i.conf" <<CONF
$(redis_tls_conf "$tls" "$p")
tls-cluster yes
tls-replication yes
cluster-enabled yes
cluster-port $(free_port)
cluster-config-file $dir/node$i/nodes.conf
cluster-node-timeout 2000
save ""
appendonly no
daemonize yes
dir $dir/node$i
pidfile $dir/node$i.pid
logfile $dir/node$i.log
user default off
user edgelimit on >$pw ~* &* +@all
CONF
		chmod 600 "$dir/node$i.conf"
		redis-server "$dir/node$i.conf"
		wait_for "redis tls cluster node on $p" 20 "${cli[@]}" -p "$p" ping
		addrs+=("127.0.0.1:$p")
	done
	start_watchdog "$0" "$state" "$dir"
	create_cluster "$dir/cluster-create.log" 0 "${cli[@]}" -- "${addrs[@]}"
	{
		echo "export EDGELIMIT_TEST_REDIS_TLS_CLUSTER_ADDRS=$(IFS=,; echo "${addrs[*]}")"
		echo "export EDGELIMIT_TEST_REDIS_USER=edgelimit"
		echo "export EDGELIMIT_TEST_REDIS_PASSWORD=$pw"
	} >"$state/redis-cluster-tls.env"
	echo "redis-cluster-tls: ${addrs[*]}" >&2
	;;
stop)
	stop_all "$dir" "$state/redis-cluster-tls.env"
	;;
esac
