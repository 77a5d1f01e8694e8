-- usage_accounting: what each gateway run's publisher did with the
-- decision events of [@from, @to), from its accounting records (running
-- totals since run_start, Unix ns). A run's totals at the period's start
-- are its last record before @from (0: it started in the period); at the
-- end, its first record at or after @to, else its last (settled: such a
-- record exists, or the last is the run's final one). Drops counted between
-- the bounding records and the period's edges are counted in: an upper
-- bound, never short. Runs with no record from @from on are not in the
-- period.
SELECT
    gateway_id,
    run_start,
    maxIf(decisions, time < @from) AS d0,
    maxIf(published, time < @from) AS p0,
    maxIf(dropped_buffer_full, time < @from) AS bf0,
    maxIf(dropped_broker_error, time < @from) AS be0,
    maxIf(dropped_encode_error, time < @from) AS ee0,
    maxIf(dropped_closed, time < @from) AS cl0,
    toUInt64(countIf(time >= @to)) AS after,
    if(after > 0, minIf(decisions, time >= @to), max(decisions)) AS d1,
    if(after > 0, minIf(published, time >= @to), max(published)) AS p1,
    if(after > 0, minIf(dropped_buffer_full, time >= @to), max(dropped_buffer_full)) AS bf1,
    if(after > 0, minIf(dropped_broker_error, time >= @to), max(dropped_broker_error)) AS be1,
    if(after > 0, minIf(dropped_encode_error, time >= @to), max(dropped_encode_error)) AS ee1,
    if(after > 0, minIf(dropped_closed, time >= @to), max(dropped_closed)) AS cl1,
    toUInt8(max(final)) AS ended,
    toUInt32(max(time)) AS last_report
FROM decisions_accounting
WHERE run_start < toInt64(toUInt32(@to)) * 1000000000
  AND {committed}
GROUP BY gateway_id, run_start
HAVING max(time) >= @from
ORDER BY gateway_id, run_start
