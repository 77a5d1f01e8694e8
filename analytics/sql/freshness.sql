-- freshness: the newest minute of data and the consumer's last committed
-- batch (its ledger), each looked for from @from on: both tables are
-- ordered or partitioned by these times, so this reads little.
SELECT
    (SELECT toUInt32(max(minute)) FROM decisions_by_gateway_1m WHERE minute >= @from AND {committed}) AS newest_minute,
    (SELECT toUInt32(max(written_at)) FROM decisions_ledger WHERE written_at >= @from AND state = 1 AND {committed}) AS last_commit
