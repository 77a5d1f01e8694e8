#!/usr/bin/env bash
# chdb.sh: prints the path of a Python that imports chdb (PyPI's chdb-core,
# current ClickHouse as an in-process engine), installing it on first use.
# The wheel (~180 MB) and the venv live in EDGELIMIT_CHDB_CACHE (default
# ~/.cache/edgelimit/chdb), which CI keeps between runs: a warm run costs
# nothing, a cold one one download (a few seconds here) and ~5 s of install.
# chdb-core's pandas dependency is for DataFrame output, which the tests do
# not use, so it is installed without dependencies.
set -euo pipefail
version=26.9.0
cache=${EDGELIMIT_CHDB_CACHE:-$HOME/.cache/edgelimit/chdb}
py=$cache/venv/bin/python
if [ -x "$py" ] && "$py" -c 'import chdb' 2>/dev/null; then
	echo "$py"
	exit 0
fi
mkdir -p "$cache"
if ! ls "$cache"/chdb_core-$version-*.whl >/dev/null 2>&1; then
	pip download --quiet --no-deps -d "$cache" "chdb-core==$version" >&2
fi
python3 -m venv "$cache/venv" >&2
"$cache/venv/bin/pip" install --quiet --no-deps --no-index --find-links "$cache" "chdb-core==$version" >&2
echo "$py"
