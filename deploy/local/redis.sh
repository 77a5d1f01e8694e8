#!/usr/bin/env bash
# redis.sh start|stop|halt|resume STATE_DIR: one standalone Redis, a Sentinel
# watching it (master name "edgelimit"), and a Redis Cluster of three
# masters, on free loopback ports, data under STATE_DIR/redis.
# start writes STATE_DIR/redis.env with EDGELIMIT_REDIS_ADDR,
# EDGELIMIT_REDIS_SENTINEL_ADDRS, EDGELIMIT_REDIS_SENTINEL_MASTER and
# EDGELIMIT_REDIS_CLUSTER_ADDRS (comma separated).
# When tls.sh made STATE_DIR/tls, start also runs a secure standalone Redis:
# TLS only (plain port 0, client certificates optional), the default user
# off and one ACL user, and writes EDGELIMIT_TEST_REDIS_TLS_ADDR,
# EDGELIMIT_TEST_REDIS_USER and EDGELIMIT_TEST_REDIS_PASSWORD; and a Sentinel
# watching it (master "edgelimit-tls"), TLS only with an ACL user of its
# own: EDGELIMIT_TEST_REDIS_TLS_SENTINEL_ADDRS, _TLS_SENTINEL_MASTER,
# EDGELIMIT_TEST_REDIS_SENTINEL_USER and _SENTINEL_PASSWORD.
# With EDGELIMIT_PRIVATE=1 (internal/testenv.Private) start runs the
# standalone server only, and writes EDGELIMIT_REDIS_ADDR only.
# halt stops the standalone server and keeps its port; resume starts it again
# on that port, empty (it saves nothing: --save "").
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/proc.sh"
server_args redis "start|stop|halt|resume" "$@"

# start_secure: the TLS + ACL Redis (see the header); prints its env lines.
start_secure() {
	local tls=$state/tls port pw
	port=$(free_port)
	pw=$(openssl rand -hex 16)
	mkdir -p "$dir/secure"
	# A config file, not flags: ACL rules hold characters flags would mangle.
	cat >"$dir/secure.conf" <<CONF
$(redis_tls_conf "$tls" "$port")
save ""
appendonly no
daemonize yes
dir $dir/secure
pidfile $dir/secure.pid
logfile $dir/secure.log
user default off
user edgelimit on >$pw ~* &* +@all
CONF
	chmod 600 "$dir/secure.conf"
	redis-server "$dir/secure.conf"
	wait_for "redis secure on $port" 20 redis-cli --tls --cacert "$tls/ca.pem" -p "$port" \
		--user edgelimit --pass "$pw" --no-auth-warning ping
	echo "export EDGELIMIT_TEST_REDIS_TLS_ADDR=127.0.0.1:$port"
	echo "export EDGELIMIT_TEST_REDIS_USER=edgelimit"
	echo "export EDGELIMIT_TEST_REDIS_PASSWORD=$pw"

	# A Sentinel for it, TLS only too, with credentials of its own (an ACL
	# user; Sentinel 6.2+): it reaches the master over TLS as the ACL user.
	local sport spw
	sport=$(free_port)
	spw=$(openssl rand -hex 16)
	mkdir -p "$dir/secure-sentinel"
	cat >"$dir/secure-sentinel.conf" <<CONF
$(redis_tls_conf "$tls" "$sport")
tls-replication yes
daemonize yes
pidfile $dir/secure-sentinel.pid
logfile $dir/secure-sentinel.log
dir $dir/secure-sentinel
sentinel monitor edgelimit-tls 127.0.0.1 $port 1
sentinel auth-user edgelimit-tls edgelimit
sentinel auth-pass edgelimit-tls $pw
sentinel down-after-milliseconds edgelimit-tls 5000
user default off
user sentinel on >$spw &* +@all
CONF
	chmod 600 "$dir/secure-sentinel.conf"
	redis-server "$dir/secure-sentinel.conf" --sentinel
	wait_for "secure sentinel on $sport" 20 bash -c "redis-cli --tls --cacert $tls/ca.pem -p $sport --user sentinel --pass $spw --no-auth-warning sentinel get-master-addr-by-name edgelimit-tls | grep -qx $port"
	echo "export EDGELIMIT_TEST_REDIS_TLS_SENTINEL_ADDRS=127.0.0.1:$sport"
	echo "export EDGELIMIT_TEST_REDIS_TLS_SENTINEL_MASTER=edgelimit-tls"
	echo "export EDGELIMIT_TEST_REDIS_SENTINEL_USER=sentinel"
	echo "export EDGELIMIT_TEST_REDIS_SENTINEL_PASSWORD=$spw"
}

