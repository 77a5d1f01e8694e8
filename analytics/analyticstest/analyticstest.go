// Package analyticstest makes synthetic decision traffic for analytics'
// tests and benchmarks: ordinary clients with planted hot keys, NAT-shared
// addresses and store outages, inserted into the raw decisions table and
// rolled up batch by batch as the consumer does.
package analyticstest

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/edgelimit/edgelimit/internal/event"
)

// WriteFunc writes decisions into the raw table as a batch of their own
// and rolls them up (consumer.Backfill; the consumer owns the columns, and
// this package may not import it).
type WriteFunc func(ctx context.Context, conn driver.Conn, ds []event.Decision) error

// Insert writes rows to conn in batches of 100,000 with write, as the
// consumer would have stored them. A row's unset ID, StoreStatus, Mode and
// Cost are written as a fresh id, ok, enforced and 1; rows is not changed.
func Insert(ctx context.Context, conn driver.Conn, rows []event.Decision, write WriteFunc) error {
	for start := 0; start < len(rows); start += 100000 {
		batch := slices.Clone(rows[start:min(len(rows), start+100000)])
		for i := range batch {
			d := &batch[i]
			if d.ID == ([16]byte{}) {
				d.ID = event.NewID(d.Time)
			}
			d.StoreStatus = cmp.Or(d.StoreStatus, event.StoreOK)
			d.Mode = cmp.Or(d.Mode, event.ModeEnforced)
			d.Cost = max(1, d.Cost)
		}
		if err := write(ctx, conn, batch); err != nil {
			return err
		}
	}
	return nil
}

// Fleet describes synthetic traffic over the Window before Now.
type Fleet struct {
	Now    time.Time
	Window time.Duration
	// Gateways are the gateway ids; traffic spreads evenly unless a hot
	// key says otherwise.
	Gateways []string
	// Keys ordinary API keys each send PerKeyRate requests a second, each
	// from an address of its own (a few share one, under any NAT
	// threshold), with one or two user agents.
	Keys       int
	PerKeyRate float64
	// Hot are planted hot keys.
	Hot []HotKey
	// NAT are planted NAT-shared addresses.
	NAT []NATAddr
	// Outages are planted store outages.
	Outages []Outage
	// Seed makes the traffic reproducible.
	Seed uint64
}

// HotKey is a planted hot key: Rate requests a second over the last For,
// spread across gateways by Weights (gateway id → weight).
type HotKey struct {
	KeyID string
	// Name is the key's name in its events (an API key's id); "" for none.
	Name    string
	Rate    float64
	For     time.Duration
	Weights map[string]float64
}

// NATAddr is a planted shared address: Clients distinct keys and user
// agents, each sending Requests over the window. IP may be an IPv6 /64's
// prefix ending in "::", in which case each client gets its own address
// in that /64.
type NATAddr struct {
	IP       string
	Clients  int
	Requests int
}

// Outage is a planted store outage: during [From, From+For) a Share of
// Gateway's decisions find the store unavailable and fail Mode
// (event.ModeFailOpen or event.ModeFailClosed).
type Outage struct {
	Gateway string
	From    time.Time
	For     time.Duration
	Share   float64
	Mode    event.Mode
}

// Rules and plans the synthetic traffic uses.
var (
	Routes = []string{"/v1/search", "/v1/items", "/v1/orders"}
	Plans  = []string{"free", "pro"}
	Rules  = []string{"per_minute", "per_hour"}
)

// Rows generates the fleet's decisions. Ordinary keys are denied now and
// then (more on the free plan), hot keys about half the time.
func (f Fleet) Rows() []event.Decision {
	r := rand.New(rand.NewPCG(f.Seed, 7))
	start := f.Now.Add(-f.Window)
	var rows []event.Decision
	at := func(from time.Time, span time.Duration) time.Time {
		return from.Add(time.Duration(r.Int64N(int64(span))))
	}
	pick := func(gws map[string]float64) string {
		total := 0.0
		for _, gw := range f.Gateways {
			total += gws[gw]
		}
		x := r.Float64() * total
		for _, gw := range f.Gateways {
			if x -= gws[gw]; x < 0 {
				return gw
			}
		}
		return f.Gateways[len(f.Gateways)-1]
	}
	even := map[string]float64{}
	for _, gw := range f.Gateways {
		even[gw] = 1
	}
	decision := func(t time.Time, gw, key, ip string, ua uint64, plan string, denyP float64) event.Decision {
		d := event.Decision{
			Time: t, GatewayID: gw, KeyID: key, KeyKind: event.KindAPIKey, ClientIP: ip, UserAgentHash: ua,
			Route: Routes[r.IntN(len(Routes))], Method: "GET", Plan: plan, BindingRule: Rules[0],
			Allowed: true, Limit: 100, Remaining: int64(r.IntN(100)), Cost: 1,
			CheckLatency: time.Duration(200+r.IntN(800)) * time.Microsecond,
		}
		if r.Float64() < denyP {
			d.Allowed, d.Remaining = false, 0
			if r.IntN(4) == 0 {
				d.BindingRule = Rules[1]
			}
		}
		for _, o := range f.Outages {
			if o.Gateway == gw && !t.Before(o.From) && t.Before(o.From.Add(o.For)) && r.Float64() < o.Share {
				d.StoreStatus, d.Mode, d.Remaining = event.StoreUnavailable, o.Mode, 0
				d.Allowed = o.Mode == event.ModeFailOpen
				d.BindingRule = ""
			}
		}
		return d
	}
	for k := 0; k < f.Keys; k++ {
		key := "key-" + strconv.Itoa(k)
		// Every fifth address is shared by two keys: an office, not a NAT.
		ip := fmt.Sprintf("10.%d.%d.%d", k/5/250, (k/5)%250, 1+(k%5)/3)
		plan := Plans[k%2]
		denyP := 0.02
		if plan == "free" {
			denyP = 0.1
		}
		n := poisson(r, f.PerKeyRate*f.Window.Seconds())
		for i := 0; i < n; i++ {
			ua := uint64(k)<<8 | uint64(r.IntN(2))
			rows = append(rows, decision(at(start, f.Window), pick(even), key, ip, ua, plan, denyP))
		}
	}
	for _, h := range f.Hot {
		w := h.Weights
		if len(w) == 0 {
			w = even
		}
		n := int(h.Rate * h.For.Seconds())
		for i := 0; i < n; i++ {
			d := decision(at(f.Now.Add(-h.For), h.For), pick(w), h.KeyID, "10.250.0.1", 99, "pro", 0.5)
			d.KeyName = h.Name
			rows = append(rows, d)
		}
	}
	for j, a := range f.NAT {
		for c := 0; c < a.Clients; c++ {
			ip := a.IP
			if ip[len(ip)-1] == ':' {
				ip += strconv.FormatInt(int64(c+1), 16)
			}
			key := fmt.Sprintf("nat-%d-client-%d", j, c)
			for i := 0; i < max(1, a.Requests/a.Clients); i++ {
				rows = append(rows, decision(at(start, f.Window), pick(even), key, ip, uint64(1000+j*1000+c), "free", 0.05))
			}
		}
	}
	return rows
}

// poisson draws a Poisson-distributed count with mean lambda (normal
// approximation above 30).
func poisson(r *rand.Rand, lambda float64) int {
	if lambda > 30 {
		return max(0, int(lambda+r.NormFloat64()*math.Sqrt(lambda)+0.5))
	}
	l, k, p := math.Exp(-lambda), 0, 1.0
	for {
		p *= r.Float64()
		if p <= l {
			return k
		}
		k++
	}
}
