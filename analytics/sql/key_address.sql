-- key_address: the client address behind IP-keyed key @key in [@from,
-- @to), so its page can show the NAT directive in force (NAT directives
-- are keyed by the address, decision events by its keyed hash). Any one
-- address will do: an IP key is one IPv4 address or one IPv6 /64, and
-- limiter.IPKey maps each of them to the same key. The raw table is
-- ordered by key_id: this reads the key's own granules only.
SELECT any(client_ip) AS ip
FROM decisions
WHERE key_id = @key AND key_kind = 'ip'
  AND {committed}
  AND time >= @from AND time < @to
