package consumer

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the consumer's Prometheus series. Labels are bounded: a
// reason or a stage, never a key, IP or partition.
type metrics struct {
	lag                prometheus.Gauge
	lagSeconds         prometheus.Gauge
	rowsInserted       prometheus.Counter
	batchSeconds       prometheus.Histogram
	batchRows          prometheus.Histogram
	deadLetters        *prometheus.CounterVec
	retries            *prometheus.CounterVec
	partitionsDropped  prometheus.Counter
	batchesAborted     prometheus.Counter
	fenced             prometheus.Counter
	offsetsDistrusted  *prometheus.CounterVec
	deadLetterFailures prometheus.Counter
	blockedPartitions  prometheus.Gauge
	timeClamped        prometheus.Counter
	recordsLost        prometheus.Counter
}

const ns = "edgelimit_consumer"

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		lag:          newGauge("lag", "Decision events in Kafka past the group's committed offsets."),
		lagSeconds:   newGauge("lag_seconds", "While records wait past the committed offsets: how old the newest stored record's Kafka timestamp is (0 when caught up)."),
		rowsInserted: newCounter("rows_inserted_total", "Rows ClickHouse accepted into the decisions table."),
		batchSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: ns, Name: "batch_duration_seconds",
			Help:    "Time to insert one batch into ClickHouse, successful attempts.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 14), // 5ms to 40s
		}),
		batchRows: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: ns, Name: "batch_rows",
			Help:    "Rows per inserted batch.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 10), // 1 to 262144
		}),
		deadLetters:        newCounterVec("dead_letters_total", "Records sent to the dead-letter topic, by reason: unknown_version, malformed.", "reason"),
		retries:            newCounterVec("retries_total", "Failed attempts that were retried, by stage: dead_letter, abort, stage, ledger, insert, commit, resume, schema (unreadable schema version), lag (the group's lag not measured).", "stage"),
		batchesAborted:     newCounter("batches_aborted_total", "Batches that may have been partly written (a failed attempt, or a previous owner's) whose rows were deleted to be written again."),
		fenced:             newCounter("partitions_fenced_total", "Partitions this consumer stopped writing because a newer owner claimed them."),
		offsetsDistrusted:  newCounterVec("offsets_distrusted_total", "Stored offsets not resumed from, by reason: topic_id (the topic was recreated), above_high_watermark.", "reason"),
		deadLetterFailures: newCounter("dead_letter_failures_total", "Failed attempts to produce a partition's dead letters (the partition waits; others go on)."),
		blockedPartitions:  newGauge("blocked_partitions", "Partitions waiting for their dead letters to be produced."),
		timeClamped:        newCounter("event_time_clamped_total", "Events whose time was too far from their Kafka timestamp (or, when that cannot be stored, the consumer's clock) and was replaced by it."),
		recordsLost:        newCounter("records_lost_total", "Records a partition no longer held when the consumer reached them (Kafka retention, an unclean leader election): decisions missing from ClickHouse."),
		partitionsDropped:  newCounter("partitions_dropped_total", "Day partitions dropped by retention (servers without TTL)."),
	}
	for _, r := range []string{ReasonUnknownVersion, ReasonMalformed} {
		m.deadLetters.WithLabelValues(r)
	}
	for _, s := range []string{stageInsert, stageAbort, stageStage, stageLedger, stageDeadLetter, stageCommit, stageResume, stageLag} {
		m.retries.WithLabelValues(s)
	}
	for _, r := range []string{distrustTopicID, distrustHighWatermark} {
		m.offsetsDistrusted.WithLabelValues(r)
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.lag, m.lagSeconds, m.rowsInserted, m.batchSeconds, m.batchRows,
		m.deadLetters, m.retries, m.partitionsDropped, m.batchesAborted, m.fenced, m.offsetsDistrusted,
		m.deadLetterFailures, m.blockedPartitions, m.timeClamped, m.recordsLost} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register consumer metrics: %w", err)
		}
	}
	return m, nil
}

// newCounter is a consumer counter (named under ns) without labels.
func newCounter(name, help string) prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: name, Help: help})
}

// newCounterVec is a consumer counter (named under ns) with labels.
func newCounterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: name, Help: help}, labels)
}

// newGauge is a consumer gauge (named under ns).
func newGauge(name, help string) prometheus.Gauge {
	return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: name, Help: help})
}
