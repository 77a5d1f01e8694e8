-- Decision sequences: Redis numbers each identity's decisions in the call
-- that makes them (event fields 24 and 25: seq, and the Unix ns its
-- sequence began, seq_epoch); 0 for decisions no shared store made.
ALTER TABLE decisions
    ADD COLUMN seq Int64,
    ADD COLUMN seq_epoch Int64;

-- Per key, sequence and minute: how many numbered decisions are stored and
-- the lowest and highest number among them (seq_epoch 0: the decisions no
-- shared store numbered, counted apart). A sequence's numbers run 1, 2,
-- ... without a hole, so hi - lo + 1 - count is how many of its decisions
-- in between are missing. Tagged by batch like the other rollups; ordered
-- by key first, as a statement reads it.
CREATE TABLE IF NOT EXISTS decisions_seq_1m (
    key_id    String,
    seq_epoch Int64,
    minute    DateTime,
    batch_id  UInt64,
    decisions AggregateFunction(count),
    seq_lo    AggregateFunction(min, Int64),
    seq_hi    AggregateFunction(max, Int64)
) ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMMDD(minute)
ORDER BY (key_id, seq_epoch, minute, batch_id)
