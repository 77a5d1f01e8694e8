# shellcheck shell=bash
# Process helpers for the local server scripts. Sourced after lib.sh, not run.

# alive PID: the process runs (a zombie that init has not reaped yet does
# not count: daemons and our nohup'd servers are init's children).
alive() {
	local s
	s=$(cut -d' ' -f3 "/proc/$1/stat" 2>/dev/null) || return 1
	[ -n "$s" ] && [ "$s" != Z ] && [ "$s" != X ]
}

# running FILE: the process named in pidfile FILE is alive.
running() {
	[ -f "$1" ] && alive "$(cat "$1")"
}

# stop_process FILE [SECONDS]: like lib.sh's stop_pidfile, but done once the
# process has exited rather than once init has reaped it. SIGTERM, then
# SIGKILL after SECONDS (default 20).
stop_process() {
	local f=$1 secs=${2:-20} pid i
	[ -f "$f" ] || return 0
	pid=$(cat "$f")
	if alive "$pid"; then
		kill "$pid" 2>/dev/null || true
		for ((i = 0; i < secs * 20; i++)); do
			alive "$pid" || break
			sleep 0.05
		done
		if alive "$pid"; then
			echo "pid $pid ($f) still running after ${secs}s: killing it" >&2
			kill -9 "$pid" 2>/dev/null || true
		fi
	fi
	rm -f "$f"
}

# Owner watchdog. When EDGELIMIT_OWNER_PID is set (testenv.sh sets it to
# itself, internal/testenv.Private to the test binary), start leaves a small
# watcher behind that runs "SCRIPT stop STATE_DIR" once that process is gone,
# so a test binary killed by a timeout, or a testenv.sh killed with SIGKILL,
# leaves no server running. The watcher outlives halt; stop ends it.

# start_watchdog SCRIPT STATE_DIR DIR: the watcher's pid goes to
# DIR/watchdog.pid.
start_watchdog() {
	local owner=${EDGELIMIT_OWNER_PID:-} script state=$2 dir=$3
	[ -n "$owner" ] || return 0
	stop_watchdog "$dir"
	script=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
	# setsid: its own process group, so stop_watchdog can end the watcher
	# and its sleep together. There is no job control here, so setsid does
	# not fork and $! is the watcher itself.
	# shellcheck disable=SC2016 # expanded by the watcher's bash
	setsid bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 1; done; exec "$2" stop "$3"' \
		watchdog "$owner" "$script" "$state" </dev/null >/dev/null 2>&1 &
	echo $! >"$dir/watchdog.pid"
}

# stop_watchdog DIR: ends the watcher started for DIR, unless we are it.
stop_watchdog() {
	local f=$1/watchdog.pid pid
	[ -f "$f" ] || return 0
	pid=$(cat "$f")
	rm -f "$f"
	[ "$pid" = "$$" ] && return 0
	kill -- "-$pid" 2>/dev/null || kill "$pid" 2>/dev/null || true
}

# stop_all DIR ENV_FILE: ends DIR's watcher and every process with a pidfile
# in DIR, then removes ENV_FILE, so nothing is left to point at them.
stop_all() {
	local dir=$1 f
	stop_watchdog "$dir"
	for f in "$dir"/*.pid; do
		[ -e "$f" ] && stop_process "$f"
	done
	rm -f "$2"
}
