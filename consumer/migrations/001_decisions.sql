-- The raw decision events, one row per Kafka record, partitioned by day so
-- retention drops whole days. kafka_topic/partition/offset say where each row
-- came from: the consumer resumes after the highest offset stored and skips
-- rows already present when it retries, so a crash or a retry never counts
-- an event twice.
CREATE TABLE IF NOT EXISTS decisions (
    event_id         FixedString(16),
    time             DateTime,
    time_ms          UInt16,
    gateway_id       String,
    key_id           String,
    key_kind         String,
    client_ip        String,
    user_agent_hash  UInt64,
    route            String,
    method           String,
    plan             String,
    binding_rule     String,
    allowed          UInt8,
    rule_limit       Int64,
    remaining        Int64,
    cost             Int64,
    store_status     String,
    mode             String,
    check_latency_us UInt32,
    schema_version   UInt8,
    kafka_topic      String,
    kafka_partition  Int32,
    kafka_offset     Int64,
    inserted_at      DateTime DEFAULT now()
) ENGINE = MergeTree
PARTITION BY toYYYYMMDD(time)
ORDER BY (key_id, time);

-- The highest offset stored per topic partition, kept by a materialized view
-- in the same INSERT as the rows, so finding where to resume reads one small
-- row instead of scanning the raw table. Never expires.
CREATE TABLE IF NOT EXISTS decisions_offsets (
    kafka_topic     String,
    kafka_partition Int32,
    max_offset      AggregateFunction(max, Int64)
) ENGINE = AggregatingMergeTree
ORDER BY (kafka_topic, kafka_partition);

CREATE MATERIALIZED VIEW IF NOT EXISTS decisions_offsets_mv TO decisions_offsets AS
SELECT
    kafka_topic,
    kafka_partition,
    maxState(kafka_offset) AS max_offset
FROM decisions
GROUP BY kafka_topic, kafka_partition;
