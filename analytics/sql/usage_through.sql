-- usage_through: the newest committed minute from @from on (0: none): a
-- statement is complete once a decision at or after its period's end is
-- stored.
SELECT toUInt32(max(minute)) FROM decisions_by_key_1m WHERE minute >= @from AND {committed}
