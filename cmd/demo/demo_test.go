package main

import (
	"crypto/sha256"
	"encoding/hex"
	"math"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/edgelimit/edgelimit/analytics"
	"github.com/edgelimit/edgelimit/gateway"
	"github.com/edgelimit/edgelimit/limiter"
)

// promise is how soon the README says the dashboard shows rejections, a
// hot-key split and NAT flags after DEMO_TRAFFIC=1 make run.
const promise = 2 * time.Minute

// margin is how far past each threshold the demo must be, so the
// randomness of the traffic (and a slow machine) does not hide it.
const margin = 1.5

// TestDemoThresholds holds deploy/demo's plans and analytics thresholds to
// the traffic generator's parameters (the mix in main.go, its default rate
// and the weights deploy/local/run.sh gives it), so that the demo keeps
// its promise: the hot key is allowed well above hot.min_rate and is
// split (its plan has no rule the gateway keeps out of splits, and two
// gateways carry it), no ordinary key is hot, every NAT-shared IP is
// flagged within the promise and no ordinary anonymous address is, and
// requests are denied.
func TestDemoThresholds(t *testing.T) {
	var gw gateway.Config
	readYAML(t, "../../deploy/demo/gateway.yaml", &gw)
	gw = gw.WithDefaults()
	var an struct {
		Hot analytics.HotConfig `yaml:"hot"`
		NAT analytics.NATConfig `yaml:"nat"`
	}
	readYAML(t, "../../deploy/demo/analytics.yaml", &an)
	cfg := analytics.Config{Hot: an.Hot, NAT: an.NAT}.WithDefaults()
	gateways, duration := runTraffic(t)

	rate := float64(defaultTrafficRate)
	plan := func(key string) gateway.Plan {
		t.Helper()
		sum := sha256.Sum256([]byte(key))
		for _, k := range gw.APIKeys {
			if k.SHA256 == hex.EncodeToString(sum[:]) {
				p, ok := gw.Plans[k.Plan]
				if !ok {
					t.Fatalf("key %s: no plan %q", k.ID, k.Plan)
				}
				return p
			}
		}
		t.Fatalf("deploy/demo/gateway.yaml has no api_keys entry for %q", key)
		return gateway.Plan{}
	}

	// The hot key: allowed for the whole demo at a rate that makes it hot,
	// while it sends more.
	hot := plan(demoHotKey)
	hotSent := rate * hotPercent / 100
	hotAllowed := min(hotSent, admits(hot, duration))
	if hotAllowed < margin*cfg.Hot.MinRate {
		t.Errorf("the hot key is allowed %.1f/s (sends %.0f/s), want at least %.1f × hot.min_rate %.0f/s: it never shows as hot",
			hotAllowed, hotSent, margin, cfg.Hot.MinRate)
	}
	if hotSent < margin*hotAllowed {
		t.Errorf("the hot key sends %.0f/s, allowed %.1f/s: want it denied for the dashboard's rejections", hotSent, hotAllowed)
	}
	for _, r := range hot.Rules {
		// split_max_period unset (0): every rule may split.
		if gw.SplitMaxPeriod > 0 && r.Period > gw.SplitMaxPeriod {
			t.Errorf("the hot key's rule %s (period %v) is longer than split_max_period %v: the gateways would never apply its split",
				r.Name, r.Period, gw.SplitMaxPeriod)
		}
	}
	if carrying := countNonZero(gateways); carrying < cfg.Hot.MinGateways {
		t.Errorf("traffic goes to %d gateways (weights %v), want at least hot.min_gateways %d for a split", carrying, gateways, cfg.Hot.MinGateways)
	}

	// The ordinary keys stay below either test, so the hot key is the split.
	keyedSent := rate * keyedPercent / 100 / float64(len(demoKeys))
	keyedAllowed := min(keyedSent, admits(plan(demoKeys[0]), promise))
	total := hotAllowed + keyedAllowed*float64(len(demoKeys))
	byShare := keyedAllowed >= cfg.Hot.ShareMinRate && cfg.Hot.MinShare > 0 && keyedAllowed/total >= cfg.Hot.MinShare
	if keyedAllowed*margin > cfg.Hot.MinRate || byShare {
		t.Errorf("an ordinary demo key is allowed %.1f/s: too close to hot.min_rate %.0f/s (or hot by share)", keyedAllowed, cfg.Hot.MinRate)
	}

	// NAT-shared IPs: enough allowed requests and distinct user agents
	// within the promise (or the NAT window, if shorter).
	anon, ok := gw.Plans[gw.AnonymousPlan]
	if !ok {
		t.Fatalf("deploy/demo/gateway.yaml: anonymous_plan %q is no plan", gw.AnonymousPlan)
	}
	span := min(promise, cfg.NAT.Window)
	natSent := rate * natPercent / 100 / float64(len(natIPs))
	natRequests := min(natSent, admits(anon, span)) * span.Seconds()
	if natRequests < margin*float64(cfg.NAT.MinRequests) {
		t.Errorf("a NAT-shared IP is allowed %.0f requests in %.0fs, want at least %.1f × nat.min_requests %d", natRequests, span.Seconds(), margin, cfg.NAT.MinRequests)
	}
	// The distinct agents expected among natRequests drawn from natUserAgents.
	agents := natUserAgents * (1 - math.Pow(1-1.0/natUserAgents, natRequests))
	if agents < margin*float64(cfg.NAT.MinDistinctUserAgents) {
		t.Errorf("a NAT-shared IP shows about %.0f user agents in %.0fs, want at least %.1f × nat.min_distinct_user_agents %d",
			agents, span.Seconds(), margin, cfg.NAT.MinDistinctUserAgents)
	}

	// Ordinary anonymous clients are not NATs.
	anonRequests := rate * (100 - hotPercent - keyedPercent - natPercent) / 100 / anonIPs * cfg.NAT.Window.Seconds()
	anonAgentsPerIP := float64(anonAgents) / anonIPs
	if anonRequests >= float64(cfg.NAT.MinRequests) && anonAgentsPerIP >= float64(cfg.NAT.MinDistinctUserAgents) {
		t.Errorf("an ordinary anonymous address sends %.0f requests with %.0f agents per NAT window: it would be flagged", anonRequests, anonAgentsPerIP)
	}
}

