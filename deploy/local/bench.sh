#!/usr/bin/env bash
# bench.sh: the benchmarks behind `make bench` (run inside testenv.sh, so the
# real servers are up). Prints Go benchmark lines and, beside the limiter's,
# the ceiling: redis-benchmark -P 16 running EVALSHA of the same script with
# the same 3 rules on the same Redis; then the gateway's cases of issue 11
# beside an old revision and the peer (gateway/testdata/wrk/run.sh: BASE,
# ROUNDS, DURATION), then the analytics and the other Go benchmarks. Not
# part of make test. CASES=a,b,... runs a subset: limiter, ceiling,
# analytics, go, and run.sh's (check memory proxy events openloop hot
# denied peer); the default is all.
set -euo pipefail
cd "$(dirname "$0")/../.."
# 2s, not 5s: the whole of make bench in about 15 minutes on a busy 2-core machine.
BENCHTIME=${BENCHTIME:-2s}
export CASES=${CASES:-all}
want() { [ "$CASES" = all ] || [[ ",$CASES," == *",$1,"* ]]; }
trap 'echo "== make bench took $((SECONDS / 60)) min $((SECONDS % 60)) s"' EXIT
host=${EDGELIMIT_REDIS_ADDR%:*}
port=${EDGELIMIT_REDIS_ADDR##*:}

if want limiter; then
echo "== limiter: Allow, 64 callers, 3 rules/key (go test -bench BenchmarkAllow -benchtime $BENCHTIME ./limiter/)"
go test -run '^$' -bench BenchmarkAllow -benchtime "$BENCHTIME" ./limiter/
fi
if want ceiling; then

echo "== ceiling: redis-benchmark -P 16 -c 64 EVALSHA allow.lua, 3 rules, 100k random keys"
sha=$(redis-cli -h "$host" -p "$port" SCRIPT LOAD "$(cat limiter/allow.lua)")
# Same rules as BenchmarkAllow: 100/min, 5000/h, 50000/day token buckets.
redis-benchmark -h "$host" -p "$port" -P 16 -c 64 -n "${CEILING_N:-500000}" -r 100000 -q \
	EVALSHA "$sha" 3 'rb:{__rand_int__}:minute:tb' 'rb:{__rand_int__}:hour:tb' 'rb:{__rand_int__}:day:tb' \
	1 0 100 60000000 100 0 0 5000 3600000000 5000 0 0 50000 86400000000 50000 0 |
	tr '\r' '\n' | tail -n 1 | sed 's/.*: \([0-9.]* requests per second.*\)/\1/'

fi
# It prints its own header, when CASES selects any of its cases.
gateway/testdata/wrk/run.sh

if want analytics; then
echo "== analytics: trend queries over 10M events (seeds ClickHouse, ~1 min)"
go test -run '^$' -bench TrendQueries -benchtime 10x ./analytics/
echo "== analytics: what-if replay of 10M stored decisions (seeds ClickHouse, ~1 min)"
go test -run '^$' -bench WhatIf -benchtime 1x ./analytics/
fi

want go || exit 0
for pkg in gateway consumer; do
	if ls "$pkg"/*_test.go >/dev/null 2>&1; then
		echo "== $pkg (go test -bench . -benchtime $BENCHTIME ./$pkg/...)"
		go test -run '^$' -bench . -benchtime "$BENCHTIME" "./$pkg/..."
	fi
done
