package gateway

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/gateway/plans"
	"github.com/edgelimit/edgelimit/internal/event"
	"github.com/edgelimit/edgelimit/internal/testenv"
	"github.com/edgelimit/edgelimit/limiter"
)

// llmUpstream is a real HTTP service answering OpenAI-style chat
// completions: a JSON body with a usage object, or, for "stream": true, a
// text/event-stream whose last data event before [DONE] carries it. Each
// answer uses promptTokens plus a completion of 1 to max_tokens tokens
// (from the request's "seed"); it counts what it reported.
type llmUpstream struct {
	*httptest.Server
	reported atomic.Int64 // tokens reported, over every answer
	answers  atomic.Int64
	// delay holds each answer, so that callers overlap.
	delay time.Duration
}

const promptTokens = 10

func newLLMUpstream(t testing.TB, delay time.Duration) *llmUpstream {
	u := &llmUpstream{delay: delay}
	u.Server = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(u.Close)
	return u
}

func (u *llmUpstream) serve(w http.ResponseWriter, r *http.Request) {
	var req struct {
		MaxTokens int64 `json:"max_tokens"`
		Stream    bool  `json:"stream"`
		Seed      int64 `json:"seed"`
		// Usage, when set, is reported instead (a header answer's test).
		Usage int64 `json:"usage"`
		NoUse bool  `json:"no_usage"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	time.Sleep(u.delay)
	completion := 1 + (req.Seed*7919)%max(1, req.MaxTokens)
	total := promptTokens + completion
	if req.Usage > 0 {
		total = req.Usage
	}
	usage := fmt.Sprintf(`{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}`, total-completion, completion, total)
	if !req.NoUse {
		u.reported.Add(total)
	}
	u.answers.Add(1)
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		if req.NoUse {
			fmt.Fprintf(w, `{"id":"c","choices":[{"message":{"content":"hi"}}]}`)
			return
		}
		// The content mentions "usage" the way a model might: quoted, so
		// escaped inside the string.
		fmt.Fprintf(w, `{"id":"c","choices":[{"message":{"content":"the \"usage\": {\"total_tokens\": 1}"}}],"usage":%s}`, usage)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	for i := range 3 {
		fmt.Fprintf(w, "data: {\"id\":\"c\",\"choices\":[{\"delta\":{\"content\":\"t%d\"}}],\"usage\":null}\n\n", i)
		fl.Flush()
	}
	if !req.NoUse {
		fmt.Fprintf(w, "data: {\"id\":\"c\",\"choices\":[],\"usage\":%s}\r\n\r\n", usage)
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
}

// llmConfig limits every caller by a plan of a generous request rate and
// budget tokens per period, on a route reserving as tokens says.
func llmConfig(upstream string, budget int64, period time.Duration, tokens plans.Tokens) Config {
	cfg := testConfig(upstream)
	cfg.Plans = map[string]Plan{"llm": {Rules: []Rule{
		{Rule: limiter.Rule{Name: "requests", Limit: 1_000_000, Period: time.Minute}},
		{Rule: limiter.Rule{Name: "tokens", Limit: budget, Period: period}, Unit: plans.UnitTokens},
	}}}
	cfg.AnonymousPlan = "llm"
	cfg.Routes = []Route{
		{Name: "chat", PathPrefix: "/v1/chat/completions", Methods: []string{"POST"}, Upstream: "app", Tokens: &tokens},
		{Name: "other", PathPrefix: "/", Upstream: "app"},
	}
	return cfg
}

// budgetRun is what callers of one budget run were admitted.
type budgetRun struct {
	admitted, denied int64
	reported         int64 // tokens the upstream reported for admitted requests
	elapsed          time.Duration
	events           []event.Decision
}

// runBudget sends, from callers concurrent callers, chat completions of
// maxTokens (every other one streamed) to a fresh gateway on the shared
// Redis with tokens' reservation and a budget of budget tokens a minute;
// each caller sends attempts requests, admitted or not, pausing after a
// denial.
func runBudget(t *testing.T, callers, attempts int, budget, maxTokens int64, tokens plans.Tokens) budgetRun {
	t.Helper()
	up := newLLMUpstream(t, 20*time.Millisecond)
	lim, _ := redisStore(t)
	ev := &eventLog{}
	gw := startGateway(t, llmConfig(up.URL, budget, time.Minute, tokens), Options{Store: lim, Publisher: ev})
	var run budgetRun
	var wg sync.WaitGroup
	start := make(chan struct{})
	var seed atomic.Int64
	began := time.Now()
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for range attempts {
				s := seed.Add(1)
				body := fmt.Sprintf(`{"model":"m","max_tokens":%d,"stream":%t,"seed":%d,"messages":[]}`, maxTokens, c%2 == 1, s)
				resp, err := client.Post(gw.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
				if err != nil {
					t.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				switch resp.StatusCode {
				case http.StatusOK:
					atomic.AddInt64(&run.admitted, 1)
				case http.StatusTooManyRequests:
					// Not the Retry-After (seconds): a pause, so that the
					// attempts span the settlements of those in flight.
					atomic.AddInt64(&run.denied, 1)
					time.Sleep(2 * time.Millisecond)
				default:
					t.Errorf("status %d", resp.StatusCode)
					return
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	run.elapsed = time.Since(began)
	run.reported = up.reported.Load()
	if got := up.answers.Load(); got != run.admitted {
		t.Fatalf("the upstream answered %d requests, the callers were admitted %d", got, run.admitted)
	}
	// A JSON answer has a length: its caller may have it before the
	// gateway has settled it.
	run.events = ev.await(t, func(all []event.Decision) bool { return settlements(all) == run.admitted })
	return run
}

// TestTokenBudgetHoldsUnderConcurrency: 64 callers of 100 requests each on a budget of 10,000
// tokens a minute, each asking max_tokens 400 and answered with up to
// 410 (10 prompt tokens beyond the reservation): reserved before and
// settled after, the tokens admitted never exceed the budget, plus its
// refill over the run, plus what answers used beyond their reservations
// while they were in flight (at most callers × 10). The same load checked
// first and charged later (a reservation of 1, Envoy AI Gateway's and
// most AI gateways' way) lets every request in while the budget shows
// room: the overshoot the reservation avoids. Every token the upstream
// reported is accounted for in the events: the decisions' costs (the
// reservations) plus the settlements' equal its sum.
func TestTokenBudgetHoldsUnderConcurrency(t *testing.T) {
	const callers, attempts, budget, maxTokens = 64, 100, 10_000, 400
	exact := runBudget(t, callers, attempts, budget, maxTokens, plans.Tokens{
		Reserve: plans.Reserve{BodyField: "max_tokens", Max: 1000},
	})
	// The bucket refills budget a minute over the run; each request in
	// flight may use promptTokens beyond what it reserved.
	refill := int64(math.Ceil(float64(budget) * exact.elapsed.Seconds() / 60))
	bound := budget + refill + callers*promptTokens
	t.Logf("reserve then settle: %d admitted, %d denied, %d tokens used in %v (bound %d = budget %d + refill %d + %d×%d)",
		exact.admitted, exact.denied, exact.reported, exact.elapsed.Round(time.Millisecond), bound, budget, refill, callers, promptTokens)
	if exact.reported > bound {
		t.Errorf("reserved and settled, the callers used %d tokens, above the bound %d", exact.reported, bound)
	}
	if exact.reported < budget*8/10 || exact.denied == 0 {
		t.Errorf("the budget was not used: %d tokens, %d requests denied", exact.reported, exact.denied)
	}
	if got := accounted(t, exact.events); got != exact.reported {
		t.Errorf("the events account for %d tokens, the upstream reported %d", got, exact.reported)
	}

	later := runBudget(t, callers, attempts, budget, maxTokens, plans.Tokens{
		Reserve: plans.Reserve{Default: 1, Max: 1},
	})
	refill = int64(math.Ceil(float64(budget) * later.elapsed.Seconds() / 60))
	t.Logf("check first, charge later: %d admitted, %d denied, %d tokens used in %v: %d over budget + refill",
		later.admitted, later.denied, later.reported, later.elapsed.Round(time.Millisecond), later.reported-budget-refill)
	if got := accounted(t, later.events); got != later.reported {
		t.Errorf("charged later, the events account for %d tokens, the upstream reported %d", got, later.reported)
	}
}

// settlements counts the settlement records of all.
func settlements(all []event.Decision) int64 {
	var n int64
	for _, e := range all {
		if e.Mode == event.ModeSettlement {
			n++
		}
	}
	return n
}

// await returns the events once done says they are all there, failing
// the test after a minute.
func (e *eventLog) await(t *testing.T, done func([]event.Decision) bool) []event.Decision {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(5 * time.Millisecond) {
		e.mu.Lock()
		all := append([]event.Decision(nil), e.all...)
		e.mu.Unlock()
		if done(all) {
			return all
		}
		if time.Now().After(deadline) {
			t.Fatalf("events not all there after a minute: %d, %d settlements", len(all), settlements(all))
		}
	}
}

// accounted is what events say was used: the admitted decisions' costs
// (their reservations) plus the settlements' (what was used beyond).
func accounted(t *testing.T, events []event.Decision) int64 {
	t.Helper()
	var sum int64
	var decisions, settlements int
	for _, e := range events {
		switch {
		case e.Mode == event.ModeSettlement:
			settlements++
			sum += e.Cost
			if e.Cost != e.Settled-e.Reserved {
				t.Errorf("settlement of cost %d for %d reserved, %d settled", e.Cost, e.Reserved, e.Settled)
			}
		case e.Allowed:
			decisions++
			sum += e.Cost
		}
	}
	if decisions != settlements {
		t.Errorf("%d admitted decisions, %d settlements", decisions, settlements)
	}
	return sum
}

// TestTokenSettlement: each way an answer reports its usage settles the
// reservation, the headers say what was reserved and (as trailers) what
// was settled, an answer using more than reserved overdraws the budget
// (the next request waits), and an answer without usage settles by the
// route's rule.
func TestTokenSettlement(t *testing.T) {
	up := newLLMUpstream(t, 0)
	type step struct {
		body     string
		reserved int64
		settled  int64
		// remaining is the token rule's after the settlement, from the
		// trailer; -1: no trailer (the answer had a length).
		remaining int64
	}
	cases := []struct {
		name   string
		tokens plans.Tokens
		steps  []step
	}{
		{"json usage gives back", plans.Tokens{Reserve: plans.Reserve{BodyField: "max_tokens", Max: 500}}, []step{
			{`{"max_tokens":300,"seed":5}`, 300, promptTokens + 1 + 5*7919%300, -1},
		}},
		{"streamed usage", plans.Tokens{Reserve: plans.Reserve{BodyField: "max_tokens", Max: 500}}, []step{
			{`{"max_tokens":300,"seed":5,"stream":true}`, 300, promptTokens + 1 + 5*7919%300, 1000 - (promptTokens + 1 + 5*7919%300)},
		}},
		{"reservation capped, header", plans.Tokens{Reserve: plans.Reserve{Header: "X-Max-Tokens", BodyField: "max_tokens", Max: 500}}, []step{
			{`{"max_tokens":9000,"usage":42,"stream":true}`, 500, 42, 958},
		}},
		{"overdraw", plans.Tokens{Reserve: plans.Reserve{Default: 100, Max: 1000}}, []step{
			{`{"max_tokens":5,"usage":1500,"stream":true}`, 100, 1500, 0},
		}},
		{"no usage keeps", plans.Tokens{Reserve: plans.Reserve{Default: 100, Max: 1000}}, []step{
			{`{"no_usage":true,"stream":true}`, 100, 100, 900},
		}},
		{"no usage refunds", plans.Tokens{Reserve: plans.Reserve{Default: 100, Max: 1000}, Unsettled: plans.UnsettledRefund}, []step{
			{`{"no_usage":true,"stream":true}`, 100, 0, 1000},
		}},
		// A client that leaves before the usage pays for its prompt as
		// estimated from the body: 4 bytes a token.
		{"prompt estimated", plans.Tokens{Reserve: plans.Reserve{Default: 10, BodyBytesPerToken: 4, Max: 500}}, []step{
			{promptBody, 10 + (int64(len(promptBody))+3)/4, 10 + (int64(len(promptBody))+3)/4, 1000 - 10 - (int64(len(promptBody))+3)/4},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			lim, _ := redisStore(t)
			ev := &eventLog{}
			// A day's budget: no refill within the test shows.
			gw := startGateway(t, llmConfig(up.URL, 1000, 24*time.Hour, c.tokens), Options{Store: lim, Publisher: ev})
			for n, s := range c.steps {
				req, _ := http.NewRequest(http.MethodPost, gw.URL+"/v1/chat/completions", strings.NewReader(s.body))
				req.Header.Set("Content-Type", "application/json")
				if c.tokens.Reserve.Header != "" {
					req.Header.Set(c.tokens.Reserve.Header, "9000")
				}
				resp, err := client.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("status %d", resp.StatusCode)
				}
				if got := resp.Header.Get(hReserved); got != strconv.FormatInt(s.reserved, 10) {
					t.Errorf("%s: %q, want %d", hReserved, got, s.reserved)
				}
				if s.remaining >= 0 {
					if got := resp.Trailer.Get(hSettled); got != strconv.FormatInt(s.settled, 10) {
						t.Errorf("trailer %s: %q, want %d", hSettled, got, s.settled)
					}
					// (settled as reserved, nothing was asked of the store)
					if got, want := resp.Trailer.Get(hRateLimit), fmt.Sprintf(`"tokens";r=%d;`, s.remaining); s.settled != s.reserved && !strings.Contains(got, want) {
						t.Errorf("trailer %s: %q, want it to hold %s", hRateLimit, got, want)
					}
				}
				var settlement *event.Decision
				all := ev.await(t, func(all []event.Decision) bool { return settlements(all) == int64(n+1) })
				for i := range all {
					if all[i].Mode == event.ModeSettlement {
						settlement = &all[i]
					}
				}
				if settlement == nil || settlement.Reserved != s.reserved || settlement.Settled != s.settled {
					t.Fatalf("settlement record %+v, want %d reserved, %d settled", settlement, s.reserved, s.settled)
				}
			}
			if c.name != "overdraw" {
				return
			}
			// 1500 used of 1000: 500 overdrawn, so even 1 token waits for
			// 501 to refill (12 hours at 1000 a day).
			r := do(t, http.MethodPost, gw.URL+"/v1/chat/completions", strings.NewReader(`{"max_tokens":1}`), "Content-Type", "application/json")
			if r.status != http.StatusTooManyRequests {
				t.Fatalf("after an overdraw: status %d, want 429", r.status)
			}
			if after := r.retryAfter(t); after < 12*3600 {
				t.Errorf("after an overdraw of 500 at 1000 a day: Retry-After %d, want ≥ 12 h", after)
			}
			// Routes without a tokens setting check the requests rule only.
			if r := get(t, gw.URL+"/other"); r.status == http.StatusTooManyRequests {
				t.Errorf("a route without tokens, with the budget overdrawn: status %d", r.status)
			}
		})
	}
}

// promptBody is a request with a prompt of 400 bytes and no usage in its
// answer.
var promptBody = `{"no_usage":true,"stream":true,"messages":[{"content":"` + strings.Repeat("x", 400) + `"}]}`

// TestTokenConfigErrors: what a token budget cannot mean is refused at load.
func TestTokenConfigErrors(t *testing.T) {
	ok := plans.Tokens{Reserve: plans.Reserve{BodyField: "max_tokens", Max: 1000}}
	cases := []struct {
		name, want string
		edit       func(*Config)
	}{
		{"no max", "reserve.max", func(c *Config) { c.Routes[0].Tokens.Reserve.Max = 0 }},
		{"above capacity", "never be admitted", func(c *Config) { c.Routes[0].Tokens.Reserve.Max = 5000 }},
		{"default above max", "reserve.default", func(c *Config) { c.Routes[0].Tokens.Reserve.Default = 2000 }},
		{"body field on GET", "never carry a body", func(c *Config) { c.Routes[0].Methods = []string{"GET"} }},
		{"bad field", "body_field", func(c *Config) { c.Routes[0].Tokens.Reserve.BodyField = "a.b" }},
		{"bad unsettled", "unsettled", func(c *Config) { c.Routes[0].Tokens.Unsettled = "maybe" }},
		{"usage off without header", "settle.usage", func(c *Config) { c.Routes[0].Tokens.Settle.Usage = "-" }},
		{"exempt", "exempt", func(c *Config) { c.Routes[0].Exempt = true }},
		{"upgrades", "upgrades", func(c *Config) { c.Routes[0].Upgrades = []string{"websocket"} }},
		{"bad unit", "unit", func(c *Config) { c.Plans["llm"].Rules[0].Unit = "bytes" }},
		{"only tokens", "every rule counts tokens", func(c *Config) { c.Plans["llm"].Rules[0].Unit = plans.UnitTokens }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := llmConfig("http://127.0.0.1:1", 1000, time.Minute, ok)
			tk := *cfg.Routes[0].Tokens
			cfg.Routes[0].Tokens = &tk
			cfg.Plans["llm"] = Plan{Rules: append([]Rule(nil), cfg.Plans["llm"].Rules...)}
			c.edit(&cfg)
			err := cfg.Validate()
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Validate: %v, want an error about %q", err, c.want)
			}
		})
	}
	if err := llmConfig("http://127.0.0.1:1", 1000, time.Minute, ok).Validate(); err != nil {
		t.Fatalf("a good token route: %v", err)
	}
}

// TestUsageTapReadsLongAnswers: a JSON answer longer than what is parsed
// whole is settled from its tail, and an event line longer than the
// line bound is skipped without losing the events after it.
func TestUsageTapReadsLongAnswers(t *testing.T) {
	long := strings.Repeat("x", maxUsageBody+10)
	cases := []struct {
		ct, body string
		want     int64
	}{
		{"application/json", `{"choices":[{"message":{"content":"` + long + `"}}],"usage":{"total_tokens":77}}`, 77},
		{"text/event-stream", "data: {\"x\":\"" + strings.Repeat("y", maxUsageLine+5) + "\",\"usage\":{\"total_tokens\":1}}\n\ndata: {\"usage\":{\"total_tokens\":88}}\n\ndata: [DONE]\n\n", 88},
		{"text/event-stream", "data: {\"usage\":{\"total_tokens\":5}}\n\ndata: {\"usage\":{\"total_tokens\":6}}", 6},
		{"text/plain", `{"usage":{"total_tokens":5}}`, -1},
		{"application/json; charset=utf-8", `{"usage":{"total_tokens":12.0}}`, 12},
		{"application/json", `{"usage":{"total_tokens":-4}}`, -1},
		{"application/json", `{"usage":{"total_tokens":1.5}}`, -1},
	}
	for i, c := range cases {
		u := &tokenUse{t: &plans.Tokens{}, reserved: 3}
		resp := &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {c.ct}}, Body: io.NopCloser(bufio.NewReaderSize(strings.NewReader(c.body), 4096))}
		u.onResponse(resp)
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			t.Fatal(err)
		}
		got := int64(-1)
		if u.found {
			got = u.used
		}
		if got != c.want || !u.complete {
			t.Errorf("case %d (%s): usage %d (complete %t), want %d", i, c.ct, got, u.complete, c.want)
		}
	}
}

// TestReservation: what a request reserves, whichever way it names it; a
// client naming a small number in one place and a large one in the other
// reserves the large one.
func TestReservation(t *testing.T) {
	both := &plans.Tokens{Reserve: plans.Reserve{Header: "X-Max-Tokens", BodyField: "max_tokens", Default: 50, Max: 1000}}
	cases := []struct {
		header, body string
		want         int64
	}{
		{"", `{"max_tokens":300}`, 300},
		{"1", `{"max_tokens":300}`, 300},
		{"700", `{"max_tokens":300}`, 700},
		{"", `{"max_tokens":300.0}`, 300},
		{"", `{"max_tokens":5000}`, 1000},
		{"", `{"max_tokens":-3}`, 50},
		{"", `{"max_tokens":"300"}`, 50},
		{"", `{"max_tokens":2.5}`, 50},
		{"abc", `not json`, 50},
		{"", ``, 50},
		{"40", `{"nested":{"max_tokens":900}}`, 40},
	}
	for _, c := range cases {
		h := http.Header{}
		if c.header != "" {
			h.Set("X-Max-Tokens", c.header)
		}
		if got := reservation(both, h, []byte(c.body)); got != c.want {
			t.Errorf("header %q, body %s: reserved %d, want %d", c.header, c.body, got, c.want)
		}
	}
	// The prompt's estimate: 4 bytes a token, on top, within max.
	est := &plans.Tokens{Reserve: plans.Reserve{BodyField: "max_tokens", BodyBytesPerToken: 4, Max: 1000}}
	prompt := `{"max_tokens":100,"messages":[{"content":"` + strings.Repeat("x", 373) + `"}]}`
	if got, want := reservation(est, http.Header{}, []byte(prompt)), int64(100+(len(prompt)+3)/4); got != want {
		t.Errorf("with the prompt's estimate: reserved %d, want %d", got, want)
	}
	if got := reservation(est, http.Header{}, []byte(`{"max_tokens":999,"p":"`+strings.Repeat("x", 400)+`"}`)); got != 1000 {
		t.Errorf("with the prompt's estimate past max: reserved %d, want 1000", got)
	}
}

// TestTokenSettlementWithoutStore: while the shared store is unavailable,
// a reservation the local fallback charged is settled in the gateway's
// memory, where the next request sees it; one the failure policy let
// through unchecked is recorded (its settlement event, the metric) but
// charges nothing.
func TestTokenSettlementWithoutStore(t *testing.T) {
	up := newLLMUpstream(t, 0)
	for _, policy := range []FailurePolicy{FailLocal, FailOpen} {
		t.Run(string(policy), func(t *testing.T) {
			lim := storeOn(t, newRedisClient(testenv.Serve(t, nil)), "")
			cfg := llmConfig(up.URL, 1000, 24*time.Hour, plans.Tokens{Reserve: plans.Reserve{BodyField: "max_tokens", Max: 500}})
			cfg.FailurePolicy = policy
			cfg.StoreDeadline = testDeadline
			cfg.Breaker = BreakerConfig{Failures: 1, Open: time.Hour}
			ev := &eventLog{}
			gw := startGateway(t, cfg, Options{Store: lim, Publisher: ev})
			send := func() reply {
				return do(t, http.MethodPost, gw.URL+"/v1/chat/completions", strings.NewReader(`{"max_tokens":300,"usage":42,"stream":true}`), "Content-Type", "application/json")
			}
			if r := send(); r.status != http.StatusOK {
				t.Fatalf("status %d", r.status)
			}
			all := ev.await(t, func(all []event.Decision) bool { return settlements(all) == 1 })
			s := all[len(all)-1]
			if s.Mode != event.ModeSettlement || s.Reserved != 300 || s.Settled != 42 {
				t.Fatalf("settlement %+v, want 300 reserved, 42 settled", s)
			}
			r := send()
			rl := r.header.Get(hRateLimit)
			switch policy {
			case FailLocal:
				// 1000 - 42 settled - 300 reserved now.
				if !strings.Contains(rl, `"tokens";r=658;`) {
					t.Errorf("local fallback after a settlement of 42: RateLimit %q, want tokens r=658", rl)
				}
				// (a streamed answer is settled before its end: both are)
				if n := counter(t, gw.m.settlements.WithLabelValues("ok")); n != 2 {
					t.Errorf("settlements{ok} = %v, want 2", n)
				}
			case FailOpen:
				if n := counter(t, gw.m.settlements.WithLabelValues("unchecked")); n != 2 {
					t.Errorf("settlements{unchecked} = %v, want 2", n)
				}
			}
		})
	}
}
