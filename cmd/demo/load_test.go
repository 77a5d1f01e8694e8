package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/edgelimit/edgelimit/internal/testenv"
)

// TestLoadDoesNotBackOff: with every request stuck in a server that does
// not answer, the generator keeps its schedule: -conns requests go out
// and every later one is dropped and counted, none queued or delayed into
// a slower rate.
func TestLoadDoesNotBackOff(t *testing.T) {
	release := make(chan struct{})
	var mu sync.Mutex
	inFlight, most := 0, 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		inFlight++
		most = max(most, inFlight)
		mu.Unlock()
		<-release
		mu.Lock()
		inFlight--
		mu.Unlock()
	}))
	defer srv.Close()
	f := loadFlags{url: srv.URL, keys: 10, rate: 10_000, duration: 20 * time.Millisecond, conns: 3, timeout: time.Minute}
	s, err := f.validate()
	if err != nil {
		t.Fatal(err)
	}
	run := s.dispatch(context.Background(), f.senders(srv.Client()))
	close(release) // every request is due by now: none could finish before
	res := run.wait()
	if res.due != 200 || res.sent != 3 || res.dropped != 197 || res.errors != 0 || res.status[http.StatusOK] != 3 {
		t.Errorf("run = due %d sent %d dropped %d errors %d status %v, want 200 due, 3 sent (200 OK), 197 dropped",
			res.due, res.sent, res.dropped, res.errors, res.status)
	}
	if most > 3 {
		t.Errorf("%d requests in flight at once, want at most -conns 3", most)
	}
}

// TestLoadSequential: -sequential gives every request its own client IP,
// in the body and the X-Forwarded-For header, and -header sets a header.
func TestLoadSequential(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		if want := `{"ip":"` + r.Header.Get("X-Forwarded-For") + `"}`; string(body) != want || r.Method != http.MethodPost || r.Header.Get("X-API-Key") != "k" {
			t.Errorf("%s body %s, X-API-Key %q; want POST %s, X-API-Key k", r.Method, body, r.Header.Get("X-API-Key"), want)
		}
		seen[r.Header.Get("X-Forwarded-For")]++
		w.WriteHeader(http.StatusTooManyRequests)
	}))
	defer srv.Close()
	var out bytes.Buffer
	// As many connections as requests: none can be dropped.
	err := load(context.Background(), []string{"-url", srv.URL, "-body", `{"ip":"{ip}"}`, "-forwarded", "-sequential",
		"-header", "X-API-Key: k", "-rate", "100000", "-duration", "3ms", "-conns", "300"}, &out)
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) != 300 || seen["10.0.1.43"] != 1 {
		t.Errorf("%d distinct IPs (10.0.1.43 %d times), want 300, each once", len(seen), seen["10.0.1.43"])
	}
	for _, kv := range []string{"due=300 ", "sent=300 ", "dropped=0 ", "errors=0 ", "status_429=300 "} {
		if !strings.Contains(out.String(), kv) {
			t.Errorf("load printed %q, want %s in it", out.String(), kv)
		}
	}
}

func TestLoadFlags(t *testing.T) {
	tests := []struct {
		name string
		give []string
		want string
	}{
		{"no url", nil, "-url is required"},
		{"zero rate", []string{"-url", "http://x", "-rate", "0"}, "-rate and -duration must be positive"},
		{"too many", []string{"-url", "http://x", "-rate", "1e7", "-duration", "2s"}, "more than 10000000"},
		{"keys", []string{"-url", "http://x", "-keys", "0"}, "-keys 0"},
		{"header", []string{"-url", "http://x", "-header", "nocolon"}, "is not Name: value"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := load(context.Background(), tt.give, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("load(%q) = %v, want an error with %q", tt.give, err, tt.want)
			}
		})
	}
}

// TestServerHistogram reads the quantiles of a histogram's growth between
// two scrapes, summed over its series, as histogram_quantile would.
func TestServerHistogram(t *testing.T) {
	parse := func(text string) map[float64]float64 {
		p := expfmt.NewTextParser(model.UTF8Validation)
		mfs, err := p.TextToMetricFamilies(strings.NewReader(text))
		if err != nil {
			t.Fatal(err)
		}
		return histogramBuckets(mfs["check_seconds"])
	}
	const head = "# TYPE check_seconds histogram\n"
	before := parse(head + `check_seconds_bucket{status="ok",le="0.001"} 10
check_seconds_bucket{status="ok",le="0.002"} 10
check_seconds_bucket{status="ok",le="+Inf"} 10
check_seconds_sum{status="ok"} 0.005
check_seconds_count{status="ok"} 10
`)
	after := parse(head + `check_seconds_bucket{status="ok",le="0.001"} 60
check_seconds_bucket{status="ok",le="0.002"} 100
check_seconds_bucket{status="ok",le="+Inf"} 105
check_seconds_sum{status="ok"} 0.1
check_seconds_count{status="ok"} 105
check_seconds_bucket{status="timeout",le="0.001"} 0
check_seconds_bucket{status="timeout",le="0.002"} 0
check_seconds_bucket{status="timeout",le="+Inf"} 5
check_seconds_sum{status="timeout"} 1
check_seconds_count{status="timeout"} 5
`)
	d := deltaBuckets(before, after)
	if diff := cmp.Diff(map[float64]float64{0.001: 50, 0.002: 90, math.Inf(1): 100}, d); diff != "" {
		t.Errorf("deltaBuckets (-want +got):\n%s", diff)
	}
	tests := []struct {
		give float64
		want float64
	}{
		{0.25, 0.0005},  // rank 25 of the 50 below 1 ms
		{0.5, 0.001},    // rank 50: the first bucket's top
		{0.7, 0.0015},   // rank 70: halfway through 1-2 ms
		{0.99, 0.002},   // rank 99: beyond the last finite bound
		{0.9, 0.002},    // rank 90: exactly the last finite bound
		{0.95, 0.002},   // in +Inf: its lower bound
		{0.001, 0.0000}, // rank 0.1 of 50: near zero
	}
	for _, tt := range tests {
		if got := bucketQuantile(tt.give, d); math.Abs(got-tt.want) > 1e-5 {
			t.Errorf("bucketQuantile(%v) = %v, want %v", tt.give, got, tt.want)
		}
	}
	if got := bucketQuantile(0.99, histogramBuckets(nil)); got != 0 {
		t.Errorf("bucketQuantile of no observations = %v, want 0", got)
	}
}

