#!/usr/bin/env bash
# bench.sh: the benchmarks behind `make bench` (run inside testenv.sh, so the
# real servers are up). Prints Go benchmark lines and, beside the limiter's,
# the ceiling: pipelines of 16 running EVALSHA of the same script with the
# same 3 rules on the same Redis (BenchmarkCeiling); then the gateway's cases
# of issue 11 beside an old revision and the peer
# (gateway/testdata/wrk/run.sh: BASE, ROUNDS, DURATION), then the analytics
# and the other Go benchmarks. Not part of make test. CASES=a,b,... runs a
# subset: limiter, ceiling, analytics, go, and run.sh's (check memory proxy
# body events openloop hot denied peer), and grpc (gateway/testdata/wrk/grpc.sh:
# Envoy's rate limit API beside envoyproxy/ratelimit); the default is all.
set -euo pipefail
cd "$(dirname "$0")/../.."
# 2s, not 5s: the whole of make bench in about 15 minutes on a busy 2-core machine.
BENCHTIME=${BENCHTIME:-2s}
export CASES=${CASES:-all}
want() { [ "$CASES" = all ] || [[ ",$CASES," == *",$1,"* ]]; }
trap 'echo "== make bench took $((SECONDS / 60)) min $((SECONDS % 60)) s"' EXIT

if want limiter; then
echo "== limiter: Allow, 64 callers, 3 rules/key (go test -bench BenchmarkAllow -benchtime $BENCHTIME ./limiter/)"
go test -run '^$' -bench BenchmarkAllow -benchtime "$BENCHTIME" ./limiter/
fi
if want ceiling; then

echo "== ceiling: allow.lua by EVALSHA, pipelines of 16 on 64 connections, 3 rules, 100k random keys (go test -bench BenchmarkCeiling ./limiter/)"
# Same rules as BenchmarkAllow: 100/min, 5000/h, 50000/day token buckets,
# with KEYS and ARGV as the limiter sends them. The rules travel packed in
# one binary argument, which redis-benchmark cannot send (it cuts arguments
# at NUL bytes). Beside it two floors (a script that returns at once; one
# that only reads TIME, GETs and SETs the key): what any script costs
# Redis here. Each reports Redis' CPU per check and memory per identity.
go test -run '^$' -bench BenchmarkCeiling -benchtime "${CEILING_N:-200000}x" ./limiter/

fi
# It prints its own header, when CASES selects any of its cases.
gateway/testdata/wrk/run.sh

if want grpc; then
gateway/testdata/wrk/grpc.sh
fi

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
