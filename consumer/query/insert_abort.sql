INSERT INTO decisions_aborts (batch_id, kafka_topic)
