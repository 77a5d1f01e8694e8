-- Per-minute rollups, filled by materialized views in the same INSERT as the
-- raw rows. store_unavailable counts store_status unavailable or timeout.
-- No alias in a view may repeat a raw column name (allowed, cost, ...): the
-- SQL dialect substitutes aliases everywhere, so "sum(cost) AS cost" would
-- feed into every other use of cost.

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

CREATE MATERIALIZED VIEW IF NOT EXISTS decisions_by_key_1m_mv TO decisions_by_key_1m AS
SELECT
    toStartOfMinute(time) AS minute,
    key_id,
    key_kind,
    binding_rule,
    route,
    plan,
    gateway_id,
    count() AS requests,
    sum(toUInt64(allowed)) AS allowed_requests,
    sum(toUInt64(allowed = 0)) AS denied_requests,
    sum(cost) AS total_cost,
    sum(if(allowed = 1, cost, toInt64(0))) AS allowed_cost,
    sum(toUInt64(mode = 'fail_open')) AS fail_open,
    sum(toUInt64(mode = 'fail_closed')) AS fail_closed,
    sum(toUInt64(store_status IN ('unavailable', 'timeout'))) AS store_unavailable,
    sum(toUInt64(mode = 'shadow')) AS shadow,
    sum(toUInt64(mode = 'local_fallback')) AS local_fallback
FROM decisions
GROUP BY minute, key_id, key_kind, binding_rule, route, plan, gateway_id;

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

CREATE MATERIALIZED VIEW IF NOT EXISTS decisions_by_ip_1m_mv TO decisions_by_ip_1m AS
SELECT
    toStartOfMinute(time) AS minute,
    client_ip,
    countState() AS requests,
    sumState(toUInt64(allowed = 0)) AS denied_requests,
    uniqState(key_id) AS distinct_keys,
    uniqState(user_agent_hash) AS distinct_user_agents
FROM decisions
GROUP BY minute, client_ip;

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

CREATE MATERIALIZED VIEW IF NOT EXISTS decisions_by_gateway_1m_mv TO decisions_by_gateway_1m AS
SELECT
    toStartOfMinute(time) AS minute,
    gateway_id,
    countState() AS requests,
    sumState(toUInt64(allowed = 0)) AS denied_requests,
    sumState(toUInt64(store_status = 'ok')) AS store_ok,
    sumState(toUInt64(store_status = 'unavailable')) AS store_unavailable,
    sumState(toUInt64(store_status = 'timeout')) AS store_timeout,
    sumState(toUInt64(store_status = 'local_cache')) AS store_local_cache,
    sumState(toUInt64(mode = 'fail_open')) AS fail_open,
    sumState(toUInt64(mode = 'fail_closed')) AS fail_closed,
    sumState(toUInt64(mode = 'local_fallback')) AS local_fallback,
    quantilesState(0.5, 0.9, 0.99)(check_latency_us) AS check_latency_us_q,
    maxState(check_latency_us) AS check_latency_us_max
FROM decisions
GROUP BY minute, gateway_id;
