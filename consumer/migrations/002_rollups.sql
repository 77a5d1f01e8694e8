-- Per-minute rollups. store_unavailable counts store_status unavailable or
-- timeout.
--
-- This file once also created a materialized view per rollup, filling it in
-- the same INSERT as the raw rows. Migration 003 drops those views (DROP
-- TABLE IF EXISTS: the consumer writes every rollup itself since), so they
-- are gone from here: a new database never makes them only to drop them,
-- and one migrated by the old text ends the same (TestSchemaGolden checks
-- both against the schema these migrations made before).

-- By key, rule, route, plan and gateway: plain counters summed on merge.
-- Query with sum(...) and GROUP BY: rows are merged in the background, so a
-- minute may still have several rows.
CREATE TABLE IF NOT EXISTS decisions_by_key_1m (
    minute            DateTime,
    key_id            String,
    key_kind          String,
    binding_rule      String,
    route             String,
    plan              String,
    gateway_id        String,
    requests          UInt64,
    allowed_requests  UInt64,
    denied_requests   UInt64,
    total_cost        Int64,
    allowed_cost      Int64,
    fail_open         UInt64,
    fail_closed       UInt64,
    store_unavailable UInt64,
    shadow            UInt64,
    local_fallback    UInt64
) ENGINE = SummingMergeTree
PARTITION BY toYYYYMMDD(minute)
ORDER BY (minute, key_id, key_kind, binding_rule, route, plan, gateway_id);

-- By client IP: how many distinct keys and user agents one address carries
-- (NAT detection). Aggregate states: read with countMerge, sumMerge and
-- uniqMerge.
CREATE TABLE IF NOT EXISTS decisions_by_ip_1m (
    minute               DateTime,
    client_ip            String,
    requests             AggregateFunction(count),
    denied_requests      AggregateFunction(sum, UInt64),
    distinct_keys        AggregateFunction(uniq, String),
    distinct_user_agents AggregateFunction(uniq, UInt64)
) ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMMDD(minute)
ORDER BY (minute, client_ip);

-- By gateway: store health and check latency. Aggregate states: read with
-- countMerge, sumMerge, maxMerge and quantilesMerge(0.5, 0.9, 0.99).
CREATE TABLE IF NOT EXISTS decisions_by_gateway_1m (
    minute                 DateTime,
    gateway_id             String,
    requests               AggregateFunction(count),
    denied_requests        AggregateFunction(sum, UInt64),
    store_ok               AggregateFunction(sum, UInt64),
    store_unavailable      AggregateFunction(sum, UInt64),
    store_timeout          AggregateFunction(sum, UInt64),
    store_local_cache      AggregateFunction(sum, UInt64),
    fail_open              AggregateFunction(sum, UInt64),
    fail_closed            AggregateFunction(sum, UInt64),
    local_fallback         AggregateFunction(sum, UInt64),
    check_latency_us_q     AggregateFunction(quantiles(0.5, 0.9, 0.99), UInt32),
    check_latency_us_max   AggregateFunction(max, UInt32)
) ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMMDD(minute)
ORDER BY (minute, gateway_id);

