-- gateway_health: each gateway's decisions in [@from, @to) by store status
-- and failure mode, with check latency: the fleet alerts' input.
SELECT
    gateway_id,
    toInt64(countMerge(requests)) AS requests,
    toInt64(sumMerge(denied_requests)) AS denied,
    toInt64(sumMerge(store_ok)) AS store_ok,
    toInt64(sumMerge(store_unavailable)) AS store_unavailable,
    toInt64(sumMerge(store_timeout)) AS store_timeout,
    toInt64(sumMerge(store_local_cache)) AS store_local_cache,
    toInt64(sumMerge(fail_open)) AS fail_open,
    toInt64(sumMerge(fail_closed)) AS fail_closed,
    toInt64(sumMerge(local_fallback)) AS local_fallback,
    quantilesMerge(0.5, 0.9, 0.99)(check_latency_us_q) AS latency_q,
    toFloat64(maxMerge(check_latency_us_max)) AS latency_max
FROM decisions_by_gateway_1m
WHERE minute >= @from AND minute < @to
GROUP BY gateway_id
ORDER BY gateway_id
