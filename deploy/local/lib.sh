# Shared helpers for the local server scripts. Sourced, not run.
# Every server binds to 127.0.0.1 on a free port, keeps its data under the
# state folder given to it, and writes "export NAME=value" lines to
# $STATE/<server>.env for tests and `make run` to source.

set -euo pipefail

# server_args NAME VERBS "$@": how every server script reads its arguments,
# VERB STATE_DIR, VERBS being the verbs it takes (start|stop|...). Sets cmd to
# VERB, state to STATE_DIR, created and made absolute, and dir to the
# server's own folder in it, $state/NAME; other arguments get the usage line.
server_args() {
	local name=$1 verbs=$2
	shift 2
	if [ $# -ne 2 ] || [[ "|$verbs|" != *"|$1|"* ]] || [ -z "$2" ]; then
		echo "usage: $0 $verbs STATE_DIR" >&2
		exit 2
	fi
	cmd=$1
	state=$(mkdir -p "$2" && cd "$2" && pwd)
	dir=$state/$name
}

free_port() {
	python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# need_pkg BINARY PACKAGE...: installs the Debian packages when BINARY is
# missing and we are root; otherwise says the exact command and fails.
need_pkg() {
	local bin=$1; shift
	if command -v "$bin" >/dev/null 2>&1 || [ -x "$bin" ]; then
		return 0
	fi
	if [ "$(id -u)" = 0 ]; then
		echo "installing $* (missing $bin)" >&2
		if [ -z "${EDGELIMIT_APT_UPDATED:-}" ]; then
			apt-get update -qq >&2
			export EDGELIMIT_APT_UPDATED=1
		fi
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >&2
	else
		echo "missing $bin: run  sudo apt-get install -y $*" >&2
		return 1
	fi
}

# wait_for DESCRIPTION SECONDS COMMAND...: retries COMMAND until it succeeds.
wait_for() {
	local what=$1 secs=$2; shift 2
	local deadline=$((SECONDS + secs))
	until "$@" >/dev/null 2>&1; do
		if [ $SECONDS -ge $deadline ]; then
			echo "timed out after ${secs}s waiting for $what" >&2
			return 1
		fi
		sleep 0.2
	done
}

# stop_pidfile FILE: stops the process named in FILE, waiting for it to go.
stop_pidfile() {
	local f=$1 pid
	[ -f "$f" ] || return 0
	pid=$(cat "$f")
	if kill -0 "$pid" 2>/dev/null; then
		kill "$pid" 2>/dev/null || true
		for _ in $(seq 1 100); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		kill -9 "$pid" 2>/dev/null || true
	fi
	rm -f "$f"
}

# start_redis DIR NAME PORT [ARGS...]: a daemonized redis-server that saves
# nothing, its data under DIR/NAME, pid and log at DIR/NAME.pid and .log;
# returns once it answers PING. ARGS go to redis-server as they are.
start_redis() {
	local dir=$1 name=$2 port=$3; shift 3
	mkdir -p "$dir/$name"
	redis-server --bind 127.0.0.1 --port "$port" --dir "$dir/$name" \
		--save "" --appendonly no --daemonize yes \
		--pidfile "$dir/$name.pid" --logfile "$dir/$name.log" "$@"
	wait_for "redis $name on $port" 20 redis-cli -p "$port" ping
}

# create_cluster LOG REPLICAS CLI... -- ADDR...: makes a Redis Cluster of the
# nodes at ADDR (host:port) with REPLICAS replicas a master, the output of
# "--cluster create" to LOG, and returns once every node says cluster_state:ok.
# CLI is the client command with any TLS and ACL flags (at least redis-cli).
create_cluster() {
	local log=$1 replicas=$2 cli=() a; shift 2
	while [ "$1" != -- ]; do
		cli+=("$1"); shift
	done
	shift
	"${cli[@]}" --cluster create "$@" --cluster-replicas "$replicas" --cluster-yes >"$log" 2>&1
	for a in "$@"; do
		wait_for "cluster state ok on $a" 30 bash -c "$(printf '%q ' "${cli[@]}") -p ${a##*:} cluster info | grep -q cluster_state:ok"
	done
}

# redis_tls_conf TLS_DIR PORT: the redis.conf lines of a server that listens
# on 127.0.0.1 over TLS only (plain port 0) with the test stack's
# certificates in TLS_DIR; a client certificate is checked when given.
redis_tls_conf() {
	printf '%s\n' "bind 127.0.0.1" "port 0" "tls-port $2" \
		"tls-cert-file $1/server.pem" "tls-key-file $1/server-key.pem" \
		"tls-ca-cert-file $1/ca.pem" "tls-auth-clients optional"
}
