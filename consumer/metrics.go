package consumer

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the consumer's Prometheus series. Labels are bounded: a
// reason or a stage, never a key, IP or partition.
type metrics struct {
	lag                 prometheus.Gauge
	lagSeconds          prometheus.Gauge
	rowsInserted        prometheus.Counter
	batchSeconds        prometheus.Histogram
	batchRows           prometheus.Histogram
	deadLetters         *prometheus.CounterVec
	retries             *prometheus.CounterVec
	partitionsDropped   prometheus.Counter
	batchesAborted      prometheus.Counter
	fenced              prometheus.Counter
	offsetsDistrusted   *prometheus.CounterVec
	deadLetterFailures  prometheus.Counter
	blockedPartitions   prometheus.Gauge
	timeClamped         prometheus.Counter
	recordsLost         prometheus.Counter
	duplicates          prometheus.Counter
	batchesShrunk       prometheus.Counter
	batchesDeadLettered prometheus.Counter
	batchLimit          prometheus.Gauge
}

const ns = "edgelimit_consumer"

// newMetrics makes the consumer's series and registers them with reg, each
// named under ns. A nil reg registers nothing.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		lag:          prometheus.NewGauge(prometheus.GaugeOpts{Name: "lag", Help: "Decision events in Kafka past the group's committed offsets."}),
		lagSeconds:   prometheus.NewGauge(prometheus.GaugeOpts{Name: "lag_seconds", Help: "While records wait past the committed offsets: how old the newest stored record's Kafka timestamp is (0 when caught up)."}),
		rowsInserted: prometheus.NewCounter(prometheus.CounterOpts{Name: "rows_inserted_total", Help: "Rows ClickHouse accepted into the decisions table."}),
		batchSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "batch_duration_seconds",
			Help:    "Time to insert one batch into ClickHouse, successful attempts.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 14), // 5ms to 40s
		}),
		batchRows: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "batch_rows",
			Help:    "Rows per inserted batch.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 10), // 1 to 262144
		}),
		deadLetters:         prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dead_letters_total", Help: "Records sent to the dead-letter topic, by reason: unknown_version, malformed, expired (older than the retention on arrival), insert_timeout (see batches_dead_lettered_total)."}, []string{"reason"}),
		retries:             prometheus.NewCounterVec(prometheus.CounterOpts{Name: "retries_total", Help: "Failed attempts that were retried, by stage: dead_letter, abort, stage, ledger, insert, commit, resume, schema (unreadable schema version), lag (the group's lag not measured)."}, []string{"stage"}),
		batchesAborted:      prometheus.NewCounter(prometheus.CounterOpts{Name: "batches_aborted_total", Help: "Batches that may have been partly written (a failed attempt, or a previous owner's) whose rows were deleted to be written again."}),
		fenced:              prometheus.NewCounter(prometheus.CounterOpts{Name: "partitions_fenced_total", Help: "Partitions this consumer stopped writing because a newer owner claimed them."}),
		offsetsDistrusted:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "offsets_distrusted_total", Help: "Stored offsets not resumed from, by reason: topic_id (the topic was recreated), above_high_watermark."}, []string{"reason"}),
		deadLetterFailures:  prometheus.NewCounter(prometheus.CounterOpts{Name: "dead_letter_failures_total", Help: "Failed attempts to produce a partition's dead letters (the partition waits; others go on)."}),
		blockedPartitions:   prometheus.NewGauge(prometheus.GaugeOpts{Name: "blocked_partitions", Help: "Partitions waiting for their dead letters to be produced."}),
		timeClamped:         prometheus.NewCounter(prometheus.CounterOpts{Name: "event_time_clamped_total", Help: "Events whose time was too far from their Kafka timestamp (or, when that cannot be stored, the consumer's clock) and was replaced by it."}),
		recordsLost:         prometheus.NewCounter(prometheus.CounterOpts{Name: "records_lost_total", Help: "Records a partition no longer held when the consumer reached them (Kafka retention, an unclean leader election): decisions missing from ClickHouse."}),
		duplicates:          prometheus.NewCounter(prometheus.CounterOpts{Name: "duplicates_total", Help: "Records of an event already stored (its id among the last 262,144 this consumer stored, or earlier in the same batch): not stored again."}),
		batchesShrunk:       prometheus.NewCounter(prometheus.CounterOpts{Name: "batches_shrunk_total", Help: "Times an insert timeout halved the rows per batch (see batch_limit_rows)."}),
		batchesDeadLettered: prometheus.NewCounter(prometheus.CounterOpts{Name: "batches_dead_lettered_total", Help: "Batches of one partition that outlived the insert timeout StuckAttempts (3) times in a row at the smallest batch size (once, for its next batches) while other batches were stored: their records went to the dead-letter topic (reason insert_timeout), not into ClickHouse."}),
		batchLimit:          prometheus.NewGauge(prometheus.GaugeOpts{Name: "batch_limit_rows", Help: "Most rows the next batch may insert: the batch size, or less while inserts of it time out."}),
		partitionsDropped:   prometheus.NewCounter(prometheus.CounterOpts{Name: "partitions_dropped_total", Help: "Day partitions dropped by retention (servers without TTL)."}),
	}
	for _, r := range []string{ReasonUnknownVersion, ReasonMalformed, ReasonExpired, ReasonInsertTimeout} {
		m.deadLetters.WithLabelValues(r)
	}
	for _, s := range []string{stageInsert, stageAbort, stageStage, stageLedger, stageDeadLetter, stageCommit, stageResume, stageSchema, stageLag} {
		m.retries.WithLabelValues(s)
	}
	for _, r := range []string{distrustTopicID, distrustHighWatermark} {
		m.offsetsDistrusted.WithLabelValues(r)
	}
	reg = prometheus.WrapRegistererWithPrefix(ns+"_", reg) // no-op when nil
	for _, c := range []prometheus.Collector{m.lag, m.lagSeconds, m.rowsInserted, m.batchSeconds, m.batchRows,
		m.deadLetters, m.retries, m.partitionsDropped, m.batchesAborted, m.fenced, m.offsetsDistrusted,
		m.deadLetterFailures, m.blockedPartitions, m.timeClamped, m.recordsLost, m.duplicates, m.batchesShrunk, m.batchesDeadLettered, m.batchLimit} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register consumer metrics: %w", err)
		}
	}
	return m, nil
}
