-- total_requests: all decisions in [@from, @to), fleet-wide, from the
-- per-gateway rollup (the smallest table holding every decision).
SELECT toInt64(countMerge(requests)) AS requests
FROM decisions_by_gateway_1m
WHERE minute >= @from AND minute < @to
  AND {committed}
