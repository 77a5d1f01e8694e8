-- A Distributed table in front of one of the consumer's tables on every
-- shard of {cluster} (the servers' remote_servers), in database {local}.
-- Rows spread at random: a batch's rows are found by batch_id on each shard,
-- so nothing needs them together. The names are checked identifiers.
CREATE TABLE IF NOT EXISTS {table} AS {local}.{table}
ENGINE = Distributed({cluster}, {local}, {table}, rand())
