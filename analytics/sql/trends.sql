-- trends: decisions, rejections and cost per @bucket (minute, 5m, 15m,
-- hour or day, aligned in the IANA time zone @tz) in [@from, @to), split by
-- @by (rule, route, plan, gateway, key, kind, method, or '' for none), after
-- every filter at once (an empty filter matches all; @key matches a key id
-- or a key name). A split by key names a key by its key_name when it has
-- one. rate_limited is denials by a limit (429); fail_closed those of a
-- store failure (503): denied is their sum. With @top > 0 only the @top
-- series with the most rejections keep their name; the rest are summed as
-- '(other)', here rather than in Go, so a split by key never ships every
-- key's series. multiIf on bound constants picks the bucket and the
-- dimension: one query serves every grouping without building SQL; each
-- bucket is a UInt32 so the branches share one type whatever the zone.
-- multiIf computes every branch, so the rollup is first summed per minute
-- and the time-zone arithmetic runs on those sums, not on every row.
-- GLOBAL IN: on a Distributed table the subquery runs once, on the
-- initiator, not once per shard against the whole cluster ("double
-- distributed", which servers deny by default); on one server it is IN.
SELECT
    multiIf(@bucket = 'day', toUInt32(toStartOfDay(m, @tz)),
            @bucket = 'hour', toUInt32(toStartOfHour(m, @tz)),
            @bucket = '15m', toUInt32(toStartOfFifteenMinutes(m, @tz)),
            @bucket = '5m', toUInt32(toStartOfFiveMinute(m, @tz)),
            toUInt32(m)) AS bucket,
    if(@top = 0 OR dim GLOBAL IN (
        SELECT multiIf(@by = 'rule', binding_rule, @by = 'route', route, @by = 'plan', plan,
                       @by = 'gateway', gateway_id, @by = 'key', if(key_name = '', key_id, key_name),
                       @by = 'kind', key_kind, @by = 'method', method, '') AS top_dim
        FROM decisions_by_key_1m
        WHERE @top > 0
          AND {committed}
          AND minute >= @from AND minute < @to
          {key_filters}
        GROUP BY top_dim
        ORDER BY sum(denied_requests) DESC, sum(requests) DESC, top_dim
        LIMIT @top_limit
    ), dim, '(other)') AS series,
    toInt64(sum(b_requests)) AS requests,
    toInt64(sum(b_denied)) AS denied,
    toInt64(sum(b_denied) - sum(b_fail_closed)) AS rate_limited,
    toInt64(sum(b_fail_closed)) AS fail_closed,
    toInt64(sum(b_shadow)) AS shadow,
    toInt64(sum(b_fail_open)) AS fail_open,
    toInt64(sum(b_total_cost)) AS cost,
    toInt64(sum(b_allowed_cost)) AS cost_allowed
FROM (
    SELECT
        minute AS m,
        multiIf(@by = 'rule', binding_rule, @by = 'route', route, @by = 'plan', plan,
                @by = 'gateway', gateway_id, @by = 'key', if(key_name = '', key_id, key_name),
                @by = 'kind', key_kind, @by = 'method', method, '') AS dim,
        sum(requests) AS b_requests,
        sum(denied_requests) AS b_denied,
        sum(shadow) AS b_shadow,
        sum(fail_open) AS b_fail_open,
        sum(fail_closed) AS b_fail_closed,
        sum(total_cost) AS b_total_cost,
        sum(allowed_cost) AS b_allowed_cost
    FROM decisions_by_key_1m
    WHERE minute >= @from AND minute < @to
      AND {committed}
      {key_filters}
    GROUP BY m, dim
)
GROUP BY bucket, series
ORDER BY bucket, series = '(other)', series
