-- The day partitions (PARTITION BY toYYYYMMDD of time, or of its minute in
-- the rollups: the same day) that the staged batch's rows fall in, in the
-- server's time zone as the tables compute them.
SELECT toYYYYMMDD(time) AS day
FROM {stage}
GROUP BY day
ORDER BY day
