-- The batch's rows of the IP rollup (NAT detection).
-- auth_keys counts '' once for the anonymous rows, and allowed_user_agents
-- 0 once for the denied ones: at most one over, which the thresholds absorb.
INSERT INTO decisions_by_ip_1m (minute, client_ip, batch_id, requests, denied_requests, distinct_keys, distinct_user_agents,
    auth_keys, allowed_user_agents)
SELECT
    toStartOfMinute(time) AS minute,
    client_ip,
    batch_id,
    countState() AS requests,
    sumState(toUInt64(allowed = 0)) AS denied_requests,
    uniqState(key_id) AS distinct_keys,
    uniqState(user_agent_hash) AS distinct_user_agents,
    uniqState(if(key_kind IN ('api_key', 'user'), key_id, '')) AS auth_keys,
    uniqState(if(allowed = 1, user_agent_hash, toUInt64(0))) AS allowed_user_agents
FROM {stage}
-- mode admin: an operator's audit record (a reset), not a request; mode
-- accounting: a gateway's accounting record.
WHERE mode NOT IN ('admin', 'accounting', 'settlement')
  AND (SELECT count() FROM decisions_aborts WHERE batch_id = ?) = 0
GROUP BY minute, client_ip, batch_id
