package consumer

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgelimit/edgelimit/internal/testenv"
)

// TestUpgradeOlderConsumerStops is a rolling upgrade seen from a consumer
// that was not upgraded yet: it runs and stores events; a newer consumer
// migrates the schema past it (here: its migration recorded, as Migrate
// records it); at its next batch the older one stops with ErrSchemaNewer
// and writes nothing more, rather than write a schema it does not know.
// Started again it refuses at once, and its Migrate refuses too.
func TestUpgradeOlderConsumerStops(t *testing.T) {
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

		b, err := ch.PrepareBatch(ctx, qInsertMigration)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Append(SchemaVersion()+1, "999_from_a_newer_consumer.sql", time.Now()); err != nil {
			t.Fatal(err)
		}
		if err := b.Send(); err != nil {
			t.Fatal(err)
		}
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
