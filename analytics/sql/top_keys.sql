-- top_keys: the keys with the most rejections in [@from, @to), after the
-- optional filters, with the rules that denied them and where.
SELECT
    key_id,
    key_kind,
    toInt64(sum(requests)) AS requests,
    toInt64(sum(denied_requests)) AS denied,
    arraySlice(arraySort(groupUniqArrayIf(binding_rule, denied_requests > 0)), 1, 5) AS rules,
    arraySlice(arraySort(groupUniqArray(plan)), 1, 5) AS plans,
    arraySlice(arraySort(groupUniqArray(route)), 1, 5) AS routes,
    toInt64(uniqExact(gateway_id)) AS gateways
FROM decisions_by_key_1m
WHERE minute >= @from AND minute < @to
  AND (@rule = '' OR binding_rule = @rule)
  AND (@route = '' OR route = @route)
  AND (@plan = '' OR plan = @plan)
  AND (@gateway = '' OR gateway_id = @gateway)
GROUP BY key_id, key_kind
HAVING denied > 0
ORDER BY denied DESC, requests DESC, key_id
LIMIT @limit
