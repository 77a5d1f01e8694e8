-- Gateway accounting: every few seconds, and as it closes, a gateway's
-- publisher sends a record (mode 'accounting', event field 23) of its
-- running totals since it started: decision events given, published, and
-- dropped by reason. The consumer keeps them here, not in decisions (they
-- are not requests), so a usage statement can say how many events of a
-- period never reached the stream. The staging table copies the raw
-- table's shape, so the raw table carries the record's columns too (zero
-- on every decision).
ALTER TABLE decisions
    ADD COLUMN acct_run_start Int64,
    ADD COLUMN acct_decisions Int64,
    ADD COLUMN acct_published Int64,
    ADD COLUMN acct_dropped_buffer_full Int64,
    ADD COLUMN acct_dropped_broker_error Int64,
    ADD COLUMN acct_dropped_encode_error Int64,
    ADD COLUMN acct_dropped_closed Int64,
    ADD COLUMN acct_final UInt8;

-- One row per accounting record. (gateway_id, run_start) names one run of
-- a gateway; its totals only grow, so what a run dropped between two times
-- is the difference of two of its records, and a lost or repeated record
-- changes nothing. Kept as long as the rollups; tagged by batch like them.
CREATE TABLE IF NOT EXISTS decisions_accounting (
    time                 DateTime,
    gateway_id           String,
    run_start            Int64,
    decisions            Int64,
    published            Int64,
    dropped_buffer_full  Int64,
    dropped_broker_error Int64,
    dropped_encode_error Int64,
    dropped_closed       Int64,
    final                UInt8,
    batch_id             UInt64
) ENGINE = MergeTree
PARTITION BY toYYYYMMDD(time)
ORDER BY (gateway_id, run_start, time, batch_id)
