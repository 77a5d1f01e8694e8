-- nat_ips: client addresses in [@from, @to) with at least @min_requests
-- allowed decisions and at least @min_keys distinct authenticated keys or
-- @min_user_agents distinct user agents on allowed requests: the NAT
-- detector's input, with its evidence. A client's own denials count for
-- nothing, and anonymous traffic adds no key (its key is the address).
-- Clients are grouped as the gateway keys them (part/client_net.sql): IPv6 by /64,
-- IPv4-mapped IPv6 as its IPv4 address.
SELECT
    {client_net} AS ip,
    toInt64(countMerge(requests)) AS total,
    toInt64(sumMerge(denied_requests)) AS denied,
    toInt64(uniqMerge(auth_keys)) AS keys,
    toInt64(uniqMerge(allowed_user_agents)) AS user_agents
FROM decisions_by_ip_1m
WHERE minute >= @from AND minute < @to
  AND {committed}
GROUP BY ip
HAVING total - denied >= @min_requests AND (keys >= @min_keys OR user_agents >= @min_user_agents)
ORDER BY keys DESC, user_agents DESC, ip
LIMIT @limit
