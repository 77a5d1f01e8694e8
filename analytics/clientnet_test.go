package analytics_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/analytics"
	"github.com/edgelimit/edgelimit/internal/event"
)

// TestClientNetIPv4Mapped: one client seen as 192.0.2.7 and as
// ::ffff:192.0.2.7 (an IPv4-mapped address, as a dual-stack peer or an
// Envoy remote_address names it) is one client, as the gateway keys it
// (ip:192.0.2.7): the NAT query groups both under 192.0.2.7 (it grouped
// them apart, the mapped half as ::ffff:192.0.2.7, each with half the
// evidence), and its history is the same by either name. An IPv6 client's
// history is its /64's by any address in it.
func TestClientNetIPv4Mapped(t *testing.T) {
	conn := mustDatabase(t)
	now := time.Now().UTC().Truncate(time.Minute)
	var rows []event.Decision
	for i := range 60 {
		ip := "192.0.2.7"
		if i%2 == 1 {
			ip = "::ffff:192.0.2.7"
		}
		if i%3 == 0 {
			ip = fmt.Sprintf("2001:db8:7:7::%x", i)
		}
		rows = append(rows, event.Decision{Time: now.Add(-time.Duration(i) * time.Second), GatewayID: "gw-a",
			KeyID: fmt.Sprintf("k-%d", i), KeyKind: event.KindAPIKey, ClientIP: ip, UserAgentHash: uint64(i),
			Route: "/r", Method: "GET", Plan: "free", BindingRule: "per_minute", Allowed: true, Limit: 100})
	}
	mustInsert(t, conn, rows)
	r := analytics.NewReader(conn)
	ctx := context.Background()
	rg := analytics.Range{From: now.Add(-time.Hour), To: now.Add(time.Minute)}

	got, err := r.IPTraffic(ctx, analytics.NATQuery{From: rg.From, To: rg.To, MinRequests: 1, MinKeys: 1, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{"192.0.2.7": 40, "2001:db8:7:7::": 20}
	if len(got) != len(want) {
		t.Errorf("IPTraffic = %+v, want the clients %v", got, want)
	}
	for _, g := range got {
		if w, ok := want[g.IP]; !ok || g.Requests != w || g.DistinctKeys != w {
			t.Errorf("IPTraffic row %+v, want %s with %d requests and keys", g, g.IP, want[g.IP])
		}
	}

	for ip, w := range map[string]int64{"192.0.2.7": 40, "::ffff:192.0.2.7": 40, "2001:db8:7:7::": 20, "2001:db8:7:7::3": 20} {
		ps, err := r.IPHistory(ctx, rg, ip, analytics.BucketHour)
		if err != nil {
			t.Fatal(err)
		}
		var reqs int64
		for _, p := range ps {
			reqs += p.Requests
		}
		if reqs != w {
			t.Errorf("IPHistory(%s) = %d requests, want %d", ip, reqs, w)
		}
	}
}
