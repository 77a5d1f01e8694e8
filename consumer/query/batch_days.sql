-- The day partitions the raw rows of one batch fall in (as stage_days.sql
-- for a staging table), for RollUp.
SELECT toYYYYMMDD(time) AS day
FROM decisions
WHERE batch_id = ?
GROUP BY day
ORDER BY day
