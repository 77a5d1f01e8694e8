-- usage_seq: per key and sequence, the numbered decisions of [@from, @to)
-- that are stored, and the lowest and highest number among them (Redis
-- numbers each identity's decisions 1, 2, ... in the call that makes
-- them; seq_epoch, Unix ns, is when a sequence began; 0 holds the
-- decisions no shared store numbered). With @all_keys = 0
-- only the keys whose id is in @keys (ids: the statement resolves names).
SELECT
    key_id,
    seq_epoch,
    toInt64(countMerge(decisions)) AS n,
    toInt64(minMerge(seq_lo)) AS lo,
    toInt64(maxMerge(seq_hi)) AS hi
FROM decisions_seq_1m
WHERE minute >= @from AND minute < @to
  AND {committed}
  AND (@all_keys = 1 OR has(@keys, key_id))
GROUP BY key_id, seq_epoch
ORDER BY key_id, seq_epoch
