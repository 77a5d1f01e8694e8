-- The batch's rows of the gateway rollup (store health, check latency).
INSERT INTO decisions_by_gateway_1m (minute, gateway_id, batch_id, requests, denied_requests, store_ok,
    store_unavailable, store_timeout, store_local_cache, fail_open, fail_closed, local_fallback,
    check_latency_us_q, check_latency_us_max)
SELECT
    toStartOfMinute(time) AS minute,
    gateway_id,
    batch_id,
    countState() AS requests,
    sumState(toUInt64(allowed = 0)) AS denied_requests,
    sumState(toUInt64(store_status = 'ok')) AS store_ok,
    sumState(toUInt64(store_status = 'unavailable')) AS store_unavailable,
    sumState(toUInt64(store_status = 'timeout')) AS store_timeout,
    sumState(toUInt64(store_status = 'local_cache')) AS store_local_cache,
    sumState(toUInt64(mode = 'fail_open')) AS fail_open,
    sumState(toUInt64(mode = 'fail_closed')) AS fail_closed,
    sumState(toUInt64(mode = 'local_fallback')) AS local_fallback,
    quantilesState(0.5, 0.9, 0.99)(check_latency_us) AS check_latency_us_q,
    maxState(check_latency_us) AS check_latency_us_max
FROM {stage}
-- mode admin: an operator's audit record (a reset), not a request; mode
-- accounting: a gateway's accounting record.
WHERE mode NOT IN ('admin', 'accounting', 'settlement')
  AND (SELECT count() FROM decisions_aborts WHERE batch_id = ?) = 0
GROUP BY minute, gateway_id, batch_id
