-- trends: decisions and rejections per @bucket (minute, hour or day) in
-- [@from, @to), split by @by (rule, route, plan, gateway, key, or '' for
-- none), after the optional filters (an empty filter matches all). With
-- @top > 0 only the @top series with the most rejections keep their name;
-- the rest are summed as '(other)', here rather than in Go, so a split by
-- key never ships every key's series. multiIf on bound constants picks the
-- bucket and the dimension: one query serves every grouping without
-- building SQL.
-- GLOBAL IN: on a Distributed table the subquery runs once, on the
-- initiator, not once per shard against the whole cluster ("double
-- distributed", which servers deny by default); on one server it is IN.
SELECT
    bucket,
    if(@top = 0 OR dim GLOBAL IN (
        SELECT multiIf(@by = 'rule', binding_rule, @by = 'route', route, @by = 'plan', plan,
                       @by = 'gateway', gateway_id, @by = 'key', key_id, '') AS top_dim
        FROM decisions_by_key_1m
        WHERE @top > 0
          AND minute >= @from AND minute < @to
          AND (@rule = '' OR binding_rule = @rule)
          AND (@route = '' OR route = @route)
          AND (@plan = '' OR plan = @plan)
          AND (@gateway = '' OR gateway_id = @gateway)
          AND (@key = '' OR key_id = @key)
        GROUP BY top_dim
        ORDER BY sum(denied_requests) DESC, sum(requests) DESC, top_dim
        LIMIT @top_limit
    ), dim, '(other)') AS series,
    toInt64(sum(b_requests)) AS requests,
    toInt64(sum(b_denied)) AS denied,
    toInt64(sum(b_shadow)) AS shadow,
    toInt64(sum(b_fail_open)) AS fail_open,
    toInt64(sum(b_fail_closed)) AS fail_closed
FROM (
    SELECT
        multiIf(@bucket = 'day', toStartOfDay(minute), @bucket = 'hour', toStartOfHour(minute), minute) AS bucket,
        multiIf(@by = 'rule', binding_rule, @by = 'route', route, @by = 'plan', plan,
                @by = 'gateway', gateway_id, @by = 'key', key_id, '') AS dim,
        sum(requests) AS b_requests,
        sum(denied_requests) AS b_denied,
        sum(shadow) AS b_shadow,
        sum(fail_open) AS b_fail_open,
        sum(fail_closed) AS b_fail_closed
    FROM decisions_by_key_1m
    WHERE minute >= @from AND minute < @to
      AND (@rule = '' OR binding_rule = @rule)
      AND (@route = '' OR route = @route)
      AND (@plan = '' OR plan = @plan)
      AND (@gateway = '' OR gateway_id = @gateway)
      AND (@key = '' OR key_id = @key)
    GROUP BY bucket, dim
)
GROUP BY bucket, series
ORDER BY bucket, series = '(other)', series
