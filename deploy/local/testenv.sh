#!/usr/bin/env bash
# testenv.sh COMMAND...: starts every real server the tests need on free
# loopback ports, runs COMMAND with their addresses in the environment, and
# stops the servers however COMMAND ends. Its exit status is COMMAND's.
#
# COMMAND also gets EDGELIMIT_TESTENV_DIR (this folder), so that a test can
# start private servers of its own (internal/testenv.Private), and
# EDGELIMIT_REQUIRE_SERVERS=1, which turns a missing server into a failure.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
state=$(mktemp -d "${TMPDIR:-/tmp}/edgelimit-test.XXXXXX")
# tls first: the others add their secure servers when its certificates exist.
servers=(tls redis clickhouse kafka prometheus chromium)

cleanup() {
	# In parallel: each waits for its servers to shut down cleanly.
	for s in "${servers[@]}"; do
		"$here/$s.sh" stop "$state" &
	done
	wait || true
	rm -rf "$state"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# One at a time: a start may apt-get install, and apt takes a lock.
# EDGELIMIT_OWNER_PID: should this script be killed without its trap
# running, each server stops itself once we are gone (proc.sh).
for s in "${servers[@]}"; do
	EDGELIMIT_OWNER_PID=$$ "$here/$s.sh" start "$state"
	# shellcheck disable=SC1090
	source "$state/$s.env"
done
export EDGELIMIT_TESTENV_DIR=$here
export EDGELIMIT_REQUIRE_SERVERS=1
"$@"
