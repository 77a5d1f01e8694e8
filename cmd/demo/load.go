package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// maxDue bounds the requests one load or traffic run schedules (-rate ×
// -duration), and with it the latencies it keeps. It is below the 2^24 IPs of
// 10.0.0.0/8, so -sequential never runs out of them.
const maxDue = 10_000_000

// loadFlags are the flags of `demo load`.
type loadFlags struct {
	url       string
	method    string
	body      string
	headers   []string
	forwarded bool
	keys      int
	seq       bool
	rate      float64
	duration  time.Duration
	conns     int
	timeout   time.Duration
	metrics   string
	histogram string
}

// load sends requests open-loop, as wrk2 does and wrk does not: request i
// is due at start + i/rate whether or not earlier ones came back, so a
// slow server meets the same schedule instead of a politely slower
// client. At most -conns requests are in flight; one due while all are
// busy is dropped and counted, never queued, so the generator's memory is
// bounded and an overload shows as drops. Latency counts from the due time
// (queueing in the generator included). With -metrics it also reads a
// histogram of the server's own /metrics before and after the run and
// prints the quantiles of the difference: what the server measured for
// exactly this run's requests. It prints one line of key=value pairs.
//
//	demo load -url http://127.0.0.1:8080/v1/check -body '{"ip":"{ip}"}' -rate 5000 -duration 10s \
//	    -metrics http://127.0.0.1:9090/metrics
func load(ctx context.Context, args []string, stdout io.Writer) error {
	var f loadFlags
	fs := flag.NewFlagSet("load", flag.ContinueOnError)
	fs.StringVar(&f.url, "url", "", "the URL every request goes to (required)")
	fs.StringVar(&f.method, "method", "", "HTTP method; default POST with -body, else GET")
	fs.StringVar(&f.body, "body", "", "request body; {ip} is replaced by the request's client IP")
	fs.Func("header", `a request header "Name: value" (repeatable)`, func(s string) error {
		if !strings.Contains(s, ":") {
			return fmt.Errorf("%q is not Name: value", s)
		}
		f.headers = append(f.headers, s)
		return nil
	})
	fs.BoolVar(&f.forwarded, "forwarded", false, "send the client IP as X-Forwarded-For")
	fs.IntVar(&f.keys, "keys", 100_000, "client IPs (10.0.0.0 upward) drawn at random")
	fs.BoolVar(&f.seq, "sequential", false, "request i uses the i-th client IP: each IP once")
	fs.Float64Var(&f.rate, "rate", 1000, "requests per second")
	fs.DurationVar(&f.duration, "duration", 10*time.Second, "how long to send")
	fs.IntVar(&f.conns, "conns", 256, "most requests in flight (and connections)")
	fs.DurationVar(&f.timeout, "timeout", 5*time.Second, "one request's timeout")
	fs.StringVar(&f.metrics, "metrics", "", "the server's /metrics URL: print its histogram's quantiles over the run")
	fs.StringVar(&f.histogram, "histogram", "edgelimit_gateway_check_duration_seconds", "the histogram -metrics reads (all its series summed)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	s, err := f.validate()
	if err != nil {
		return fmt.Errorf("load: %w", err)
	}
	client := &http.Client{Timeout: f.timeout, Transport: &http.Transport{
		// One connection per request in flight: never a wait for a
		// connection that the schedule does not see.
		MaxIdleConns: f.conns, MaxIdleConnsPerHost: f.conns, MaxConnsPerHost: f.conns,
	}}
	defer client.CloseIdleConnections()

	var before map[float64]float64
	if f.metrics != "" {
		if before, err = scrapeHistogram(ctx, client, f.metrics, f.histogram); err != nil {
			return fmt.Errorf("load: before the run: %w", err)
		}
	}
	res := s.dispatch(ctx, f.senders(client)).wait()
	line := res.String()
	if f.metrics != "" {
		after, err := scrapeHistogram(ctx, client, f.metrics, f.histogram)
		if err != nil {
			return fmt.Errorf("load: after the run: %w", err)
		}
		d := deltaBuckets(before, after)
		line += fmt.Sprintf(" server_count=%.0f server_p50_ms=%.3f server_p99_ms=%.3f",
			d[math.Inf(1)], 1000*bucketQuantile(0.5, d), 1000*bucketQuantile(0.99, d))
	}
	_, err = fmt.Fprintln(stdout, line)
	return err
}

func (f *loadFlags) validate() (schedule, error) {
	if f.url == "" {
		return schedule{}, errors.New("-url is required")
	}
	s, err := newSchedule(f.rate, f.duration, f.conns)
	if err != nil {
		return schedule{}, err
	}
	if f.keys <= 0 || f.keys > 1<<24 {
		return schedule{}, fmt.Errorf("-keys %d: want 1 to %d (10.0.0.0/8)", f.keys, 1<<24)
	}
	if f.method == "" {
		f.method = http.MethodGet
		if f.body != "" {
			f.method = http.MethodPost
		}
	}
	return s, nil
}

// loadResult counts one run: every due request was sent or dropped; a
// sent one got a status or an error.
type loadResult struct {
	due, sent, dropped, errors int
	status                     map[int]int
	// late counts requests sent more than a millisecond after they were
	// due: the generator itself fell behind (a busy machine), not the
	// server.
	late    int
	latency []time.Duration
	elapsed time.Duration
}

type job struct {
	i  int
	at time.Time
}

// loadRun is a run whose requests are all dispatched; wait collects it.
type loadRun struct {
	res     loadResult
	mu      sync.Mutex
	workers sync.WaitGroup
	start   time.Time
}

// senders sends each worker's requests with client, its client IPs drawn
// from a generator of its own.
func (f *loadFlags) senders(client *http.Client) func(worker int) sender {
	return func(w int) sender {
		seed := uint64(time.Now().UnixNano()) + uint64(w)<<32
		return func(ctx context.Context, i int) (int, error) {
			return f.send(ctx, client, f.ip(i, &seed))
		}
	}
}

// schedule is an open-loop schedule (see load): due requests, request i
// due at start + i/rate, at most conns in flight.
type schedule struct {
	rate  float64
	due   int
	conns int
}

// newSchedule is rate requests a second for d, at most conns in flight,
// and at most maxDue requests in all.
func newSchedule(rate float64, d time.Duration, conns int) (schedule, error) {
	switch {
	case rate <= 0 || d <= 0:
		return schedule{}, errors.New("-rate and -duration must be positive")
	case conns <= 0:
		return schedule{}, errors.New("-conns must be positive")
	}
	due := rate * d.Seconds()
	if due > maxDue {
		return schedule{}, fmt.Errorf("-rate × -duration is %.0f requests, more than %d", due, maxDue)
	}
	return schedule{rate: rate, due: int(math.Round(due)), conns: conns}, nil
}

// sender sends request i and returns its status.
type sender func(ctx context.Context, i int) (status int, err error)

// dispatch sends s's requests on schedule from s.conns workers, each with
// the sender newSender makes for it (so each can keep a random source of
// its own, without a lock), and returns once the last is due (sent or
// dropped), without waiting for answers.
func (s schedule) dispatch(ctx context.Context, newSender func(worker int) sender) *loadRun {
	r := &loadRun{res: loadResult{due: s.due, status: map[int]int{}}}
	// slots holds a token per request in flight; jobs never holds more
	// than slots allow, so the dispatcher never blocks on it.
	slots := make(chan struct{}, s.conns)
	jobs := make(chan job, s.conns)
	for w := range s.conns {
		r.workers.Go(func() {
			send := newSender(w)
			var mine []time.Duration
			status := map[int]int{}
			errs, late := 0, 0
			for j := range jobs {
				if time.Since(j.at) > time.Millisecond {
					late++
				}
				code, err := send(ctx, j.i)
				<-slots
				if err != nil {
					errs++
					continue
				}
				mine = append(mine, time.Since(j.at))
				status[code]++
			}
			r.mu.Lock()
			defer r.mu.Unlock()
			r.res.latency = append(r.res.latency, mine...)
			r.res.errors += errs
			r.res.late += late
			for c, n := range status {
				r.res.status[c] += n
			}
		})
	}
	defer close(jobs)
	r.start = time.Now()
	interval := float64(time.Second) / s.rate
	for i := range s.due {
		at := r.start.Add(time.Duration(float64(i) * interval))
		if d := time.Until(at); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-ctx.Done():
				t.Stop()
			case <-t.C:
			}
		}
		if ctx.Err() != nil {
			break
		}
		select {
		case slots <- struct{}{}:
			jobs <- job{i: i, at: at}
			r.res.sent++
		default:
			r.res.dropped++
		}
	}
	return r
}

