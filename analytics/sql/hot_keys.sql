-- hot_keys: the keys with at least @min_requests allowed decisions in
-- [@from, @to), at most @limit of them (busiest first), with their
-- decisions and denials per gateway: the hot-key detector's input. A key is
-- judged on what it was allowed, so denied traffic cannot make it hot.
-- name is the key's name ('' when it has none; see top_keys).
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
    toInt64(sum(requests)) AS requests,
    toInt64(sum(denied_requests)) AS denied
FROM decisions_by_key_1m
WHERE minute >= @from AND minute < @to
  AND {committed}
  AND (key_id, key_kind) GLOBAL IN (
    SELECT key_id, key_kind
    FROM decisions_by_key_1m
    WHERE minute >= @from AND minute < @to
      AND {committed}
      AND NOT startsWith(route, 'envoy:')
    GROUP BY key_id, key_kind
    HAVING sum(allowed_requests) >= @min_requests
    ORDER BY sum(allowed_requests) DESC, key_id
    LIMIT @limit
  )
GROUP BY key_id, key_kind, gateway_id
ORDER BY key_id, key_kind, gateway_id
