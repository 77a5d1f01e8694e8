-- usage_keys: the keys among @keys (ids or API keys' names) that have any
-- committed decision at all, whenever: a key that has none does not exist
-- as far as the statement can tell, rather than having used nothing.
SELECT DISTINCT key_id, key_name, key_kind
FROM decisions_by_key_1m
WHERE (has(@keys, key_id) OR has(@keys, key_name))
  AND {committed}
