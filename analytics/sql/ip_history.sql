-- ip_history: one address's (or IPv6 /64's) decisions, distinct keys and
-- distinct user agents per @bucket in [@from, @to): a NAT IP's history.
SELECT
    multiIf(@bucket = 'day', toStartOfDay(minute), @bucket = 'hour', toStartOfHour(minute), minute) AS bucket,
    toInt64(countMerge(requests)) AS requests,
    toInt64(sumMerge(denied_requests)) AS denied,
    toInt64(uniqMerge(distinct_keys)) AS keys,
    toInt64(uniqMerge(distinct_user_agents)) AS user_agents
FROM decisions_by_ip_1m
WHERE minute >= @from AND minute < @to
  AND {committed}
  AND {client_net} = @ip
GROUP BY bucket
ORDER BY bucket
