-- whatif_decisions: the raw decisions of the keys in [@lo, @hi) (a chunk
-- of whatif_chunks) in [@from, @to), optionally of one plan, grouped by
-- key and in time order within each key, for a what-if replay (see
-- whatif.go). The key range uses the table's primary key, so a chunk reads
-- only its own keys' granules. Sorting by the key's hash first (then the
-- key, for the rare collision) groups each key as well as the key itself
-- would, and compares numbers instead of strings for most rows. Times go
-- as Unix milliseconds (time + time_ms) and the store's verdict as one
-- flag, so a row scans as few columns as the replay needs. The route is
-- not filtered here: a key's requests on every route spend its buckets, so
-- the replay reads them all and the route filter only chooses what is
-- counted. event_id breaks ties within a millisecond in the order the
-- gateways made them.
SELECT
    key_id,
    key_kind,
    route,
    plan,
    binding_rule,
    toInt64(time) * 1000 + time_ms AS at_ms,
    cost,
    allowed,
    toUInt8(store_status IN ('ok', 'local_cache')) AS by_store
FROM decisions
WHERE key_id >= @lo AND key_id < @hi
  AND time >= @from AND time < @to
  AND (@plan = '' OR plan = @plan)
ORDER BY cityHash64(key_id), key_id, at_ms, event_id
