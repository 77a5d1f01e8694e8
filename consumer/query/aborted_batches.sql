SELECT batch_id FROM decisions_aborts WHERE kafka_topic = ?
