-- One partition's batches from a lower bound of its tail on (the committed
-- offset), read by the table's index: their state (0 intent only, 1
-- committed), topic id, offsets and event times.
SELECT batch_id, max(state), any(topic_id), min(first_offset), max(last_offset), min(min_time), max(max_time)
FROM decisions_ledger
WHERE kafka_topic = ? AND kafka_partition = ? AND last_offset >= ?
GROUP BY batch_id
