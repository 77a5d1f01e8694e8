-- key_history: one key's decisions and rejections per @bucket and gateway
-- in [@from, @to): a hot key's history. Read from the rollup ordered by key
-- first, so only the key's own minutes are read, not every key's.
SELECT
    multiIf(@bucket = 'day', toStartOfDay(minute), @bucket = 'hour', toStartOfHour(minute), minute) AS bucket,
    gateway_id,
    toInt64(sum(requests)) AS requests,
    toInt64(sum(denied_requests)) AS denied
FROM decisions_key_history_1m
WHERE key_id = @key
  AND {committed}
  AND minute >= @from AND minute < @to
GROUP BY bucket, gateway_id
ORDER BY bucket, gateway_id
