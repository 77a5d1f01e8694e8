package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/edgelimit/edgelimit/gateway/publish"
	"github.com/edgelimit/edgelimit/internal/event"
	"github.com/edgelimit/edgelimit/internal/testenv"
)

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	b := []string{"k:9092"}
	const bad = "consumer: invalid config: "
	tests := []struct {
		name string
		give Config
		want string // the whole message, wrapping ErrInvalidConfig; "" for none
	}{
		{name: "defaults", give: Config{Brokers: b}},
		{name: "no brokers", give: Config{}, want: bad + "no brokers"},
		{name: "same topic", give: Config{Brokers: b, Topic: "x", DeadLetterTopic: "x"}, want: bad + `dead-letter topic must differ from the topic: "x"`},
		{name: "negative batch", give: Config{Brokers: b, BatchSize: -1}, want: bad + "batch size must be positive: -1"},
		{name: "negative wait", give: Config{Brokers: b, BatchWait: -time.Second}, want: bad + "negative duration: -1s"},
		{name: "retry range", give: Config{Brokers: b, RetryMin: time.Minute, RetryMax: time.Second}, want: bad + "retry min must not exceed retry max: 1m0s > 1s"},
		{name: "insert timeout", give: Config{Brokers: b, InsertTimeout: 2 * time.Minute}, want: bad + "insert timeout must be shorter than the rebalance timeout: 2m0s"},
		{name: "negative retention", give: Config{Brokers: b, Retention: Retention{RawDays: -1}}, want: bad + "negative retention: {RawDays:-1 RollupDays:0}"},
		// The message names the broker but never repeats it: it may carry a password.
		{name: "password in a broker", give: Config{Brokers: []string{"k:9092", "u:hunter2@k:9092"}}, want: bad + "broker 2 of 2 is not a host:port (credentials belong in their own settings, never in an address)"},
		{name: "broker url", give: Config{Brokers: []string{"kafka://k:9092"}}, want: bad + "broker 1 of 1 is not a host:port (credentials belong in their own settings, never in an address)"},
		{name: "negative dead-letter bound", give: Config{Brokers: b, DeadLetterMaxBytes: -1}, want: bad + "dead-letter max bytes must be positive: -1"},
		{name: "topic with a space", give: Config{Brokers: b, Topic: "my decisions"}, want: bad + `topic: event: not a Kafka topic name: "my decisions" (only a-z, A-Z, 0-9, '.', '_' and '-')`},
		{name: "dead-letter topic dot", give: Config{Brokers: b, DeadLetterTopic: ".."}, want: bad + `dead-letter topic: event: not a Kafka topic name: ".."`},
		{name: "negative clock skew", give: Config{Brokers: b, MaxClockSkew: -time.Hour}, want: bad + "negative duration: -1h0m0s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.give.Validate()
			if got := fmt.Sprint(err); tt.want == "" && err != nil || tt.want != "" && (got != tt.want || !errors.Is(err, ErrInvalidConfig)) {
				t.Errorf("Validate(%+v) = %v, want %q", tt.give, err, tt.want)
			}
		})
	}
}

func TestBackoff(t *testing.T) {
	t.Parallel()
	lo, hi := 100*time.Millisecond, 10*time.Second
	tests := []struct {
		attempt  int
		min, max time.Duration
	}{
		{0, 80 * time.Millisecond, 100 * time.Millisecond},
		{1, 160 * time.Millisecond, 200 * time.Millisecond},
		{5, 2560 * time.Millisecond, 3200 * time.Millisecond},
		{10, 8 * time.Second, 10 * time.Second},
		{100, 8 * time.Second, 10 * time.Second},
	}
	for _, tt := range tests {
		for range 50 {
			if got := backoff(lo, hi, tt.attempt); got < tt.min || got > tt.max {
				t.Fatalf("backoff(%v, %v, %d) = %v, want in [%v, %v]", lo, hi, tt.attempt, got, tt.min, tt.max)
			}
		}
	}
}

