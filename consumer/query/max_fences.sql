SELECT kafka_partition, max(fence)
FROM decisions_claims
WHERE kafka_topic = ?
GROUP BY kafka_partition
