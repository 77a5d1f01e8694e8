-- hot_keys: the keys with at least @min_requests decisions in [@from, @to),
-- at most @limit of them (busiest first), with their decisions per gateway:
-- the hot-key detector's input.
SELECT
    key_id,
    key_kind,
    gateway_id,
    toInt64(sum(requests)) AS requests
FROM decisions_by_key_1m
WHERE minute >= @from AND minute < @to
  AND (key_id, key_kind) IN (
    SELECT key_id, key_kind
    FROM decisions_by_key_1m
    WHERE minute >= @from AND minute < @to
    GROUP BY key_id, key_kind
    HAVING sum(requests) >= @min_requests
    ORDER BY sum(requests) DESC, key_id
    LIMIT @limit
  )
GROUP BY key_id, key_kind, gateway_id
ORDER BY key_id, key_kind, gateway_id