// TestExactlyOnceIntoClickHouse: N events on several partitions become
// exactly N rows, each partition's offsets all present once, and every
// rollup agrees with the raw table.
func TestExactlyOnceIntoClickHouse(t *testing.T) {
	t.Parallel()
	eachBackend(t, 4, func(t *testing.T, kb kafkaBackend, ch driver.Conn, _ string) {
		const n = 10_000
		produce(t, kb.brokers, kb.topic, decisions(n))
		r := start(t, kb.config(), ch, nil)
		testenv.WaitFor(t, 60*time.Second, "all rows in ClickHouse", func() bool {
			return count(t, ch, "SELECT count() FROM decisions") >= n
		})
		testenv.WaitFor(t, 10*time.Second, "rows_inserted metric", func() bool {
			return metric(t, r.reg, "edgelimit_consumer_rows_inserted_total") == n
		})
		r.stop()
		if got := count(t, ch, "SELECT count() FROM decisions"); got != n {
			t.Errorf("count() = %d, want %d", got, n)
		}
		if got := count(t, ch, "SELECT uniqExact(event_id) FROM decisions"); got != n {
			t.Errorf("uniqExact(event_id) = %d, want %d", got, n)
		}
		if got := count(t, ch, "SELECT uniqExact(kafka_partition, kafka_offset) FROM decisions WHERE kafka_topic = ?", kb.topic); got != n {
			t.Errorf("distinct (partition, offset) = %d, want %d", got, n)
		}
		if got := count(t, ch, "SELECT uniqExact(kafka_partition) FROM decisions"); got != 4 {
			t.Errorf("partitions with rows = %d, want 4", got)
		}
		checkRollups(t, ch)
		if got := metric(t, r.reg, "edgelimit_consumer_dead_letters_total"); got != 0 {
			t.Errorf("dead letters = %v, want 0", got)
		}
	})
}

// TestRebalance moves partitions between two consumers while events keep
// coming: a second consumer joins, then the first leaves. Nothing is lost
// and nothing is stored twice.
func TestRebalance(t *testing.T) {
	t.Parallel()
	eachBackend(t, 4, func(t *testing.T, kb kafkaBackend, ch driver.Conn, _ string) {
		cfg := kb.config()
		cfg.BatchSize = 300
		ds := decisions(8000)
		chunk := func(i int) { produce(t, kb.brokers, kb.topic, ds[i*1000:(i+1)*1000]) }
		rows := func() uint64 { return count(t, ch, "SELECT count() FROM decisions") }

		r1 := start(t, cfg, ch, nil)
		chunk(0)
		chunk(1)
		testenv.WaitFor(t, 60*time.Second, "the first consumer to store rows", func() bool { return rows() >= 1000 })
		r2 := start(t, cfg, ch, nil)
		for i := 2; i < 5; i++ {
			chunk(i)
			time.Sleep(200 * time.Millisecond) // spread the load over the rebalance
		}
		testenv.WaitFor(t, 60*time.Second, "the second consumer to store rows", func() bool {
			return metric(t, r2.reg, "edgelimit_consumer_rows_inserted_total") > 0
		})
		r1.stop()
		for i := 5; i < 8; i++ {
			chunk(i)
		}
		testenv.WaitFor(t, 90*time.Second, "all 8000 rows", func() bool { return rows() >= 8000 })
		r2.stop()

		total := count(t, ch, "SELECT count() FROM decisions")
		uniq := count(t, ch, "SELECT uniqExact(event_id) FROM decisions")
		if total != 8000 || uniq != 8000 {
			t.Errorf("count() = %d, uniqExact(event_id) = %d, want both 8000", total, uniq)
		}
		in1 := metric(t, r1.reg, "edgelimit_consumer_rows_inserted_total")
		in2 := metric(t, r2.reg, "edgelimit_consumer_rows_inserted_total")
		if in1+in2 != 8000 {
			t.Errorf("consumers inserted %v + %v rows, want 8000 in all", in1, in2)
		}
	})
}

