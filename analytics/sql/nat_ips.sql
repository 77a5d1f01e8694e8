-- nat_ips: client addresses in [@from, @to) with at least @min_requests
-- allowed decisions and at least @min_keys distinct authenticated keys or
-- @min_user_agents distinct user agents on allowed requests: the NAT
-- detector's input, with its evidence. A client's own denials count for
-- nothing, and anonymous traffic adds no key (its key is the address).
-- IPv6 clients are grouped by /64 (the address with its last 8 bytes
-- zeroed), as the gateway keys them.
SELECT
    if(position(client_ip, ':') > 0, cutIPv6(IPv6StringToNum(client_ip), 8, 0), client_ip) AS ip,
    toInt64(countMerge(requests)) AS total,
    toInt64(sumMerge(denied_requests)) AS denied,
    toInt64(uniqMerge(auth_keys)) AS keys,
    toInt64(uniqMerge(allowed_user_agents)) AS user_agents
FROM decisions_by_ip_1m
WHERE minute >= @from AND minute < @to
GROUP BY ip
HAVING total - denied >= @min_requests AND (keys >= @min_keys OR user_agents >= @min_user_agents)
ORDER BY keys DESC, user_agents DESC, ip
LIMIT @limit
