#!/usr/bin/env bash
# testenv.sh COMMAND...: starts every real server the tests need on free
# loopback ports, runs COMMAND with their addresses in the environment, and
# stops the servers however COMMAND ends. Its exit status is COMMAND's.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
state=$(mktemp -d "${TMPDIR:-/tmp}/edgelimit-test.XXXXXX")
servers=(redis)

cleanup() {
	for s in "${servers[@]}"; do
		"$here/$s.sh" stop "$state" || true
	done
	rm -rf "$state"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

for s in "${servers[@]}"; do
	"$here/$s.sh" start "$state"
	# shellcheck disable=SC1090
	source "$state/$s.env"
done
export EDGELIMIT_REQUIRE_SERVERS=1
"$@"
