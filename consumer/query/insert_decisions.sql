INSERT INTO decisions (
    event_id, time, time_ms, gateway_id, key_id, key_kind, client_ip,
    user_agent_hash, route, method, plan, binding_rule, allowed, rule_limit,
    remaining, cost, store_status, mode, check_latency_us, schema_version,
    kafka_topic, kafka_partition, kafka_offset
)
