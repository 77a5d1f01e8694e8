#!/usr/bin/env bash
# clickhouse.sh start|stop|halt|resume STATE_DIR: one ClickHouse server
# (Debian's 18.16.1) on free loopback ports, with a config of our own and all
# its data and logs under STATE_DIR/clickhouse.
# start writes STATE_DIR/clickhouse.env with EDGELIMIT_CLICKHOUSE_ADDR (native
# protocol, host:port) and EDGELIMIT_CLICKHOUSE_HTTP (host:port).
# When tls.sh made STATE_DIR/tls (and not EDGELIMIT_PRIVATE), the same server
# also serves the native protocol over TLS (tcp_port_secure) and has a user
# with a password, and start writes EDGELIMIT_TEST_CLICKHOUSE_TLS_ADDR,
# EDGELIMIT_TEST_CLICKHOUSE_USER and EDGELIMIT_TEST_CLICKHOUSE_PASSWORD.
# halt stops the server and keeps its ports and data; resume starts it again
# on them and waits until it answers.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/proc.sh"
server_args clickhouse "start|stop|halt|resume" "$@"
pidfile=$dir/clickhouse.pid

write_config() { # tcp_port http_port [tcp_port_secure password]
	local secure="" user=""
	if [ -n "${3:-}" ]; then
		# 18.16 reads the server certificate from <openSSL><server>; no
		# client certificate is asked for (verificationMode none).
		secure="<tcp_port_secure>$3</tcp_port_secure>
    <openSSL>
        <server>
            <certificateFile>$state/tls/server.pem</certificateFile>
            <privateKeyFile>$state/tls/server-key.pem</privateKeyFile>
            <verificationMode>none</verificationMode>
            <loadDefaultCAFile>false</loadDefaultCAFile>
            <cacheSessions>true</cacheSessions>
            <disableProtocols>sslv2,sslv3,tlsv1,tlsv1_1</disableProtocols>
            <preferServerCiphers>true</preferServerCiphers>
        </server>
    </openSSL>"
		user="<edgelimit>
            <password>$4</password>
            <networks>
                <ip>127.0.0.1</ip>
            </networks>
            <profile>default</profile>
            <quota>default</quota>
        </edgelimit>"
	fi
	mkdir -p "$dir/data" "$dir/tmp" "$dir/user_files" "$dir/format_schemas" "$dir/log"
	cat >"$dir/config.xml" <<EOF
<?xml version="1.0"?>
<!-- Written by deploy/local/clickhouse.sh; rewritten on every start. -->
<yandex>
    <logger>
        <level>warning</level>
        <log>$dir/log/clickhouse-server.log</log>
        <errorlog>$dir/log/clickhouse-server.err.log</errorlog>
        <size>10M</size>
        <count>2</count>
    </logger>
    <listen_host>127.0.0.1</listen_host>
    <tcp_port>$1</tcp_port>
    <http_port>$2</http_port>
    $secure
    <max_connections>1024</max_connections>
    <keep_alive_timeout>3</keep_alive_timeout>
    <max_concurrent_queries>100</max_concurrent_queries>
    <uncompressed_cache_size>67108864</uncompressed_cache_size>
    <mark_cache_size>67108864</mark_cache_size>
    <path>$dir/data/</path>
    <tmp_path>$dir/tmp/</tmp_path>
    <user_files_path>$dir/user_files/</user_files_path>
    <format_schema_path>$dir/format_schemas/</format_schema_path>
    <users_config>$dir/users.xml</users_config>
    <include_from>$dir/metrika.xml</include_from>
    <default_profile>default</default_profile>
    <default_database>default</default_database>
    <timezone>UTC</timezone>
    <mlock_executable>false</mlock_executable>
    <!-- Seconds shutdown waits for running queries (default 5). -->
    <shutdown_wait_unfinished>1</shutdown_wait_unfinished>
    <builtin_dictionaries_reload_interval>3600</builtin_dictionaries_reload_interval>
    <max_session_timeout>3600</max_session_timeout>
    <default_session_timeout>60</default_session_timeout>
</yandex>
EOF
	cat >"$dir/users.xml" <<EOF
<?xml version="1.0"?>
<!-- Written by deploy/local/clickhouse.sh: user "default", no password, loopback only. -->
<yandex>
    <profiles>
        <default>
            <max_memory_usage>2000000000</max_memory_usage>
            <use_uncompressed_cache>0</use_uncompressed_cache>
            <load_balancing>random</load_balancing>
            <!-- An idle connection notices shutdown within poll_interval
                 seconds (default 10): keeps halt and stop quick. -->
            <poll_interval>1</poll_interval>
        </default>
    </profiles>
    <users>
        <default>
            <password></password>
            <networks>
                <ip>127.0.0.1</ip>
            </networks>
            <profile>default</profile>
            <quota>default</quota>
        </default>
        $user
    </users>
    <quotas>
        <default>
            <interval>
                <duration>3600</duration>
                <queries>0</queries>
                <errors>0</errors>
                <result_rows>0</result_rows>
                <read_rows>0</read_rows>
                <execution_time>0</execution_time>
            </interval>
        </default>
    </quotas>
</yandex>
EOF
	echo '<?xml version="1.0"?><yandex></yandex>' >"$dir/metrika.xml"
	echo "$1 $2 ${3:-} ${4:-}" >"$dir/ports"
	chmod 600 "$dir/ports" "$dir/users.xml"
}

