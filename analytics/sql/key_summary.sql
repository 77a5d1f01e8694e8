-- key_summary: one key's decisions in [@from, @to) by rule, route, gateway,
-- plan and method, for its page. @key is a key id or a key name (one name
-- can match several ids: the same API key under another kind, or before a
-- rotated hash secret). At most @limit rows: the combinations are bounded
-- by the configuration, the limit by the caller.
SELECT
    key_id,
    key_kind,
    key_name,
    binding_rule,
    route,
    gateway_id,
    plan,
    method,
    toInt64(sum(requests)) AS total,
    toInt64(sum(denied_requests)) AS denied,
    toInt64(sum(fail_closed)) AS failed_closed,
    toInt64(sum(fail_open)) AS failed_open,
    toInt64(sum(shadow)) AS shadowed,
    toInt64(sum(total_cost)) AS cost,
    toInt64(sum(allowed_cost)) AS cost_allowed
FROM decisions_by_key_1m
WHERE minute >= @from AND minute < @to
  AND {committed}
  AND (key_id = @key OR key_name = @key)
GROUP BY key_id, key_kind, key_name, binding_rule, route, gateway_id, plan, method
ORDER BY total DESC, key_id, key_kind, key_name, binding_rule, route, gateway_id, plan, method
LIMIT @limit
