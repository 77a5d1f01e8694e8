-- key_history: one key's decisions and rejections per @bucket and gateway
-- in [@from, @to): a hot key's history.
SELECT
    multiIf(@bucket = 'day', toStartOfDay(minute), @bucket = 'hour', toStartOfHour(minute), minute) AS bucket,
    gateway_id,
    toInt64(sum(requests)) AS requests,
    toInt64(sum(denied_requests)) AS denied
FROM decisions_by_key_1m
WHERE minute >= @from AND minute < @to
  AND key_id = @key
GROUP BY bucket, gateway_id
ORDER BY bucket, gateway_id
