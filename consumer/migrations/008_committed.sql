-- Committed reads. A batch's rows are visible in the raw table and the
-- rollups from its first INSERT on, before its commit row and while it is
-- being aborted; a reader must count only batches that committed. These
-- objects make that one rule of the schema: every reader of a table with
-- batch_id filters it by
--     batch_id GLOBAL NOT IN (SELECT batch_id FROM decisions_uncommitted)
-- (analytics/sql/part/committed.sql), and nothing else.
--
-- decisions_open holds, per batch, its ledger intent rows less its commit
-- rows, kept by a view on the ledger in the same INSERT as the ledger row
-- itself (a failure of either is a failed ledger write, which aborts the
-- batch). A committed batch sums to 0 and SummingMergeTree drops its row
-- on the next merge, so the table holds about the batches in flight (and
-- the few that were aborted before they committed) instead of the whole
-- ledger, and a reader's set stays small however long the ledger is kept.
-- Rows without a ledger intent (batch 0, written before 003, and
-- consumer.Backfill's) are not in it: they count.
CREATE TABLE IF NOT EXISTS decisions_open (
    batch_id UInt64,
    open     Int64
) ENGINE = SummingMergeTree
ORDER BY batch_id;

CREATE MATERIALIZED VIEW IF NOT EXISTS decisions_open_mv TO decisions_open
AS SELECT batch_id, if(state = 0, toInt64(1), toInt64(-1)) AS open
FROM decisions_ledger;

-- The batches whose rows must not be read: in flight (an intent, no commit
-- yet) or aborted (their rows are being, or were, deleted). Batches in
-- flight when this migration ran have no row in decisions_open: they are
-- the last ones a reader can see before they commit.
CREATE VIEW IF NOT EXISTS decisions_uncommitted AS
SELECT batch_id FROM decisions_open GROUP BY batch_id HAVING sum(open) > 0
UNION ALL
SELECT batch_id FROM decisions_aborts
