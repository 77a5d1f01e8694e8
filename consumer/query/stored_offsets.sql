SELECT kafka_offset
FROM decisions
WHERE time >= ? AND time <= ?
  AND kafka_topic = ? AND kafka_partition = ?
  AND kafka_offset >= ? AND kafka_offset <= ?
