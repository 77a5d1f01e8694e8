-- committed: the rows of batches that committed, and only those (the
-- consumer's rule, migration 008): spliced by mustSQL wherever a query says
-- {committed}, which every read of a consumer table carries in its WHERE
-- (TestQueriesReadCommittedOnly). A batch's rows are in the tables from its
-- first INSERT on, before its commit and while it is aborted. GLOBAL: on
-- Distributed tables the set is read once, on the initiator.
batch_id GLOBAL NOT IN (SELECT batch_id FROM decisions_uncommitted)
