-- The batches a reader must not count (migration 008, which creates the
-- same view in each migrated database), created in a database of
-- Distributed tables, where it reads every shard's.
CREATE VIEW IF NOT EXISTS decisions_uncommitted AS
SELECT batch_id FROM decisions_open GROUP BY batch_id HAVING sum(open) > 0
UNION ALL
SELECT batch_id FROM decisions_aborts
