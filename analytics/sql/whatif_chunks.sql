-- whatif_chunks: the keys of [@warm_from, @to) (optionally of one plan and
-- one key) with their decisions, in key order: what-if cuts the range into
-- chunks of whole keys from it (whatif.go), so that ClickHouse sorts one
-- chunk at a time, never the range (a sort of 10M rows exceeds a server's
-- memory limit). Streamed, never held: the reader keeps only boundaries.
SELECT
    key_id,
    toInt64(count()) AS decisions
FROM decisions
WHERE time >= @warm_from AND time < @to
  AND {committed}
  AND (mode != 'admin' OR admin_action = 'grant')
  AND mode != 'settlement'
  AND (@plan = '' OR plan = @plan)
  AND (@key = '' OR key_id = @key)
GROUP BY key_id
ORDER BY key_id
