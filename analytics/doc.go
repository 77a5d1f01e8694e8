// Package analytics reads the decision rollups in ClickHouse and acts on
// them: it flags hot keys and NAT-shared IPs and turns them into directives
// for the gateways (written through limiter.DirectiveStore), evaluates
// fleet-wide store-unavailable and fail-open spikes into alerts for
// Alertmanager or a webhook, and answers analysts' rejection-trend queries.
//
// Thresholds and decisions are pure functions over plain rows (Detect*,
// Evaluate), so table tests cover them without a database; the queries are
// embedded .sql files with driver-bound parameters.
package analytics
