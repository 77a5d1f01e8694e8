package consumer

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/edgelimit/edgelimit/internal/testenv"
)

// The crash helper is this test binary run again with crashEnv set: it
// consumes until its first batch is in ClickHouse, prints "inserted", and
// hangs before committing, until the test SIGKILLs it.
const crashEnv = "EDGELIMIT_CONSUMER_CRASH_HELPER"

func TestMain(m *testing.M) {
	if spec := os.Getenv(crashEnv); spec != "" {
		os.Exit(crashHelper(spec))
	}
	os.Exit(m.Run())
}

// crashHelper runs a consumer described by spec: brokers|topic|dlq|group|clickhouse addr|database.
func crashHelper(spec string) int {
	f := strings.Split(spec, "|")
	if len(f) != 6 {
		fmt.Fprintf(os.Stderr, "bad %s %q\n", crashEnv, spec)
		return 2
	}
	cfg := fastConfig(strings.Split(f[0], ","))
	cfg.Topic, cfg.DeadLetterTopic, cfg.Group = f[1], f[2], f[3]
	cfg.BatchSize = 1000
	ch, err := openHelperClickHouse(f[4], f[5])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	c, err := New(cfg, ch, nil, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	c.afterInsert = func() {
		fmt.Println("inserted")
		select {} // crash here: inserted, not committed
	}
	if err := c.Run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	return 1
}

// crashCmd is the crash helper for a consumer configured as cfg, writing
// to database db on the ClickHouse at addr; not yet started.
func crashCmd(t *testing.T, cfg Config, addr, db string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), crashEnv+"="+strings.Join(
		[]string{strings.Join(cfg.Brokers, ","), cfg.Topic, cfg.DeadLetterTopic, cfg.Group, addr, db}, "|"))
	cmd.Stderr = testWriter{t}
	return cmd
}

// TestCrashBetweenInsertAndCommit SIGKILLs a consumer after ClickHouse
// accepted a batch and before the offsets were committed, then runs a new
// one: every event is stored exactly once.
func TestCrashBetweenInsertAndCommit(t *testing.T) {
	t.Parallel()
	eachBackend(t, 2, func(t *testing.T, kb kafkaBackend, ch driver.Conn, db string) {
		const n = 5000
		produce(t, kb.brokers, kb.topic, decisions(n))
		cfg := kb.config()

		cmd := crashCmd(t, cfg, testenv.ClickHouseAddr(t), db)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		inserted := make(chan bool, 1)
		go func() {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				if sc.Text() == "inserted" {
					inserted <- true
					return
				}
			}
			inserted <- false
		}()
		select {
		case ok := <-inserted:
			if !ok {
				cmd.Process.Kill()
				cmd.Wait()
				t.Fatal("crash helper exited before inserting")
			}
		case <-time.After(60 * time.Second):
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatal("crash helper did not insert within 60s")
		}
		if err := cmd.Process.Kill(); err != nil { // SIGKILL
			t.Fatal(err)
		}
		cmd.Wait()

		// The batch was in the ledger when the consumer died: its staged
		// copy (a Memory table, in ClickHouse's RAM until the server
		// restarts, as a killed consumer never drops it) is empty by then.
		stages, err := stageTables(t, ch, db)
		if err != nil || len(stages) == 0 {
			t.Fatalf("staging tables after the crash: %v, %v; want the killed consumer's", stages, err)
		}
		for _, name := range stages {
			if n := count(t, ch, "SELECT count() FROM "+name); n != 0 {
				t.Errorf("staging table %s holds %d rows after the crash, want 0: the committed batch stays in ClickHouse's memory", name, n)
			}
		}

		before := count(t, ch, "SELECT count() FROM decisions")
		if before == 0 || before >= n {
			t.Fatalf("rows after the crash = %d, want some but not all of %d", before, n)
		}
		for p, o := range committed(t, kb.brokers, cfg.Group, cfg.Topic) {
			if o > 0 {
				t.Fatalf("partition %d committed offset %d before the crash; the test needs none", p, o)
			}
		}

		r := start(t, cfg, ch, nil)
		testenv.WaitFor(t, 60*time.Second, "all rows after the restart", func() bool {
			return count(t, ch, "SELECT count() FROM decisions") >= n
		})
		// The killed consumer's staging table is dropped once it has left
		// the group; the live one's stays.
		var left []string
		testenv.WaitFor(t, 60*time.Second, "the killed consumer's staging table dropped", func() bool {
			left, err = stageTables(t, ch, db)
			return err == nil && !slices.ContainsFunc(left, func(s string) bool { return slices.Contains(stages, s) })
		})
		r.c.mu.Lock()
		live := r.c.stage
		r.c.mu.Unlock()
		if !slices.Equal(left, []string{live}) {
			t.Errorf("staging tables with a live consumer = %v, want only its own %s", left, live)
		}
		r.stop()
		total := count(t, ch, "SELECT count() FROM decisions")
		uniq := count(t, ch, "SELECT uniqExact(event_id) FROM decisions")
		if total != n || uniq != n {
			t.Errorf("after crash and restart: count() = %d, uniqExact(event_id) = %d, want both %d (%d rows were in before the crash)", total, uniq, n, before)
		}
		if got := count(t, ch, "SELECT toUInt64(sum(requests)) FROM decisions_by_key_1m"); got != n {
			t.Errorf("rollup requests = %d, want %d", got, n)
		}
	})
}

// stageTables lists the staging tables in database db.
func stageTables(t *testing.T, ch driver.Conn, db string) ([]string, error) {
	var stages []string
	err := eachRow(t.Context(), ch, "list staging tables", fmt.Sprintf(
		"SELECT name FROM system.tables WHERE database = '%s' AND name LIKE 'decisions_stage_%%' ORDER BY name", db), nil,
		func(rows driver.Rows) error {
			var name string
			err := rows.Scan(&name)
			stages = append(stages, name)
			return err
		})
	return stages, err
}
