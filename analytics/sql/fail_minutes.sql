-- fail_minutes: the minutes in [@from, @to) in which a gateway failed open
-- or closed, with how many decisions did and out of how many.
SELECT
    minute,
    gateway_id,
    toInt64(countMerge(requests)) AS requests,
    toInt64(sumMerge(fail_open)) AS fail_open,
    toInt64(sumMerge(fail_closed)) AS fail_closed,
    toInt64(sumMerge(store_unavailable)) + toInt64(sumMerge(store_timeout)) AS store_unavailable
FROM decisions_by_gateway_1m
WHERE minute >= @from AND minute < @to
  AND {committed}
  AND (@gateway = '' OR gateway_id = @gateway)
GROUP BY minute, gateway_id
HAVING fail_open > 0 OR fail_closed > 0
ORDER BY minute, gateway_id