// TestCreateTopics creates a topic on the real broker, with the partitions
// asked for, and again without an error (it exists).
func TestCreateTopics(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	topic := fmt.Sprintf("demo-topic-%d", time.Now().UnixNano())
	for range 2 {
		if err := createTopics(t.Context(), []string{"-brokers", strings.Join(brokers, ","), "-partitions", "3", topic}, io.Discard); err != nil {
			t.Fatalf("createTopics(%s) = %v", topic, err)
		}
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	details, err := kadm.NewClient(cl).ListTopics(t.Context(), topic)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(details[topic].Partitions); got != 3 {
		t.Errorf("topic %s has %d partitions, want 3", topic, got)
	}
	if err := createTopics(t.Context(), []string{topic}, io.Discard); err == nil || !strings.Contains(err.Error(), "usage") {
		t.Errorf("createTopics without -brokers = %v, want its usage", err)
	}
}

func TestRunSubcommands(t *testing.T) {
	const usage = "usage: demo upstream|traffic|probe|kafka|keyhash|topic|load [flags]"
	if err := run(t.Context(), nil, io.Discard); err == nil || err.Error() != usage {
		t.Errorf("run() = %v, want %q", err, usage)
	}
	if err := run(t.Context(), []string{"nope"}, io.Discard); err == nil || err.Error() != `unknown subcommand "nope"` {
		t.Errorf("run(nope) = %v, want unknown subcommand", err)
	}
	var out strings.Builder
	if err := run(t.Context(), []string{"keyhash", "abc"}, &out); err != nil || out.String() != "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad\n" {
		t.Errorf("run(keyhash abc) = %q, %v; want abc's SHA-256", out.String(), err)
	}
}

// TestTrafficOnSchedule: traffic's mix goes out on load's open-loop
// schedule, and its line accounts for every due request: what the gateway
// answered 429 is denied, 2xx allowed, 5xx failed, and what the
// connections could not carry is dropped, never silently skipped.
func TestTrafficOnSchedule(t *testing.T) {
	var mu sync.Mutex
	answered := map[int]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		code := http.StatusOK
		switch {
		case r.Header.Get("X-API-Key") == demoHotKey:
			code = http.StatusTooManyRequests
		case r.Header.Get("X-API-Key") == demoKeys[0]:
			code = http.StatusServiceUnavailable
		}
		mu.Lock()
		answered[code]++
		mu.Unlock()
		w.WriteHeader(code)
	}))
	defer srv.Close()
	var out strings.Builder
	if err := traffic(t.Context(), []string{"-gateway", srv.URL, "-rate", "4000", "-duration", "100ms"}, &out); err != nil {
		t.Fatal(err)
	}
	var sent, allowed, denied, failed, dropped int
	if _, err := fmt.Sscanf(out.String(), "traffic: sent %d, allowed %d, denied %d, failed %d, dropped %d",
		&sent, &allowed, &denied, &failed, &dropped); err != nil {
		t.Fatalf("traffic printed %q: %v", out.String(), err)
	}
	mu.Lock()
	defer mu.Unlock()
	if sent+dropped != 400 || allowed+denied+failed != sent {
		t.Errorf("traffic printed %q: want sent + dropped = 400 due, allowed + denied + failed = sent", out.String())
	}
	if allowed != answered[http.StatusOK] || denied != answered[http.StatusTooManyRequests] || failed != answered[http.StatusServiceUnavailable] {
		t.Errorf("traffic printed %q, the gateway answered %v", out.String(), answered)
	}
	for _, tt := range []struct{ give, want string }{
		{"-rate=0", "-rate and -duration must be positive"},
		{"-gateway=http://[::1", "want http(s)://host[:port]"},
		{"-gateway=127.0.0.1:8080", "want http(s)://host[:port]"},
	} {
		if err := traffic(t.Context(), []string{tt.give}, io.Discard); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("traffic %s = %v, want an error with %q", tt.give, err, tt.want)
		}
	}
}
