-- nat_ips: client addresses in [@from, @to) carrying at least @min_keys
-- distinct keys or @min_user_agents distinct user agents, and at least
-- @min_requests decisions: the NAT detector's input, with its evidence.
-- IPv6 clients are grouped by /64 (the address with its last 8 bytes
-- zeroed), as the gateway keys them.
SELECT
    if(position(client_ip, ':') > 0, cutIPv6(IPv6StringToNum(client_ip), 8, 0), client_ip) AS ip,
    toInt64(countMerge(requests)) AS requests,
    toInt64(sumMerge(denied_requests)) AS denied,
    toInt64(uniqMerge(distinct_keys)) AS keys,
    toInt64(uniqMerge(distinct_user_agents)) AS user_agents
FROM decisions_by_ip_1m
WHERE minute >= @from AND minute < @to
GROUP BY ip
HAVING requests >= @min_requests AND (keys >= @min_keys OR user_agents >= @min_user_agents)
ORDER BY keys DESC, user_agents DESC, ip
LIMIT @limit
