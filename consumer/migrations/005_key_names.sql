-- Key names: the configured id of an API key caller (event field key_name,
-- "acme"), so people read which customer a key is; the HMAC key_id stays
-- the key. Rows stored before this read as '' (String's default). The
-- staging table copies the raw table's shape, so it gains the column too.
ALTER TABLE decisions ADD COLUMN key_name String;

-- The key rollup gains key_name and method, both at the end of its sorting
-- key: SummingMergeTree keeps one value per key of a non-key column, so a
-- column that can differ within (minute, key, rule, ...) must be in the key
-- or merges would mix its values. Old rows read as '' for both (their
-- batches never merge with new ones: batch_id is in the key). 18.16 and
-- current servers add a new column to the end of the sorting key in the same
-- ALTER only, and only without a DEFAULT expression.
ALTER TABLE decisions_by_key_1m
    ADD COLUMN key_name String,
    ADD COLUMN method String,
    MODIFY ORDER BY (minute, key_id, key_kind, binding_rule, route, plan, gateway_id, batch_id, key_name, method)
