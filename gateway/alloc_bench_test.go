package gateway

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/edgelimit/edgelimit/internal/event"
	"github.com/edgelimit/edgelimit/limiter"
)

// The benchmarks in this file price the request path's own work, without
// a network: a fixed store answer, a publisher that only encodes, a
// response writer that forgets. Their allocs/op is what one decision costs
// the garbage collector; BenchmarkGateway and the wrk run in
// testdata/wrk price the whole request.

// fixedStore answers every check allowed, each rule with the same result,
// and allocates nothing of its own, so a benchmark sees only the gateway's
// allocations.
type fixedStore struct{ rr []limiter.RuleResult }

func newFixedStore(rules []limiter.Rule) *fixedStore {
	s := &fixedStore{}
	for _, r := range rules {
		s.rr = append(s.rr, limiter.RuleResult{Rule: r, Allowed: true, Remaining: r.Limit - 1, ResetAfter: r.Period / 100})
	}
	return s
}

func (s *fixedStore) Allow(context.Context, string, []limiter.Rule, int64) (limiter.Decision, error) {
	return limiter.Decision{Allowed: true, Rules: s.rr, Time: time.Unix(1700000000, 0)}, nil
}

// encodingPublisher encodes each event into one buffer, as the Kafka
// publisher does into a pooled one, and keeps nothing.
type encodingPublisher struct{ buf []byte }

func (p *encodingPublisher) Publish(d event.Decision) { p.buf, _ = event.AppendEncode(p.buf[:0], d) }

// discardWriter is a ResponseWriter whose header map is emptied, not
// replaced, between requests, as net/http's is per request.
type discardWriter struct {
	h      http.Header
	status int
	n      int
}

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) WriteHeader(status int)      { w.status = status }
func (w *discardWriter) Write(b []byte) (int, error) { w.n += len(b); return len(b), nil }
func (w *discardWriter) reset()                      { clear(w.h); w.status, w.n = 0, 0 }

// allocGateway is benchConfig's gateway on a fixedStore of its bench plan,
// events encoded (or off), not listening.
func allocGateway(b *testing.B, events bool) *Gateway {
	b.Helper()
	cfg := benchConfig("http://127.0.0.1:1")
	rules := make([]limiter.Rule, 0, 3)
	for _, r := range cfg.Plans["bench"].Rules {
		rules = append(rules, r.Rule)
	}
	opts := Options{Store: newFixedStore(rules), Registry: prometheus.NewRegistry(),
		Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))}
	if events {
		opts.Publisher = &encodingPublisher{}
	}
	g, err := New(cfg, opts)
	if err != nil {
		b.Fatal(err)
	}
	return g
}

// BenchmarkEnforce is the enforcement step of one proxied request on a
// fixed store answer: directives, the store call, the event, the metrics,
// and the rate-limit headers of its answer.
func BenchmarkEnforce(b *testing.B) {
	for _, events := range []bool{false, true} {
		name := "events=off"
		if events {
			name = "events=encoded"
		}
		b.Run(name, func(b *testing.B) {
			g := allocGateway(b, events)
			st := g.st.Load()
			ctx := context.Background()
			h := http.Header{}
			b.ReportAllocs()
			for b.Loop() {
				clear(h)
				id := identity{kind: event.KindIP, key: "ip:10.1.2.3", plan: st.anonymous, clientIP: "10.1.2.3"}
				c := call{id: id, limits: st.limitsFor(id, nil, false), cost: 1, route: "limited", method: http.MethodGet, userAgent: "wrk"}
				if a := answerFor(h, g.enforce(ctx, st, &c), st); a.status != http.StatusOK {
					b.Fatalf("status %d", a.status)
				}
			}
		})
	}
}

// BenchmarkServeCheck is one POST /v1/check through the gateway's handler
// (echo, identify, enforce, the JSON both ways) on a fixed store answer,
// events encoded.
func BenchmarkServeCheck(b *testing.B) {
	g := allocGateway(b, true)
	h := g.Handler()
	body := []byte(`{"ip":"10.1.2.3","method":"GET","path":"/items"}`)
	rd := bytes.NewReader(body)
	req, _ := http.NewRequest(http.MethodPost, "http://gw/v1/check", rd)
	req.RemoteAddr = "127.0.0.1:40000" // a trusted proxy
	req.Header.Set("Content-Type", "application/json")
	w := &discardWriter{h: http.Header{}}
	b.ReportAllocs()
	for b.Loop() {
		rd.Reset(body)
		req.Body = io.NopCloser(rd)
		w.reset()
		h.ServeHTTP(w, req)
		if w.status != http.StatusOK {
			b.Fatalf("status %d", w.status)
		}
	}
}

// BenchmarkRateHeaders renders the rate-limit headers of an allowed
// 3-rule decision, the policy rendered ahead (the plan's rules) or not.
func BenchmarkRateHeaders(b *testing.B) {
	g := allocGateway(b, false)
	st := g.st.Load()
	v := g.decide(context.Background(), st, limits{key: "ip:10.1.2.3", plan: st.anonymous}, 1)
	for _, ahead := range []bool{true, false} {
		v.policy = ""
		if ahead {
			v.policy = st.anonymous.policy
		}
		b.Run(fmt.Sprintf("policy-ahead=%v", ahead), func(b *testing.B) {
			h := http.Header{}
			b.ReportAllocs()
			for b.Loop() {
				clear(h)
				setRateHeaders(h, v)
			}
			if len(h) != 5 {
				b.Fatalf("headers %v, want 5", h)
			}
		})
	}
}

// BenchmarkPublish builds and encodes the decision event of one call.
func BenchmarkPublish(b *testing.B) {
	g := allocGateway(b, true)
	st := g.st.Load()
	v := g.decide(context.Background(), st, limits{key: "ip:10.1.2.3", plan: st.anonymous}, 1)
	id := identity{kind: event.KindIP, key: "ip:10.1.2.3", plan: st.anonymous, clientIP: "10.1.2.3"}
	c := call{id: id, limits: st.limitsFor(id, nil, false), cost: 1, route: "limited", method: http.MethodGet, userAgent: "wrk"}
	b.ReportAllocs()
	for b.Loop() {
		c.id.keyID = "" // computed once per request, so once per iteration
		g.publish(&c, v)
	}
	if len(g.pub.(*encodingPublisher).buf) == 0 {
		b.Fatal("nothing encoded")
	}
}