// wait returns the run's result once every sent request is answered or
// failed.
func (r *loadRun) wait() loadResult {
	r.workers.Wait()
	r.res.elapsed = time.Since(r.start)
	return r.res
}

// ip is request i's client IP: the i-th with -sequential, else one of the
// first -keys drawn from the worker's own generator (seed).
func (f *loadFlags) ip(i int, seed *uint64) string {
	n := i
	if !f.seq {
		// splitmix64: cheap, no lock, no shared source.
		*seed += 0x9e3779b97f4a7c15
		z := *seed
		z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		n = int((z ^ z>>31) % uint64(f.keys))
	}
	return fmt.Sprintf("10.%d.%d.%d", n>>16&255, n>>8&255, n&255)
}

func (f *loadFlags) send(ctx context.Context, client *http.Client, ip string) (int, error) {
	var body io.Reader
	if f.body != "" {
		body = strings.NewReader(strings.ReplaceAll(f.body, "{ip}", ip))
	}
	req, err := http.NewRequestWithContext(ctx, f.method, f.url, body)
	if err != nil {
		return 0, err
	}
	for _, h := range f.headers {
		name, value, _ := strings.Cut(h, ":")
		req.Header.Set(strings.TrimSpace(name), strings.TrimSpace(value))
	}
	if f.body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if f.forwarded {
		req.Header.Set("X-Forwarded-For", ip)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return 0, err
	}
	return resp.StatusCode, nil
}

