package consumer

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the consumer's Prometheus series. Labels are bounded: a
// reason or a stage, never a key, IP or partition.
type metrics struct {
	lag               prometheus.Gauge
	rowsInserted      prometheus.Counter
	batchSeconds      prometheus.Histogram
	batchRows         prometheus.Histogram
	deadLetters       *prometheus.CounterVec
	retries           *prometheus.CounterVec
	duplicates        prometheus.Counter
	partitionsDropped prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		lag: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "edgelimit_consumer_lag",
			Help: "Decision events in Kafka past the group's committed offsets.",
		}),
		rowsInserted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgelimit_consumer_rows_inserted_total",
			Help: "Rows ClickHouse accepted into the decisions table.",
		}),
		batchSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "edgelimit_consumer_batch_duration_seconds",
			Help:    "Time to insert one batch into ClickHouse, successful attempts.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 14), // 5ms to 40s
		}),
		batchRows: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "edgelimit_consumer_batch_rows",
			Help:    "Rows per inserted batch.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 10), // 1 to 262144
		}),
		deadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgelimit_consumer_dead_letters_total",
			Help: "Records sent to the dead-letter topic, by reason: unknown_version, malformed.",
		}, []string{"reason"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "edgelimit_consumer_retries_total",
			Help: "Failed attempts that were retried, by stage: insert, dedupe, dead_letter, commit, resume.",
		}, []string{"stage"}),
		duplicates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgelimit_consumer_duplicates_skipped_total",
			Help: "Rows not inserted because ClickHouse already held them (after an insert that failed late).",
		}),
		partitionsDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "edgelimit_consumer_partitions_dropped_total",
			Help: "Day partitions dropped by retention (servers without TTL).",
		}),
	}
	for _, r := range []string{ReasonUnknownVersion, ReasonMalformed} {
		m.deadLetters.WithLabelValues(r)
	}
	for _, s := range []string{stageInsert, stageDedupe, stageDeadLetter, stageCommit, stageResume} {
		m.retries.WithLabelValues(s)
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.lag, m.rowsInserted, m.batchSeconds, m.batchRows,
		m.deadLetters, m.retries, m.duplicates, m.partitionsDropped} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register consumer metrics: %w", err)
		}
	}
	return m, nil
}
