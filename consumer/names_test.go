package consumer

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/google/go-cmp/cmp"

	"github.com/edgelimit/edgelimit/internal/event"
	"github.com/edgelimit/edgelimit/internal/testenv"
)

// TestKeyNamesStored: an event's key_name lands in the raw table and in the
// key rollup, which also splits by method; users and IPs have none.
func TestKeyNamesStored(t *testing.T) {
	t.Parallel()
	eachBackend(t, 2, func(t *testing.T, kb kafkaBackend, ch driver.Conn, _ string) {
		ds := decisions(300)
		for i := range ds {
			ds[i].Method = []string{"GET", "POST"}[i%2]
			if ds[i].KeyKind == event.KindAPIKey {
				ds[i].KeyName = "customer-" + ds[i].KeyID
			}
		}
		produce(t, kb.brokers, kb.topic, ds)
		r := start(t, kb.config(), ch, nil)
		testenv.WaitFor(t, 60*time.Second, "all rows in ClickHouse", func() bool {
			return count(t, ch, "SELECT count() FROM decisions") >= uint64(len(ds))
		})
		r.stop()
		want := map[[3]string]uint64{}
		for _, d := range ds {
			want[[3]string{d.KeyKind.String(), d.KeyName, d.Method}]++
		}
		for _, table := range []string{"decisions", "decisions_by_key_1m"} {
			n := "count()"
			if table != "decisions" {
				n = "sum(requests)"
			}
			got := map[[3]string]uint64{}
			rows, err := ch.Query(context.Background(),
				"SELECT key_kind, key_name, method, toUInt64("+n+") FROM "+table+" GROUP BY key_kind, key_name, method")
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				var k [3]string
				var c uint64
				if err := rows.Scan(&k[0], &k[1], &k[2], &c); err != nil {
					t.Fatal(err)
				}
				got[k] = c
			}
			rows.Close()
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("%s by (kind, name, method) (-want +got):\n%s", table, diff)
			}
		}
		if n := count(t, ch, "SELECT count() FROM decisions WHERE key_kind != 'api_key' AND key_name != ''"); n != 0 {
			t.Errorf("%d user or ip rows have a key name", n)
		}
	})
}

// TestKeyNamesMigration: rows stored before migration 005 read as an empty
// name and method, in the raw table and the key rollup, and the migration
// is safe to run again.
func TestKeyNamesMigration(t *testing.T) {
	t.Parallel()
	conn, _ := testenv.NewDatabase(t, testenv.ClickHouseAddr(t), "edgelimit_test")
	ctx := context.Background()
	migrateTo(t, conn, 4)
	// A row as the consumer of migration 004 wrote it, and its rollup.
	minute := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	insert(t, conn, "INSERT INTO decisions (event_id, time, gateway_id, key_id, key_kind, method, allowed, cost, batch_id)",
		"0123456789abcdef", minute, "gw-1", "old-key", "api_key", "GET", uint8(1), int64(1), uint64(5))
	if err := RollUp(ctx, conn, 5); err == nil {
		t.Fatal("RollUp with 005's rollup SQL before 005 = nil, want an error (the rollup lacks key_name)")
	}
	insert(t, conn, "INSERT INTO decisions_by_key_1m (minute, key_id, key_kind, gateway_id, batch_id, requests)",
		minute, "old-key", "api_key", "gw-1", uint64(5), uint64(1))
	for range 2 {
		if err := Migrate(ctx, conn, Retention{}); err != nil {
			t.Fatalf("Migrate over 004: %v", err)
		}
	}
	for _, q := range []string{
		"SELECT count() FROM decisions WHERE key_id = 'old-key' AND key_name = ''",
		"SELECT count() FROM decisions_by_key_1m WHERE key_id = 'old-key' AND key_name = '' AND method = ''",
	} {
		if n := count(t, conn, q); n != 1 {
			t.Errorf("%s = %d, want 1", q, n)
		}
	}
	// And the new rollup SQL reads the old raw row.
	if err := RollUp(ctx, conn, 5); err != nil {
		t.Fatalf("RollUp after 005: %v", err)
	}
	if n := count(t, conn, "SELECT sum(requests) FROM decisions_by_key_1m WHERE key_id = 'old-key' AND method = 'GET'"); n != 1 {
		t.Errorf("rolled-up old row by method GET = %d, want 1", n)
	}
}

