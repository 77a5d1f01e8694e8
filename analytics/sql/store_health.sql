-- store_health: each gateway's decisions by store status and failure mode,
-- with check latency quantiles, per @bucket (minute, hour or day) in
-- [@from, @to). @bucket 'range' makes the whole range one bucket (at 0):
-- each gateway's totals, the fleet alerts' input (Reader.GatewayHealth).
SELECT
    multiIf(@bucket = 'day', toStartOfDay(minute), @bucket = 'hour', toStartOfHour(minute),
            @bucket = 'range', toDateTime(0), minute) AS bucket,
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
  AND {committed}
  AND (@gateway = '' OR gateway_id = @gateway)
GROUP BY bucket, gateway_id
ORDER BY bucket, gateway_id
