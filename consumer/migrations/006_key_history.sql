-- A key's history read by key. decisions_by_key_1m is ordered by minute
-- first (the hot-key and trend queries read a time range of every key), so
-- one key's history read the whole range of every key. This rollup holds
-- the same requests and denials per minute and gateway, ordered by key
-- first: one key's range is a granule or two per day partition. Tagged by
-- batch like the other rollups (the consumer writes it from each batch's
-- staging table; an abort deletes its rows).
CREATE TABLE IF NOT EXISTS decisions_key_history_1m (
    key_id          String,
    minute          DateTime,
    gateway_id      String,
    batch_id        UInt64,
    requests        UInt64,
    denied_requests UInt64
) ENGINE = SummingMergeTree
PARTITION BY toYYYYMMDD(minute)
ORDER BY (key_id, minute, gateway_id, batch_id);

-- Its history so far, once (only into an empty table: a rerun copies
-- nothing). The key rollup's rows keep their batch ids, so a batch aborted
-- later is deleted here too.
INSERT INTO decisions_key_history_1m (key_id, minute, gateway_id, batch_id, requests, denied_requests)
SELECT key_id, minute, gateway_id, batch_id, sum(requests), sum(denied_requests)
FROM decisions_by_key_1m
WHERE (SELECT count() FROM decisions_key_history_1m) = 0
GROUP BY key_id, minute, gateway_id, batch_id
