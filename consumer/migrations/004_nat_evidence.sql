-- NAT evidence that is costly to forge: distinct authenticated keys (api_key
-- or user; an anonymous client's key is its address) and distinct user
-- agents of allowed requests only (a client's own denials are not evidence).
-- Rows rolled up before this migration have empty states here.
ALTER TABLE decisions_by_ip_1m ADD COLUMN auth_keys AggregateFunction(uniq, String);
ALTER TABLE decisions_by_ip_1m ADD COLUMN allowed_user_agents AggregateFunction(uniq, UInt64)
