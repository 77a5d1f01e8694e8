-- The batch's rows of the key-history rollup (ordered by key, for one
-- key's history).
INSERT INTO decisions_key_history_1m (key_id, minute, gateway_id, batch_id, requests, denied_requests)
SELECT
    key_id,
    toStartOfMinute(time) AS minute,
    gateway_id,
    batch_id,
    count() AS requests,
    sum(toUInt64(allowed = 0)) AS denied_requests
FROM {stage}
-- mode admin: an operator's audit record (a reset), not a request; mode
-- accounting: a gateway's accounting record.
WHERE mode NOT IN ('admin', 'accounting', 'settlement')
  AND (SELECT count() FROM decisions_aborts WHERE batch_id = ?) = 0
GROUP BY key_id, minute, gateway_id, batch_id
