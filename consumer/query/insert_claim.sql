INSERT INTO decisions_claims (kafka_topic, kafka_partition, fence, generation, member_id)