// admits is the least rate (per second) a plan admits to a caller that
// asks for more over the first d of a fresh start: the least, over its
// enforced rules, of what each admits in d. A token bucket admits its
// capacity and its refill; a sliding window its limit in every window.
func admits(p gateway.Plan, d time.Duration) float64 {
	r := math.Inf(1)
	for _, rule := range p.Rules {
		if rule.Shadow {
			continue
		}
		periods := d.Seconds() / rule.Period.Seconds()
		n := float64(rule.Limit) * max(1, math.Floor(periods))
		if rule.Algorithm != limiter.SlidingWindow {
			n = float64(rule.Capacity()) + float64(rule.Limit)*periods
		}
		r = min(r, n/d.Seconds())
	}
	return r
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

var trafficLineRE = regexp.MustCompile(`(?s)demo" traffic -gateway "([^"]+)"\s*\\?\s*-weights ([0-9,]+) -duration "\$\{DEMO_DURATION:-([0-9a-z]+)\}"`)

// runTraffic returns the weight of each gateway make run's demo traffic
// goes to, and how long it runs by default (deploy/local/run.sh).
func runTraffic(t *testing.T) ([]int, time.Duration) {
	t.Helper()
	b, err := os.ReadFile("../../deploy/local/run.sh")
	if err != nil {
		t.Fatal(err)
	}
	m := trafficLineRE.FindSubmatch(b)
	if m == nil {
		t.Fatal("deploy/local/run.sh: no demo traffic line with -gateway, -weights and -duration")
	}
	d, err := time.ParseDuration(string(m[3]))
	if err != nil {
		t.Fatalf("deploy/local/run.sh: DEMO_DURATION default %q: %v", m[3], err)
	}
	urls := strings.Split(string(m[1]), ",")
	ws := strings.Split(string(m[2]), ",")
	if len(urls) != len(ws) {
		t.Fatalf("deploy/local/run.sh: %d gateways, %d weights", len(urls), len(ws))
	}
	out := make([]int, len(ws))
	for i, w := range ws {
		n, err := strconv.Atoi(w)
		if err != nil {
			t.Fatalf("deploy/local/run.sh: weight %q: %v", w, err)
		}
		out[i] = n
	}
	return out, d
}

func countNonZero(ws []int) int {
	n := 0
	for _, w := range ws {
		if w > 0 {
			n++
		}
	}
	return n
}