// TestPublishToClickHouse runs the whole path: the gateway's Publisher,
// Kafka, this consumer, ClickHouse. Every published event is one row.
func TestPublishToClickHouse(t *testing.T) {
	t.Parallel()
	eachBackend(t, 3, func(t *testing.T, kb kafkaBackend, ch driver.Conn, _ string) {
		reg := prometheus.NewRegistry()
		p, err := publish.New(publish.Config{Brokers: kb.brokers, Topic: kb.topic}, reg, nil)
		if err != nil {
			t.Fatal(err)
		}
		r := start(t, kb.config(), ch, nil)
		const n = 5000
		for _, d := range decisions(n) {
			p.Publish(d)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := p.Close(ctx); err != nil {
			t.Fatalf("publisher Close: %v", err)
		}
		testenv.WaitFor(t, 60*time.Second, "every published event in ClickHouse", func() bool {
			return count(t, ch, "SELECT count() FROM decisions") >= n
		})
		r.stop()
		if got := count(t, ch, "SELECT uniqExact(event_id) FROM decisions"); got != n {
			t.Errorf("uniqExact(event_id) = %d, want %d", got, n)
		}
		if got := count(t, ch, "SELECT count() FROM decisions"); got != n {
			t.Errorf("count() = %d, want %d", got, n)
		}
		checkRollups(t, ch)
	})
}

// TestUpgradeOlderConsumerStops is a rolling upgrade seen from a consumer
// that was not upgraded yet: it runs and stores events; a newer consumer
// migrates the schema past it (here: its migration recorded, as Migrate
// records it); at its next batch the older one stops with ErrSchemaNewer
// and writes nothing more, rather than write a schema it does not know.
// Started again it refuses at once, and its Migrate refuses too.
func TestUpgradeOlderConsumerStops(t *testing.T) {
	t.Parallel()
	eachBackend(t, 2, func(t *testing.T, kb kafkaBackend, ch driver.Conn, _ string) {
		ctx := context.Background()
		ds := decisions(400)
		produce(t, kb.brokers, kb.topic, ds[:200])
		run := func() <-chan error {
			c, err := New(kb.config(), ch, prometheus.NewRegistry(), slog.New(slog.NewJSONHandler(testWriter{t}, nil)))
			if err != nil {
				t.Fatal(err)
			}
			// The test waits for Run to end on its own (ErrSchemaNewer);
			// testenv.Run stops and awaits it should it not.
			done := make(chan error, 1)
			testenv.Run(t, func(ctx context.Context) error {
				err := c.Run(ctx)
				done <- err
				return err
			})
			return done
		}
		done := run()
		waitRaw(t, ch, 200, 30*time.Second)

		insert(t, ch, qInsertMigration, SchemaVersion()+1, "999_from_a_newer_consumer.sql", time.Now())
		produce(t, kb.brokers, kb.topic, ds[200:])
		var runErr error
		testenv.WaitFor(t, 30*time.Second, "the older consumer to stop", func() bool {
			select {
			case runErr = <-done:
				return true
			default:
				return false
			}
		})
		if !errors.Is(runErr, ErrSchemaNewer) {
			t.Errorf("Run = %v, want ErrSchemaNewer", runErr)
		}
		t.Logf("older consumer stopped: %v", runErr)
		if got := count(t, ch, "SELECT count() FROM decisions"); got != 200 {
			t.Errorf("raw rows = %d after the migration, want the 200 stored before it (nothing written by the older consumer)", got)
		}
		if err := Migrate(ctx, ch, Retention{}); !errors.Is(err, ErrSchemaNewer) {
			t.Errorf("Migrate by the older consumer = %v, want ErrSchemaNewer", err)
		}
		select {
		case err := <-run():
			if !errors.Is(err, ErrSchemaNewer) {
				t.Errorf("older consumer restarted: Run = %v, want ErrSchemaNewer", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("older consumer restarted: Run did not refuse within 30s")
		}
	})
}

// checkRollups compares every rollup with the same aggregation over the raw
// table, group by group.
func checkRollups(t *testing.T, ch driver.Conn) {
	t.Helper()
	pairs := []struct {
		name, raw, rollup string
	}{
		{
			name: "by key",
			raw: `SELECT toString(toStartOfMinute(time)), key_id, key_kind, binding_rule, route, plan, gateway_id, key_name, method,
				toString(count()), toString(countIf(allowed = 1)), toString(countIf(allowed = 0)), toString(sum(cost)),
				toString(sumIf(cost, allowed = 1)), toString(countIf(mode = 'fail_open')), toString(countIf(mode = 'fail_closed')),
				toString(countIf(store_status IN ('unavailable', 'timeout'))), toString(countIf(mode = 'shadow')),
				toString(countIf(mode = 'local_fallback'))
				FROM decisions GROUP BY toStartOfMinute(time), key_id, key_kind, binding_rule, route, plan, gateway_id, key_name, method`,
			rollup: `SELECT toString(minute), key_id, key_kind, binding_rule, route, plan, gateway_id, key_name, method,
				toString(sum(requests)), toString(sum(allowed_requests)), toString(sum(denied_requests)), toString(sum(total_cost)),
				toString(sum(allowed_cost)), toString(sum(fail_open)), toString(sum(fail_closed)),
				toString(sum(store_unavailable)), toString(sum(shadow)), toString(sum(local_fallback))
				FROM decisions_by_key_1m GROUP BY minute, key_id, key_kind, binding_rule, route, plan, gateway_id, key_name, method`,
		},
		{
			name: "by ip",
			// uniq is exact below 65536 distinct values, as here.
			raw: `SELECT toString(toStartOfMinute(time)), client_ip, toString(count()), toString(countIf(allowed = 0)),
				toString(uniqExact(key_id)), toString(uniqExact(user_agent_hash))
				FROM decisions GROUP BY toStartOfMinute(time), client_ip`,
			rollup: `SELECT toString(minute), client_ip, toString(countMerge(requests)), toString(sumMerge(denied_requests)),
				toString(uniqMerge(distinct_keys)), toString(uniqMerge(distinct_user_agents))
				FROM decisions_by_ip_1m GROUP BY minute, client_ip`,
		},
		{
			name: "by gateway",
			raw: `SELECT toString(toStartOfMinute(time)), gateway_id, toString(count()), toString(countIf(allowed = 0)),
				toString(countIf(store_status = 'ok')), toString(countIf(store_status = 'unavailable')),
				toString(countIf(store_status = 'timeout')), toString(countIf(store_status = 'local_cache')),
				toString(countIf(mode = 'fail_open')), toString(countIf(mode = 'fail_closed')),
				toString(countIf(mode = 'local_fallback')), toString(max(check_latency_us))
				FROM decisions GROUP BY toStartOfMinute(time), gateway_id`,
			rollup: `SELECT toString(minute), gateway_id, toString(countMerge(requests)), toString(sumMerge(denied_requests)),
				toString(sumMerge(store_ok)), toString(sumMerge(store_unavailable)),
				toString(sumMerge(store_timeout)), toString(sumMerge(store_local_cache)),
				toString(sumMerge(fail_open)), toString(sumMerge(fail_closed)),
				toString(sumMerge(local_fallback)), toString(maxMerge(check_latency_us_max))
				FROM decisions_by_gateway_1m GROUP BY minute, gateway_id`,
		},
	}
	for _, p := range pairs {
		raw, rollup := rowSet(t, ch, p.raw), rowSet(t, ch, p.rollup)
		if len(raw) == 0 {
			t.Errorf("%s: raw aggregation is empty", p.name)
		}
		if diff := cmp.Diff(raw, rollup); diff != "" {
			t.Errorf("rollup %s disagrees with the raw table (-raw +rollup):\n%s", p.name, diff)
		}
	}
	// Latency quantiles: the rollup's merged states against the raw rows'.
	// Both sample, so compare loosely.
	var p50raw, p50roll float64
	if err := ch.QueryRow(context.Background(), "SELECT toFloat64(quantile(0.5)(check_latency_us)) FROM decisions").Scan(&p50raw); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueryRow(context.Background(), "SELECT toFloat64(quantilesMerge(0.5, 0.9, 0.99)(check_latency_us_q)[1]) FROM decisions_by_gateway_1m").Scan(&p50roll); err != nil {
		t.Fatal(err)
	}
	if p50roll < p50raw*0.8 || p50roll > p50raw*1.2 {
		t.Errorf("rollup p50 check latency = %v us, raw = %v us; want within 20%%", p50roll, p50raw)
	}
}

// rowSet runs a query whose columns are all strings and returns its rows
// joined, as a set.
func rowSet(t *testing.T, ch driver.Conn, q string) map[string]bool {
	t.Helper()
	rows, err := ch.Query(context.Background(), q)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	defer rows.Close()
	n := len(rows.ColumnTypes())
	set := map[string]bool{}
	for rows.Next() {
		vals := make([]string, n)
		ptrs := make([]any, n)
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		set[fmt.Sprint(vals)] = true
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return set
}

// TestDeadLetter: records that do not decode go to the dead-letter topic
// with their reason, and the good records around them are stored.
func TestDeadLetter(t *testing.T) {
	t.Parallel()
	eachBackend(t, 1, func(t *testing.T, kb kafkaBackend, ch driver.Conn, _ string) {
		good := decisions(300)
		produce(t, kb.brokers, kb.topic, good[:100])
		bad := record(t, good[0])
		bad.Value = []byte{0xff} // a truncated varint
		future := record(t, good[0])
		future.Headers[0].Value = []byte("3") // a future schema version
		v1 := record(t, good[0])
		v1.Headers, v1.Value = nil, append([]byte{1}, v1.Value...) // version 1: a version byte, no header
		empty := record(t, good[0])
		empty.Value = nil // decodes, but is no decision: no event id
		notUTF8 := record(t, good[0])
		notUTF8.Value = append(notUTF8.Value, 0x42, 2, 0xff, 'a') // a route that is not UTF-8, as proto3 strings must be
		produceRaw(t, kb.brokers, kb.topic, []*kgo.Record{bad, future, v1, empty, notUTF8})
		produce(t, kb.brokers, kb.topic, good[100:])

		r := start(t, kb.config(), ch, nil)
		testenv.WaitFor(t, 60*time.Second, "good rows in ClickHouse", func() bool {
			return count(t, ch, "SELECT count() FROM decisions") >= 300
		})
		dead := testenv.Consume(t, kb.brokers, kb.dlq, 5)
		want := []struct{ reason, offset string }{
			{ReasonMalformed, "100"}, {ReasonUnknownVersion, "101"}, {ReasonUnknownVersion, "102"}, {ReasonMalformed, "103"}, {ReasonMalformed, "104"},
		}
		for i, w := range want {
			h := headers(dead[i])
			if h[HeaderReason] != w.reason || h[HeaderSourceOffset] != w.offset || h[HeaderSourceTopic] != kb.topic || h[HeaderError] == "" {
				t.Errorf("dead letter %d headers = %v, want reason %s offset %s topic %s", i, h, w.reason, w.offset, kb.topic)
			}
		}
		if string(dead[0].Value) != "\xff" || string(dead[2].Value) != string(v1.Value) {
			t.Errorf("dead letter values = %q, %q; want the originals", dead[0].Value, dead[2].Value)
		}
		if h := headers(dead[1]); h[event.Header] != "3" {
			t.Errorf("dead letter 1 headers = %v, want the original %s: 3 kept", h, event.Header)
		}
		testenv.WaitFor(t, 5*time.Second, "dead-letter metric", func() bool {
			return metric(t, r.reg, "edgelimit_consumer_dead_letters_total", "reason", ReasonMalformed) == 3 &&
				metric(t, r.reg, "edgelimit_consumer_dead_letters_total", "reason", ReasonUnknownVersion) == 2
		})
		r.stop()
		if got := count(t, ch, "SELECT count() FROM decisions"); got != 300 {
			t.Errorf("count() = %d, want 300", got)
		}
		// The group's committed offset is past the poison records.
		if got := committed(t, kb.brokers, kb.config().Group, kb.topic)[0]; got != 305 {
			t.Errorf("committed offset = %d, want 305", got)
		}
	})
}

func headers(r *kgo.Record) map[string]string {
	h := map[string]string{}
	for _, x := range r.Headers {
		h[x.Key] = string(x.Value)
	}
	return h
}

// TestRetryStagesVisibleAtZero: every stage the retries counter is
// incremented with exists from the start, at 0. A series born at 1 is
// invisible to increase(), so the first failed attempt of a stage not
// pre-created never moved EdgelimitConsumerRetrying.
func TestRetryStagesVisibleAtZero(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	if _, err := newMetrics(reg); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, mf := range mfs {
		if mf.GetName() != "edgelimit_consumer_retries_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				seen[lp.GetValue()] = lp.GetName() == "stage"
			}
		}
	}
	for _, s := range []string{stageDeadLetter, stageAbort, stageStage, stageInsert, stageLedger, stageCommit,
		stageResume, stageSchema, stageLag} {
		if !seen[s] {
			t.Errorf("retries_total{stage=%q} not there before the first retry", s)
		}
	}
}
