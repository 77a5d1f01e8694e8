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
-- times as Unix microseconds, and flags for the route filter (@route) and
-- the store's verdict. The route is not filtered here: a key's requests on
-- every route spend its buckets, so the replay reads them all and the
-- route filter only chooses what is counted. Times are the store's clock
-- where it decided, the same for every gateway, so a key's decisions come
-- in the order the store made them; seq (the store's own numbering) breaks
-- ties within a microsecond, then event_id. Decisions from
-- @warm_from on, before @from, are read to warm the buckets (in_range 0):
-- replayed, not counted. The directive a gateway applied comes as it
-- applied it: nat_factor (0: none), and split, '' for none, else the
-- deciding gateway, a newline, and the shares as "gateway share" pairs
-- joined by tabs (gateway ids hold neither). The key's name (an API
-- key's configured id) comes as its 1-based place in @key_names, the keys
-- whose rules are overridden (0: not named there). An admin grant comes
-- as a row of its own (grant 1, cost 0): its rule as denied_by and the
-- window's allowance after it as grant_limit (see the gateway's
-- auditGrant); resets and clears do not, and are not replayed.
SELECT
    key_id,
    toUInt8(transform(key_kind, ['api_key', 'user', 'ip'], [1, 2, 3], 0)) AS kind,
    toUInt32(indexOf(@plans, plan)) AS plan_index,
    toUInt32(indexOf(@routes, route)) AS route_index,
    toUInt8(@route = '' OR route = @route) AS counted,
    toUInt32(indexOf(@key_names, key_name)) AS key_name_index,
    if(allowed = 0 OR mode = 'admin', binding_rule, '') AS denied_by,
    (toInt64(time) * 1000 + time_ms) * 1000 + time_us AS at_us,
    cost,
    allowed,
    toUInt8(store_status IN ('ok', 'local_cache')) AS by_store,
    toUInt8(time >= @from) AS in_range,
    nat_factor,
    if(empty(split_gateways), '', concat(gateway_id, '\n',
        arrayStringConcat(arrayMap((g, s) -> concat(g, ' ', toString(s)), split_gateways, split_shares), '\t'))) AS split,
    toUInt8(mode = 'admin') AS grant,
    if(mode = 'admin', rule_limit, 0) AS grant_limit
FROM decisions
WHERE key_id >= @lo AND key_id < @hi
  AND {committed}
  AND time >= @warm_from AND time < @to
  AND (mode != 'admin' OR admin_action = 'grant')
  AND mode != 'settlement'
  AND (@plan = '' OR plan = @plan)
ORDER BY cityHash64(key_id), key_id, at_us, seq, event_id
