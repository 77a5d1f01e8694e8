SELECT kafka_partition, maxMerge(max_offset)
FROM decisions_offsets
WHERE kafka_topic = ?
GROUP BY kafka_partition