run_server() {
	local tcp
	read -r tcp _ <"$dir/ports"
	# The server forks nothing here: no --daemon, so $! is the server itself.
	# Its stdio goes to a file so that callers reading our output (a Go
	# test's exec.Cmd) are not held open by it.
	nohup clickhouse-server --config-file="$dir/config.xml" \
		</dev/null >"$dir/log/stdout.log" 2>&1 &
	echo $! >"$pidfile"
	if ! wait_for "clickhouse on 127.0.0.1:$tcp" 60 \
		clickhouse-client --host 127.0.0.1 --port "$tcp" -q 'SELECT 1'; then
		tail -n 20 "$dir/log/stdout.log" "$dir/log/clickhouse-server.err.log" >&2 || true
		stop_process "$pidfile"
		return 1
	fi
}

write_env() {
	local tcp http secure pw
	read -r tcp http secure pw <"$dir/ports"
	{
		echo "export EDGELIMIT_CLICKHOUSE_ADDR=127.0.0.1:$tcp"
		echo "export EDGELIMIT_CLICKHOUSE_HTTP=127.0.0.1:$http"
		if [ -n "$secure" ]; then
			echo "export EDGELIMIT_TEST_CLICKHOUSE_TLS_ADDR=127.0.0.1:$secure"
			echo "export EDGELIMIT_TEST_CLICKHOUSE_USER=edgelimit"
			echo "export EDGELIMIT_TEST_CLICKHOUSE_PASSWORD=$pw"
		fi
	} >"$state/clickhouse.env"
	echo "clickhouse: native 127.0.0.1:$tcp, http 127.0.0.1:$http${secure:+, native tls 127.0.0.1:$secure}" >&2
}

case $cmd in
start)
	need_pkg clickhouse-server clickhouse-server clickhouse-client
	need_pkg clickhouse-client clickhouse-client
	if running "$pidfile"; then
		write_env
		exit 0
	fi
	mkdir -p "$dir"
	if [ -f "$state/tls/ca.pem" ] && [ -z "${EDGELIMIT_PRIVATE:-}" ]; then
		write_config "$(free_port)" "$(free_port)" "$(free_port)" "$(openssl rand -hex 16)"
	else
		write_config "$(free_port)" "$(free_port)"
	fi
	run_server
	start_watchdog "$0" "$state" "$dir"
	write_env
	;;
resume)
	[ -f "$dir/ports" ] || { echo "clickhouse: nothing to resume in $dir" >&2; exit 1; }
	running "$pidfile" || run_server
	;;
halt)
	stop_process "$pidfile"
	;;
stop)
	stop_watchdog "$dir"
	stop_process "$pidfile"
	rm -f "$state/clickhouse.env"
	;;
esac
