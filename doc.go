// Package edgelimit is an edge rate limiter: an echo gateway that checks
// every rule of a caller in one atomic Redis call, publishes each decision
// to Kafka, aggregates them in ClickHouse and feeds analytics back to the
// gateways. See README.md; this root package only holds repository-wide
// tests.
package edgelimit
