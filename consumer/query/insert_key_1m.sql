-- The batch's rows of the key rollup. No alias may repeat a raw column name
-- (the dialect substitutes aliases everywhere).
INSERT INTO decisions_by_key_1m (minute, key_id, key_kind, binding_rule, route, plan, gateway_id, batch_id,
    key_name, method, requests, allowed_requests, denied_requests, total_cost, allowed_cost, fail_open, fail_closed,
    store_unavailable, shadow, local_fallback)
SELECT
    toStartOfMinute(time) AS minute,
    key_id,
    key_kind,
    binding_rule,
    route,
    plan,
    gateway_id,
    batch_id,
    key_name,
    method,
    sum(toUInt64(mode != 'settlement')) AS requests,
    sum(toUInt64(allowed = 1 AND mode != 'settlement')) AS allowed_requests,
    sum(toUInt64(allowed = 0)) AS denied_requests,
    sum(cost) AS total_cost,
    sum(if(allowed = 1, cost, toInt64(0))) AS allowed_cost,
    sum(toUInt64(mode = 'fail_open')) AS fail_open,
    sum(toUInt64(mode = 'fail_closed')) AS fail_closed,
    sum(toUInt64(store_status IN ('unavailable', 'timeout'))) AS store_unavailable,
    sum(toUInt64(mode = 'shadow')) AS shadow,
    sum(toUInt64(mode = 'local_fallback')) AS local_fallback
FROM {stage}
-- mode admin: an operator's audit record (a reset), not a request; mode
-- accounting: a gateway's accounting record. A settlement (allowed, its
-- cost what the request used beyond its reservation) counts its cost, not
-- a request.
WHERE mode NOT IN ('admin', 'accounting')
  AND (SELECT count() FROM decisions_aborts WHERE batch_id = ?) = 0
GROUP BY minute, key_id, key_kind, binding_rule, route, plan, gateway_id, batch_id, key_name, method