case $cmd in
start)
	need_pkg redis-server redis-server
	need_pkg redis-cli redis-tools
	if [ -f "$state/redis.env" ] && running "$dir/standalone.pid"; then
		exit 0 # already running
	fi
	mkdir -p "$dir"
	port=$(free_port)
	echo "$port" >"$dir/standalone.port"
	start_redis "$dir" standalone "$port"
	start_watchdog "$0" "$state" "$dir"
	if [ -n "${EDGELIMIT_PRIVATE:-}" ]; then
		echo "export EDGELIMIT_REDIS_ADDR=127.0.0.1:$port" >"$state/redis.env"
		echo "redis: standalone 127.0.0.1:$port" >&2
		exit 0
	fi
	addrs=()
	for i in 1 2 3; do
		p=$(free_port)
		# The bus port would default to p+10000, which may be taken or
		# past 65535; pick a free one explicitly.
		start_redis "$dir" "cluster$i" "$p" --cluster-enabled yes --cluster-port "$(free_port)" \
			--cluster-config-file "$dir/cluster$i/nodes.conf" --cluster-node-timeout 2000
		addrs+=("127.0.0.1:$p")
	done
	create_cluster "$dir/cluster-create.log" 0 redis-cli -- "${addrs[@]}"
	# A Sentinel, so clients that find their master through Sentinel are
	# tested too. With no replica it never fails over; it only answers.
	sport=$(free_port)
	mkdir -p "$dir/sentinel"
	printf '%s\n' "bind 127.0.0.1" "port $sport" "daemonize yes" \
		"pidfile $dir/sentinel.pid" "logfile $dir/sentinel.log" "dir $dir/sentinel" \
		"sentinel monitor edgelimit 127.0.0.1 $port 1" \
		"sentinel down-after-milliseconds edgelimit 5000" >"$dir/sentinel.conf"
	redis-server "$dir/sentinel.conf" --sentinel
	wait_for "sentinel on $sport" 20 bash -c "redis-cli -p $sport sentinel get-master-addr-by-name edgelimit | grep -qx $port"
	{
		echo "export EDGELIMIT_REDIS_ADDR=127.0.0.1:$port"
		echo "export EDGELIMIT_REDIS_SENTINEL_ADDRS=127.0.0.1:$sport"
		echo "export EDGELIMIT_REDIS_SENTINEL_MASTER=edgelimit"
		echo "export EDGELIMIT_REDIS_CLUSTER_ADDRS=$(IFS=,; echo "${addrs[*]}")"
		if [ -f "$state/tls/ca.pem" ]; then
			start_secure
		fi
	} >"$state/redis.env"
	echo "redis: standalone 127.0.0.1:$port, sentinel 127.0.0.1:$sport, cluster ${addrs[*]}$(grep -o "TLS_ADDR=.*" "$state/redis.env" | sed "s/TLS_ADDR=/, tls+acl /")" >&2
	;;
halt)
	stop_process "$dir/standalone.pid"
	;;
resume)
	[ -f "$dir/standalone.port" ] || { echo "redis: nothing to resume in $dir" >&2; exit 1; }
	start_redis "$dir" standalone "$(cat "$dir/standalone.port")"
	;;
stop)
	stop_all "$dir" "$state/redis.env"
	;;
esac
