-- whatif_decisions: the raw decisions of the keys in [@lo, @hi) (a chunk
-- of whatif_chunks) in [@from, @to), optionally of one plan, grouped by
-- key and in time order within each key, for a what-if replay (see
-- whatif.go). The key range uses the table's primary key, so a chunk reads
-- only its own keys' granules. Sorting by the key's hash first (then the
-- key, for the rare collision) groups each key as well as the key itself
-- would, and compares numbers instead of strings for most rows.
--
-- A row is as few and as small columns as the replay needs, since it
-- reads millions: the plan and the route as their 1-based places in the
-- proposal's @plans and @routes (0: not named there), the key kind as the
-- event's enum number, the binding rule only where the request was denied,
-- times as Unix milliseconds, and flags for the route filter (@route) and
-- the store's verdict. The route is not filtered here: a key's requests on
-- every route spend its buckets, so the replay reads them all and the
-- route filter only chooses what is counted. event_id breaks ties within a
-- millisecond in the order the gateways made them. Decisions from
-- @warm_from on, before @from, are read to warm the buckets (in_range 0):
-- replayed, not counted.
SELECT
    key_id,
    toUInt8(transform(key_kind, ['api_key', 'user', 'ip'], [1, 2, 3], 0)) AS kind,
    toUInt32(indexOf(@plans, plan)) AS plan_index,
    toUInt32(indexOf(@routes, route)) AS route_index,
    toUInt8(@route = '' OR route = @route) AS counted,
    if(allowed = 0, binding_rule, '') AS denied_by,
    toInt64(time) * 1000 + time_ms AS at_ms,
    cost,
    allowed,
    toUInt8(store_status IN ('ok', 'local_cache')) AS by_store,
    toUInt8(time >= @from) AS in_range
FROM decisions
WHERE key_id >= @lo AND key_id < @hi
  AND {committed}
  AND time >= @warm_from AND time < @to
  AND mode != 'admin'
  AND (@plan = '' OR plan = @plan)
ORDER BY cityHash64(key_id), key_id, at_ms, event_id
