// Package envoyrls serves Envoy's global rate limit API
// (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit) on the
// gateway's one enforcement step, configured by envoyproxy/ratelimit's own
// YAML files, so Envoy, Istio, Contour, Emissary or Gloo can switch to
// edgelimit without touching their proxy configuration.
//
// It is a thin door: a request's descriptors become the rules of one
// gateway.Call, decided by gateway.Enforce with the same store deadline,
// circuit breaker, failure policies, deny cache, directives, decision
// event and metrics as proxied traffic and POST /v1/check (split directives
// aside: a descriptor's bucket is checked by every request that carries
// it, so a split of one request's caller would fork it; see
// limiter.Directives.Split). It lives in a
// package of its own so gRPC and Envoy's API types stay out of the HTTP
// gateway.
//
// # Mapping
//
// Each request descriptor is matched like ratelimit's GetLimit: per level
// "key_value", else the first wildcard ("value*") whose prefix matches,
// else "key" (any value); the limit of the node the last entry reaches
// applies. A limited descriptor becomes a limiter rule named by its
// place in the configuration ("<domain>.<key>_<value>.<key2>", bounded by
// the configuration, so safe as a metric label; a configured value that
// may be a credential, see below, is "-" and its place in its list, as in
// "<domain>.api_key_-2", so a customer's own API key given a limit of its
// own is never in a header, metric or event) and bucketed by a hash of
// the domain and the request's entries, values included (every value of
// an any-value or wildcard descriptor counts apart, as in ratelimit). All
// buckets of a domain live under one limiter key, "rls:<domain>", so all
// descriptors of one request are decided in one atomic Redis call.
//
// # Where the semantics differ from envoyproxy/ratelimit
//
//   - Algorithm. ratelimit counts fixed windows aligned to the clock (a
//     minute limit resets at :00). Here requests_per_unit per unit is a
//     token bucket by default: it refills continuously at that rate, with
//     a burst of requests_per_unit (grpc.burst_factor scales it). A client
//     can never get 2× the limit across a window edge, and the remaining
//     count rises gradually instead of resetting at once.
//     grpc.algorithm: sliding_window gives epoch-aligned windows weighted
//     across the edge, the closest to ratelimit's counting.
//   - duration_until_reset is the time until the bucket is full again
//     (token bucket) rather than until the window ends.
//   - All-or-nothing. ratelimit increments every descriptor's counter,
//     also when the request is denied, and also the counters that were
//     not over. Here a denied request consumes nothing: a request over one
//     descriptor's limit does not burn the others' budgets, and a client
//     retrying while denied does not push its own reset further out.
//     Statuses of the descriptors that would have admitted it say OK with
//     their unchanged remaining count.
//   - Time is Redis's (TIME inside the script), never a gateway's clock.
//   - One caller's descriptors are one Redis key: a descriptor whose one
//     unbounded value names the caller keeps its bucket in the caller's
//     container, tagged by that value (see placement; docs/envoy.md), and
//     a domain spreads over the Redis Cluster by its callers; a request
//     whose descriptors land in several
//     slots is decided across them (limiter.Redis.Allow): each slot's part
//     atomically, all at once, and a denial gives back what the others
//     charged before the answer. On one Redis server every request is one
//     call whatever its slots.
//   - hits_addend: a descriptor's own is what its limit is charged (as
//     ratelimit does; limiter.Rule.Cost), the request's is charged to the
//     others and is the decision event's cost. 0 counts as 1; a value
//     above 2^53 counts as 2^53, over every limit. Different costs are
//     still decided in the one atomic call, all-or-nothing: a descriptor
//     whose cost does not fit denies the request and none is charged. Two
//     descriptors of one bucket are one rule, charged once, at the higher
//     of their costs.
//   - is_negative_hits (newer ratelimit) gives back what the descriptor's
//     hits_addend (else the request's, 0 counting as 1) names, exactly: a
//     token bucket up to its capacity, a sliding window's current count
//     down to 0, never more; its status is OK, with the remaining count
//     after it. Two give-backs of one bucket give back once, the larger;
//     a request that charges a bucket and gives back to it is charged the
//     difference. All-or-nothing holds: in a request that another
//     descriptor's limit refuses, nothing is given back (ratelimit's
//     descriptors count apart, so it gives back there); send refunds in
//     a request of their own (Envoy's apply_on_stream_done actions do). A
//     descriptor whose limit is 0 has nothing to give back and answers
//     OK.
//   - Limits over requests_per_unit (burst) are "cost exceeds capacity":
//     OVER_LIMIT without a store call, no Retry-After.
//   - requests_per_unit: 0 (ratelimit's block list, README example 3)
//     answers OVER_LIMIT without a store call and without a decision event.
//   - Request limit overrides (RateLimitDescriptor.limit) are honoured as
//     ratelimit does (grpc.limit_overrides: honor), or ignored (the
//     configured limit applies) or refused with INVALID_ARGUMENT. An
//     override of the configured limit's own numbers shares its bucket;
//     one of another limit counts in a bucket of that limit (the entries
//     and the limit), whether or not the request holds the entries under
//     their configured limit too, so each limit is one bucket and both
//     hold. An override
//     of 0 blocks, as a configured 0 does, and so does one that cannot be
//     counted as sent (unit UNKNOWN or none of ratelimit's, a period over
//     400 days), where ratelimit answers an error Envoy lets through.
//   - Store failure. ratelimit answers a gRPC error and leaves it to
//     Envoy's failure_mode_deny. Here the rules' failure policy decides
//     (grpc.failure_policy, default the gateway's): open answers OK,
//     closed answers OVER_LIMIT with Retry-After (so Envoy refuses even
//     with failure_mode_deny false), local enforces this gateway's share.
//     A descriptor recently denied by Redis stays denied (deny cache).
//   - quota_mode (newer ratelimit) reports OK over the limit like
//     shadow_mode; the violation is in the decision event (mode shadow), not
//     in dynamic metadata. share_threshold is honoured: every value a
//     share_threshold wildcard matches counts in one bucket.
//   - detailed_metric and value_to_metric are accepted and change nothing: metric labels never
//     hold request values; the decision events (and ClickHouse) answer
//     per-value questions. Events name the domain (route "envoy:<domain>",
//     plan "<domain>", and the domain field) and carry a keyed hash of all
//     of the request's entries as key id; remote_address, when present,
//     is the event's client IP. The event's descriptor field carries the
//     checked descriptors' entries, in request order, each distinct pair
//     once, at most 16 (more, or a key over 64 bytes, are left out and
//     counted in edgelimit_gateway_grpc_event_descriptor_entries_dropped_total).
//     A value that may be a credential is carried as "hmac:<hex>", keyed
//     like key ids, never as sent: its key holds auth, token, key, secret,
//     passw, pwd, cookie, session, credential, signature, jwt, bearer,
//     private or otp (Envoy's own generic_key, header_match, query_match,
//     source_cluster, destination_cluster, remote_address and
//     masked_remote_address excepted), or the value starts "Bearer " or
//     "Basic ", or is over 128 bytes, or holds a URL's password
//     (user:pass@host) or a parameter named with one of those words
//     (a path's "?access_token=…", ";jsessionid=…").
//   - A file ratelimit refuses is refused, with its message and the
//     file's name (its own test configurations are checked by
//     TestRatelimitTestConfigs). MERGE_DOMAIN_CONFIG is not supported: a
//     domain in two files is refused.
//   - response_headers_to_add carries the gateway's headers
//     (X-RateLimit-Limit/Remaining/Reset of the binding descriptor,
//     RateLimit-Policy, RateLimit, Retry-After when over), lower-cased,
//     always unless grpc.response_headers is false; ratelimit adds its
//     x-ratelimit-* only when RESPONSE_HEADERS_ENABLED. Over the limit,
//     raw_body is the HTTP door's application/problem+json body naming the
//     violated descriptors (grpc.problem_body), which Envoy sends as the
//     429's body; ratelimit sends none.
//   - More than 16 distinct limited descriptors (one limiter call's
//     rules) are decided exactly, in limiter calls of 16 in order, each
//     all-or-nothing; when a later one refuses, what the earlier ones
//     charged is given back before the answer, so no limit ever admits
//     more than it allows and a refused request keeps nothing. The price
//     is a round trip per 16 descriptors, and a concurrent request may be
//     refused by units held for the moment between a charge and its
//     give-back (under a sliding window, a give-back that comes after
//     the window turned takes from the new window). The refused request's
//     descriptors of later calls, never checked, say OK without a
//     remaining count.
//   - Nothing Envoy sends passes uncounted. A request the service cannot
//     decide as sent (over 64 descriptors, a descriptor over 32 entries, a
//     message over grpc.max_message_bytes, rules the limiter refuses) is
//     answered OVER_LIMIT, counted in grpc_ratelimit_requests_total
//     {code="over_limit"} and in decisions_total and a decision event
//     (denied, no binding rule), with a problem raw_body saying why and no
//     Retry-After (waiting does not help); ratelimit answers an error,
//     which Envoy's default failure_mode_deny: false lets through.
//     grpc.undecidable: error answers the error instead (INVALID_ARGUMENT,
//     RESOURCE_EXHAUSTED or INTERNAL). A message over
//     grpc.max_receive_bytes (default 16 MiB) is not read at all and gets
//     RESOURCE_EXHAUSTED from the transport. A request without a domain
//     or without a descriptor, which Envoy never sends, is
//     INVALID_ARGUMENT.
//   - A descriptor value that is not UTF-8 (header bytes 0x80-0xFF, which
//     Envoy forwards as they came) is read as Latin-1 and counted like any
//     other; ratelimit's gRPC server refuses the whole request, which
//     Envoy's default failure_mode_deny: false then lets through.
package envoyrls
