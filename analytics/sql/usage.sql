-- usage: what keys used in [@from, @to): their decisions, allowed and
-- denied, and the cost of each, per key (with @by_key), plan (@by_plan),
-- route (@by_route) and day in the IANA zone @tz (@by_day: days cut at the
-- zone's midnight, so 23 or 25 hours long across a DST change). With
-- @all_keys = 0 only the keys whose id or name is in @keys. The rollup
-- holds no admin audit records. without_store is the decisions no shared
-- store made (fail_open, local_fallback).
SELECT
    if(@by_key = 1, key_id, '') AS k_id,
    if(@by_key = 1, key_kind, '') AS k_kind,
    if(@by_key = 1, max(key_name), '') AS k_name,
    if(@by_plan = 1, plan, '') AS k_plan,
    if(@by_route = 1, route, '') AS k_route,
    if(@by_day = 1, toUInt32(toStartOfDay(minute, @tz)), toUInt32(0)) AS k_day,
    toInt64(sum(requests)) AS u_requests,
    toInt64(sum(allowed_requests)) AS u_allowed,
    toInt64(sum(denied_requests)) AS u_denied,
    toInt64(sum(allowed_cost)) AS u_allowed_cost,
    toInt64(sum(total_cost) - sum(allowed_cost)) AS u_denied_cost,
    toInt64(sum(fail_open) + sum(local_fallback)) AS u_without_store
FROM decisions_by_key_1m
WHERE minute >= @from AND minute < @to
  AND {committed}
  AND (@all_keys = 1 OR has(@keys, key_id) OR has(@keys, key_name))
GROUP BY k_id, k_kind, k_plan, k_route, k_day
ORDER BY k_id, k_plan, k_route, k_day