// String is the run as key=value pairs: counts, the achieved rate, and the
// client-side latency quantiles in milliseconds.
func (r loadResult) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "due=%d sent=%d dropped=%d errors=%d late=%d rps=%.0f", r.due, r.sent, r.dropped, r.errors, r.late,
		float64(r.sent)/r.elapsed.Seconds())
	codes := make([]int, 0, len(r.status))
	for c := range r.status {
		codes = append(codes, c)
	}
	slices.Sort(codes)
	for _, c := range codes {
		fmt.Fprintf(&b, " status_%d=%d", c, r.status[c])
	}
	slices.Sort(r.latency)
	fmt.Fprintf(&b, " p50_ms=%.3f p99_ms=%.3f", ms(quantile(r.latency, 0.5)), ms(quantile(r.latency, 0.99)))
	return b.String()
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// quantile is the q-quantile of sorted (nearest rank), 0 when empty.
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// scrapeHistogram reads the Prometheus text at url and returns the
// cumulative bucket counts of the histogram name, summed over its series,
// by upper bound (+Inf included).
func scrapeHistogram(ctx context.Context, client *http.Client, url, name string) (map[float64]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape %s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", url, err)
	}
	return histogramBuckets(mfs[name]), nil
}

// histogramBuckets sums the cumulative buckets of every series of mf (nil:
// none, as before a server's first observation).
func histogramBuckets(mf *dto.MetricFamily) map[float64]float64 {
	out := map[float64]float64{}
	if mf == nil {
		return out
	}
	for _, m := range mf.GetMetric() {
		h := m.GetHistogram()
		for _, b := range h.GetBucket() {
			if !math.IsInf(b.GetUpperBound(), 1) { // the count below
				out[b.GetUpperBound()] += float64(b.GetCumulativeCount())
			}
		}
		out[math.Inf(1)] += float64(h.GetSampleCount())
	}
	return out
}

// deltaBuckets is after minus before, bound by bound: the observations
// made between the two scrapes.
func deltaBuckets(before, after map[float64]float64) map[float64]float64 {
	out := make(map[float64]float64, len(after))
	for ub, n := range after {
		out[ub] = n - before[ub]
	}
	return out
}

// bucketQuantile is Prometheus's histogram_quantile over cumulative
// buckets: linear within the bucket holding rank q·count, the lower bound
// of the +Inf bucket when it lands there, 0 without observations.
func bucketQuantile(q float64, buckets map[float64]float64) float64 {
	bounds := make([]float64, 0, len(buckets))
	for ub := range buckets {
		bounds = append(bounds, ub)
	}
	sort.Float64s(bounds)
	if len(bounds) == 0 || buckets[bounds[len(bounds)-1]] == 0 {
		return 0
	}
	rank := q * buckets[bounds[len(bounds)-1]]
	lower, below := 0.0, 0.0
	for _, ub := range bounds {
		n := buckets[ub]
		if n >= rank && n > below {
			if math.IsInf(ub, 1) {
				return lower
			}
			return lower + (ub-lower)*(rank-below)/(n-below)
		}
		lower, below = ub, n
	}
	return lower
}
