-- hot_keys_recent: the decisions and denials per gateway since @recent (to
-- the second) of the keys that had at least @min_requests allowed in the
-- rollup's [@from, @to),
-- at most @limit of them. The one query that reads the raw table: the
-- rollups have minutes, and a key that turns hot must be found in seconds.
-- It stays cheap because the raw table is ordered by (key_id, time): only
-- the few candidates' last seconds are read. name as in hot_keys.
-- Callers of the Envoy door (route 'envoy:<domain>') are left out: their
-- descriptors' buckets are shared by every request that carries them, so
-- gateways never apply a split to them (limiter.Directives.Split).
-- GLOBAL IN: on a Distributed table the subquery runs once, on the
-- initiator, not once per shard against the whole cluster ("double
-- distributed", which servers deny by default); on one server it is IN.
SELECT
    key_id,
    key_kind,
    gateway_id,
    max(key_name) AS name,
    toInt64(count()) AS requests,
    toInt64(countIf(allowed = 0)) AS denied
FROM decisions
WHERE key_id GLOBAL IN (
    SELECT key_id
    FROM decisions_by_key_1m
    WHERE minute >= @from AND minute < @to
      AND {committed}
      AND NOT startsWith(route, 'envoy:')
    GROUP BY key_id
    HAVING sum(allowed_requests) >= @min_requests
    ORDER BY sum(allowed_requests) DESC, key_id
    LIMIT @limit
  )
  AND time >= @recent AND time < @to
  AND {committed}
  AND mode NOT IN ('admin', 'settlement')
GROUP BY key_id, key_kind, gateway_id
ORDER BY key_id, key_kind, gateway_id
