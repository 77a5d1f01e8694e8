-- top_keys: the keys with the most rejections in [@from, @to), after the
-- optional filters (@key matches a key id or a key name), with their name
-- (an API key's configured id; '' for users, IPs and rows stored before
-- key names), cost, the rules that denied them and where. max(key_name):
-- a key's rows all carry its one name, or '' from before names were kept.
SELECT
    key_id,
    key_kind,
    max(key_name) AS name,
    toInt64(sum(requests)) AS total,
    toInt64(sum(denied_requests)) AS denied,
    toInt64(sum(fail_closed)) AS failed_closed,
    toInt64(sum(total_cost)) AS cost,
    toInt64(sum(allowed_cost)) AS cost_allowed,
    arraySlice(arraySort(groupUniqArrayIf(binding_rule, denied_requests > 0)), 1, 5) AS rules,
    arraySlice(arraySort(groupUniqArray(plan)), 1, 5) AS plans,
    arraySlice(arraySort(groupUniqArray(route)), 1, 5) AS routes,
    toInt64(uniqExact(gateway_id)) AS gateways
FROM decisions_by_key_1m
WHERE minute >= @from AND minute < @to
  AND {committed}
  {key_filters}
GROUP BY key_id, key_kind
HAVING denied > 0
ORDER BY denied DESC, total DESC, key_id
LIMIT @limit