// TestAdminRecordsNotCounted: a gateway admin API's audit records (mode
// admin, a key reset or cleared) are kept in the raw table with their
// action and actor, but are no requests: no rollup counts them.
func TestAdminRecordsNotCounted(t *testing.T) {
	t.Parallel()
	eachBackend(t, 2, func(t *testing.T, kb kafkaBackend, ch driver.Conn, _ string) {
		ds := decisions(200)
		admin := 0
		for i := range ds {
			if i%4 == 0 {
				ds[i].Mode, ds[i].Allowed, ds[i].Cost = event.ModeAdmin, true, 0
				ds[i].Admin = event.AdminAction{Action: "reset", Actor: "oncall"}
				admin++
			}
		}
		produce(t, kb.brokers, kb.topic, ds)
		r := start(t, kb.config(), ch, nil)
		testenv.WaitFor(t, 60*time.Second, "all rows in ClickHouse", func() bool {
			return count(t, ch, "SELECT count() FROM decisions") >= uint64(len(ds))
		})
		r.stop()
		if n := count(t, ch, "SELECT count() FROM decisions WHERE mode = 'admin' AND admin_action = 'reset' AND admin_actor = 'oncall'"); n != uint64(admin) {
			t.Errorf("raw table holds %d admin records of reset by oncall, want %d", n, admin)
		}
		if n := count(t, ch, "SELECT count() FROM decisions WHERE mode != 'admin' AND (admin_action != '' OR admin_actor != '')"); n != 0 {
			t.Errorf("raw table holds %d decisions with an admin action, want 0", n)
		}
		for table, sum := range map[string]string{"decisions_by_key_1m": "sum", "decisions_key_history_1m": "sum",
			"decisions_by_ip_1m": "countMerge", "decisions_by_gateway_1m": "countMerge"} {
			if n := count(t, ch, "SELECT toUInt64("+sum+"(requests)) FROM "+table); n != uint64(len(ds)-admin) {
				t.Errorf("%s counts %d requests, want %d (admin records are not requests)", table, n, len(ds)-admin)
			}
		}
	})
}

// TestSettlementsCountCostNotRequests: settlement records (mode
// settlement: what an admitted request on a token route used beyond its
// reservation) keep their reserved and settled tokens in the raw table;
// the key rollup adds their cost to the allowed cost, so a key's costs
// sum to what it used, and no rollup counts them as requests.
func TestSettlementsCountCostNotRequests(t *testing.T) {
	t.Parallel()
	eachBackend(t, 2, func(t *testing.T, kb kafkaBackend, ch driver.Conn, _ string) {
		ds := decisions(200)
		var settlements int64
		for i := range ds {
			if i%4 == 0 {
				// 3 reserved, i%7 used: some give back, some overdraw
				ds[i].Mode, ds[i].Allowed = event.ModeSettlement, true
				ds[i].Reserved, ds[i].Settled = 3, int64(i%7)
				ds[i].Cost = ds[i].Settled - ds[i].Reserved
				ds[i].Seq, ds[i].SeqEpoch = 0, time.Time{}
				settlements++
			}
		}
		want := int64(0)
		for _, d := range ds {
			if d.Allowed {
				want += d.Cost
			}
		}
		produce(t, kb.brokers, kb.topic, ds)
		r := start(t, kb.config(), ch, nil)
		testenv.WaitFor(t, 60*time.Second, "all rows in ClickHouse", func() bool {
			return count(t, ch, "SELECT count() FROM decisions") >= uint64(len(ds))
		})
		r.stop()
		if n := count(t, ch, "SELECT count() FROM decisions WHERE mode = 'settlement' AND reserved = 3 AND cost = settled - reserved"); n != uint64(settlements) {
			t.Errorf("raw table holds %d settlement records as produced, want %d", n, settlements)
		}
		if n := count(t, ch, "SELECT toUInt64(sum(allowed_cost)) FROM decisions_by_key_1m"); int64(n) != want {
			t.Errorf("the key rollup's allowed cost is %d, want %d (decisions' and settlements')", n, want)
		}
		for table, sum := range map[string]string{"decisions_by_key_1m": "sum", "decisions_key_history_1m": "sum",
			"decisions_by_ip_1m": "countMerge", "decisions_by_gateway_1m": "countMerge"} {
			if n := count(t, ch, "SELECT toUInt64("+sum+"(requests)) FROM "+table); n != uint64(int64(len(ds))-settlements) {
				t.Errorf("%s counts %d requests, want %d (settlements are not requests)", table, n, int64(len(ds))-settlements)
			}
		}
		if n := count(t, ch, "SELECT toUInt64(sum(allowed_requests)) FROM decisions_by_key_1m"); n == 0 {
			t.Error("the key rollup counts no allowed requests")
		}
	})
}

