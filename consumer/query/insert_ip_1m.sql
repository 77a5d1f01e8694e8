-- The batch's rows of the IP rollup (NAT detection).
INSERT INTO decisions_by_ip_1m (minute, client_ip, batch_id, requests, denied_requests, distinct_keys, distinct_user_agents)
SELECT
    toStartOfMinute(time) AS minute,
    client_ip,
    batch_id,
    countState() AS requests,
    sumState(toUInt64(allowed = 0)) AS denied_requests,
    uniqState(key_id) AS distinct_keys,
    uniqState(user_agent_hash) AS distinct_user_agents
FROM {stage}
WHERE (SELECT count() FROM decisions_aborts WHERE batch_id = ?) = 0
GROUP BY minute, client_ip, batch_id
