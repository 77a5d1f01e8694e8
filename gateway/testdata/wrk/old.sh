#!/usr/bin/env bash
# old.sh BASE: builds the gateway at git revision BASE, once (kept under
# .run/bench by commit, from `git archive`: no worktree to clean up), and
# prints the binary's path. run.sh and grpc.sh run it beside this tree's.
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
sha=$(git -C "$root" rev-parse --verify "$1^{commit}")
old=$root/.run/bench/gateway-$sha
if [ ! -x "$old" ]; then
	echo "== building the old gateway at $1 ($sha)" >&2
	mkdir -p "$root/.run/bench"
	src=$(mktemp -d)
	trap 'rm -rf "$src"' EXIT
	git -C "$root" archive "$sha" | tar -x -C "$src"
	(cd "$src" && go build -buildvcs=false -o "$old.tmp" ./cmd/gateway) && mv "$old.tmp" "$old"
fi
echo "$old"
