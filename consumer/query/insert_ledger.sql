INSERT INTO decisions_ledger (batch_id, kafka_topic, topic_id, kafka_partition, first_offset, last_offset,
    generation, fence, state, row_count, min_time, max_time)
