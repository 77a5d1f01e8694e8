-- The consumer's own staging table: a batch is sent once, into memory, and
-- the raw table and every rollup are filled from it by INSERT…SELECT.
CREATE TABLE IF NOT EXISTS {stage} AS decisions ENGINE = Memory
