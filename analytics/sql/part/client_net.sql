-- client_net: a decision's client as the gateway keys it (limiter.IPKey),
-- spliced by mustSQL wherever a query says {client_net}: an IPv4 address as
-- it is, an IPv6 address as its /64 (the last 8 bytes zeroed), and an
-- IPv4-mapped one (::ffff:192.0.2.1, which cutIPv6 keeps whole) as the
-- IPv4 address it is, so that its traffic and the same client's unmapped
-- traffic are one client, not two.
replaceRegexpOne(if(position(client_ip, ':') > 0, cutIPv6(IPv6StringToNum(client_ip), 8, 0), client_ip), '^::ffff:', '')