// TestAccountingRecordsKeptApart: a gateway's accounting records (mode
// accounting, its publisher's running totals) land in decisions_accounting
// with every total, once each, and in no table of decisions or requests.
func TestAccountingRecordsKeptApart(t *testing.T) {
	t.Parallel()
	eachBackend(t, 2, func(t *testing.T, kb kafkaBackend, ch driver.Conn, _ string) {
		ds := decisions(200)
		var want []event.Accounting
		start0 := time.Date(2026, 11, 30, 23, 0, 0, 0, time.UTC)
		for i := range ds {
			if i%10 == 0 {
				a := event.Accounting{RunStart: start0, Decisions: int64(100 + i), Published: int64(90 + i),
					DroppedBufferFull: int64(i), DroppedBrokerError: 3, DroppedEncodeError: 2, DroppedClosed: 1, Final: i == 190}
				ds[i] = event.Decision{ID: ds[i].ID, Time: ds[i].Time, GatewayID: "gw-acct", Mode: event.ModeAccounting, Accounting: a}
				want = append(want, a)
			}
		}
		produce(t, kb.brokers, kb.topic, ds)
		r := start(t, kb.config(), ch, nil)
		testenv.WaitFor(t, 60*time.Second, "all records in ClickHouse", func() bool {
			return count(t, ch, "SELECT count() FROM decisions")+count(t, ch, "SELECT count() FROM decisions_accounting") >= uint64(len(ds))
		})
		r.stop()
		if n := count(t, ch, "SELECT count() FROM decisions"); n != uint64(len(ds)-len(want)) {
			t.Errorf("raw table holds %d rows, want the %d decisions only", n, len(ds)-len(want))
		}
		rows, err := ch.Query(context.Background(), `SELECT run_start, decisions, published, dropped_buffer_full,
			dropped_broker_error, dropped_encode_error, dropped_closed, final
			FROM decisions_accounting WHERE gateway_id = 'gw-acct' ORDER BY decisions`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var got []event.Accounting
		for rows.Next() {
			var a event.Accounting
			var start int64
			var final uint8
			if err := rows.Scan(&start, &a.Decisions, &a.Published, &a.DroppedBufferFull, &a.DroppedBrokerError,
				&a.DroppedEncodeError, &a.DroppedClosed, &final); err != nil {
				t.Fatal(err)
			}
			a.RunStart, a.Final = time.Unix(0, start).UTC(), final == 1
			got = append(got, a)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("decisions_accounting (-want +got):\n%s", diff)
		}
		for table, sum := range map[string]string{"decisions_by_key_1m": "sum", "decisions_key_history_1m": "sum",
			"decisions_by_ip_1m": "countMerge", "decisions_by_gateway_1m": "countMerge"} {
			if n := count(t, ch, "SELECT toUInt64("+sum+"(requests)) FROM "+table); n != uint64(len(ds)-len(want)) {
				t.Errorf("%s counts %d requests, want %d (accounting records are not requests)", table, n, len(ds)-len(want))
			}
		}
	})
}

// TestDirectivesStored: the directive an event says its gateway applied
// (a NAT factor, a split's shares) lands in the raw table as it was sent,
// for what-if replays; the other rows carry none.
func TestDirectivesStored(t *testing.T) {
	t.Parallel()
	eachBackend(t, 2, func(t *testing.T, kb kafkaBackend, ch driver.Conn, _ string) {
		ds := decisions(90)
		for i := range ds {
			switch i % 3 {
			case 1:
				ds[i].NATFactor = 2.5
			case 2:
				ds[i].Split = []event.SplitShare{{Gateway: "gw-a", Share: 0.75}, {Gateway: "*", Share: 0.25}}
			}
		}
		produce(t, kb.brokers, kb.topic, ds)
		r := start(t, kb.config(), ch, nil)
		testenv.WaitFor(t, 60*time.Second, "all rows in ClickHouse", func() bool {
			return count(t, ch, "SELECT count() FROM decisions") >= uint64(len(ds))
		})
		r.stop()
		rows, err := ch.Query(context.Background(), `SELECT toString(nat_factor) AS nat, arrayStringConcat(split_gateways, ',') AS gws,
			arrayStringConcat(arrayMap(s -> toString(s), split_shares), ',') AS shares, toUInt64(count())
			FROM decisions GROUP BY nat, gws, shares ORDER BY nat, gws`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var got []string
		for rows.Next() {
			var nat, gws, shares string
			var n uint64
			if err := rows.Scan(&nat, &gws, &shares, &n); err != nil {
				t.Fatal(err)
			}
			got = append(got, fmt.Sprintf("%s|%s|%s|%d", nat, gws, shares, n))
		}
		want := []string{"0|||30", "0|gw-a,*|0.75,0.25|30", "2.5|||30"}
		if !slices.Equal(got, want) {
			t.Errorf("directives stored %q, want %q", got, want)
		}
	})
}
