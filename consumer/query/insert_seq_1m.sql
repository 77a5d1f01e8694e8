-- The batch's decisions per key, sequence and minute; those no shared
-- store numbered (seq 0) under seq_epoch 0, counted apart.
INSERT INTO decisions_seq_1m (key_id, seq_epoch, minute, batch_id, decisions, seq_lo, seq_hi)
SELECT
    key_id,
    seq_epoch,
    toStartOfMinute(time) AS minute,
    batch_id,
    countState() AS decisions,
    minState(seq) AS seq_lo,
    maxState(seq) AS seq_hi
FROM {stage}
WHERE mode NOT IN ('admin', 'accounting', 'settlement')
  AND (SELECT count() FROM decisions_aborts WHERE batch_id = ?) = 0
GROUP BY key_id, seq_epoch, minute, batch_id
