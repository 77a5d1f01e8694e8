#!/usr/bin/env bash
# bench.sh: the benchmarks behind `make bench` (run inside testenv.sh, so the
# real servers are up). Prints Go benchmark lines and, beside the limiter's,
# the ceiling: pipelines of 16 running EVALSHA of the same script with the
# same 3 rules on the same Redis (BenchmarkCeiling). Not part of make test.
set -euo pipefail
cd "$(dirname "$0")/../.."
BENCHTIME=${BENCHTIME:-5s}
host=${EDGELIMIT_REDIS_ADDR%:*}
port=${EDGELIMIT_REDIS_ADDR##*:}

echo "== limiter: Allow, 64 callers, 3 rules/key (go test -bench BenchmarkAllow -benchtime $BENCHTIME ./limiter/)"
go test -run '^$' -bench BenchmarkAllow -benchtime "$BENCHTIME" ./limiter/

echo "== ceiling: allow.lua by EVALSHA, pipelines of 16 on 64 connections, 3 rules, 100k random keys (go test -bench BenchmarkCeiling ./limiter/)"
# Same rules as BenchmarkAllow: 100/min, 5000/h, 50000/day token buckets,
# with KEYS and ARGV as the limiter sends them. The rules travel packed in
# one binary argument, which redis-benchmark cannot send (it cuts arguments
# at NUL bytes). Beside it the previous script (a hash per rule); each
# reports Redis' CPU per check and memory per identity.
go test -run '^$' -bench BenchmarkCeiling -benchtime "${CEILING_N:-200000}x" ./limiter/

echo "== gateway through wrk (gateway/testdata/wrk/run.sh): limiter off, random keys, hot key"
gateway/testdata/wrk/run.sh

echo "== analytics: trend queries over 10M events (seeds ClickHouse, ~1 min)"
go test -run '^$' -bench TrendQueries -benchtime 10x ./analytics/

for pkg in gateway consumer; do
	if ls "$pkg"/*_test.go >/dev/null 2>&1; then
		echo "== $pkg (go test -bench . -benchtime $BENCHTIME ./$pkg/...)"
		go test -run '^$' -bench . -benchtime "$BENCHTIME" "./$pkg/..."
	fi
done
