-- trends: decisions and rejections per @bucket (minute, hour or day) in
-- [@from, @to), split by @by (rule, route, plan, gateway, key, or '' for
-- none), after the optional filters (an empty filter matches all).
-- multiIf on a bound constant picks the bucket and the dimension, so one
-- query serves every grouping without building SQL.
SELECT
    multiIf(@bucket = 'day', toStartOfDay(minute), @bucket = 'hour', toStartOfHour(minute), minute) AS bucket,
    multiIf(@by = 'rule', binding_rule, @by = 'route', route, @by = 'plan', plan,
            @by = 'gateway', gateway_id, @by = 'key', key_id, '') AS dim,
    toInt64(sum(requests)) AS requests,
    toInt64(sum(denied_requests)) AS denied,
    toInt64(sum(shadow)) AS shadow,
    toInt64(sum(fail_open)) AS fail_open,
    toInt64(sum(fail_closed)) AS fail_closed
FROM decisions_by_key_1m
WHERE minute >= @from AND minute < @to
  AND (@rule = '' OR binding_rule = @rule)
  AND (@route = '' OR route = @route)
  AND (@plan = '' OR plan = @plan)
  AND (@gateway = '' OR gateway_id = @gateway)
  AND (@key = '' OR key_id = @key)
GROUP BY bucket, dim
ORDER BY bucket, dim
