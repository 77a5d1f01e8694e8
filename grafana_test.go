package edgelimit_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.yaml.in/yaml/v3"

	"github.com/edgelimit/edgelimit/analytics"
	"github.com/edgelimit/edgelimit/consumer"
	"github.com/edgelimit/edgelimit/gateway"
	"github.com/edgelimit/edgelimit/gateway/publish"
	"github.com/edgelimit/edgelimit/internal/boot"
)

// metricInfo is what a registered metric family offers a query.
type metricInfo struct {
	labels    []string
	histogram bool
}

// describingRegistry registers on a real registry and remembers every
// family's name and labels from its descriptors, so that vectors without
// a child yet count too.
type describingRegistry struct {
	*prometheus.Registry
	metrics map[string]*metricInfo
}

var descRE = regexp.MustCompile(`^Desc\{fqName: "([^"]+)", .*constLabels: \{([^}]*)\}, variableLabels: \{([^}]*)\}\}$`)

func (r *describingRegistry) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc, 64)
	go func() { c.Describe(ch); close(ch) }()
	for d := range ch {
		m := descRE.FindStringSubmatch(d.String())
		if m == nil {
			continue
		}
		info := &metricInfo{}
		for _, lp := range strings.Split(m[2], ",") {
			if name, _, ok := strings.Cut(lp, "="); ok {
				info.labels = append(info.labels, name)
			}
		}
		for _, l := range strings.Split(m[3], ",") {
			if l = strings.TrimSuffix(strings.TrimPrefix(l, "c("), ")"); l != "" {
				info.labels = append(info.labels, l)
			}
		}
		r.metrics[m[1]] = info
	}
	return r.Registry.Register(c)
}

func (r *describingRegistry) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// fakeClickHouse satisfies consumer.New, which connects nothing.
type fakeClickHouse struct{ driver.Conn }

// registeredMetrics builds the gateway (with its publisher and franz-go's
// client metrics), the consumer and analytics' detector on one registry
// with the collectors every process has, as cmd/* wire them, and returns
// every metric family they register.
func registeredMetrics(t *testing.T) map[string]*metricInfo {
	t.Helper()
	// boot.NewRegistry: build info, Go and process collectors, as in cmd/*.
	reg := &describingRegistry{Registry: boot.NewRegistry(), metrics: map[string]*metricInfo{}}

	var cfg gateway.Config
	if err := yaml.Unmarshal([]byte(`
plans: {free: {rules: [{name: minute, limit: 10, period: 1m}]}}
anonymous_plan: free
upstreams: {app: {url: "http://127.0.0.1:1"}}
routes: [{name: all, path_prefix: /, upstream: app}]
`), &cfg); err != nil {
		t.Fatal(err)
	}
	pub, err := publish.New(publish.Config{Brokers: []string{"127.0.0.1:1"}, Opts: []kgo.Opt{boot.KafkaMetrics(reg)}}, reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		pub.Close(ctx)
	}()
	// The gateway takes a *prometheus.Registry itself, so its vectors show
	// only once they have series: two requests give them some (one allowed
	// to an unreachable upstream, one with an unknown API key).
	gw, err := gateway.New(cfg, gateway.Options{Registry: reg.Registry})
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()
	for _, key := range []string{"", "unknown-key"} {
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		if key != "" {
			req.Header.Set("X-API-Key", key)
		}
		gw.Server().Handler.ServeHTTP(httptest.NewRecorder(), req)
	}
	if _, err := consumer.New(consumer.Config{Brokers: []string{"127.0.0.1:1"}}, fakeClickHouse{}, reg, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := analytics.NewDetector(analytics.Config{}, analytics.Deps{Reader: analytics.NewReader(nil), Registry: reg}); err != nil {
		t.Fatal(err)
	}

	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if info, ok := reg.metrics[f.GetName()]; ok {
			info.histogram = f.GetType() == dto.MetricType_HISTOGRAM
		}
	}
	// Families registered past the recording (boot.NewRegistry's, the
	// gateway's), with the labels of their series.
	for _, f := range families {
		if _, ok := reg.metrics[f.GetName()]; !ok {
			info := &metricInfo{histogram: f.GetType() == dto.MetricType_HISTOGRAM}
			for _, m := range f.GetMetric() {
				for _, lp := range m.GetLabel() {
					info.labels = append(info.labels, lp.GetName())
				}
			}
			reg.metrics[f.GetName()] = info
		}
	}
	return reg.metrics
}

var (
	metricNameRE = regexp.MustCompile(`\bedgelimit_[a-zA-Z0-9_]+`)
	matcherRE    = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)\s*"`)
	groupingRE   = regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
	legendRE     = regexp.MustCompile(`\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}`)
)

// TestGrafanaDashboard: the shipped dashboard is valid JSON that Grafana
// can provision, and every query names metrics, and labels of them, that
// the code registers: a renamed metric or label fails here, not silently
// on a dashboard.
func TestGrafanaDashboard(t *testing.T) {
	metrics := registeredMetrics(t)
	for _, want := range []string{"edgelimit_gateway_decisions_total", "edgelimit_consumer_lag", "edgelimit_analytics_runs_total",
		"edgelimit_events_published_total", "edgelimit_build_info", "edgelimit_kafka_produce_bytes_total"} {
		if metrics[want] == nil {
			t.Fatalf("the registry lacks %s; registeredMetrics is not wiring what cmd/* wire", want)
		}
	}

	b, err := os.ReadFile("deploy/grafana/dashboards/edgelimit.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		UID        string `json:"uid"`
		Title      string `json:"title"`
		Templating struct {
			List []struct {
				Name string `json:"name"`
			} `json:"list"`
		} `json:"templating"`
		Panels []struct {
			ID         int                       `json:"id"`
			Type       string                    `json:"type"`
			Title      string                    `json:"title"`
			Datasource json.RawMessage           `json:"datasource"`
			GridPos    *struct{ H, W, X, Y int } `json:"gridPos"`
			Targets    []struct {
				RefID        string `json:"refId"`
				Expr         string `json:"expr"`
				LegendFormat string `json:"legendFormat"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("edgelimit.json is not valid JSON: %v", err)
	}
	if dash.UID == "" || dash.Title == "" {
		t.Errorf("dashboard uid %q, title %q: both are needed for provisioning and links", dash.UID, dash.Title)
	}
	var vars []string
	for _, v := range dash.Templating.List {
		vars = append(vars, v.Name)
	}

	ids := map[int]bool{}
	used := map[string]bool{}
	queries := 0
	for _, p := range dash.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d used twice", p.ID)
		}
		ids[p.ID] = true
		if p.GridPos == nil || p.GridPos.W == 0 || p.GridPos.X+p.GridPos.W > 24 {
			t.Errorf("panel %q: gridPos %+v is not within Grafana's 24 columns", p.Title, p.GridPos)
		}
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		if !strings.Contains(string(p.Datasource), "${datasource}") {
			t.Errorf("panel %q: datasource %s, want the ${datasource} variable", p.Title, p.Datasource)
		}
		refs := map[string]bool{}
		for _, q := range p.Targets {
			queries++
			if q.RefID == "" || refs[q.RefID] {
				t.Errorf("panel %q: refId %q missing or repeated", p.Title, q.RefID)
			}
			refs[q.RefID] = true
			checkQuery(t, p.Title, q.Expr, q.LegendFormat, metrics, vars, used)
		}
	}
	if queries < 20 {
		t.Errorf("only %d queries on the dashboard", queries)
	}
	// What the dashboard is for: the decision, store, event, ingestion,
	// analytics and directive metrics on-call reads first.
	for _, want := range []string{
		"edgelimit_gateway_decisions_total", "edgelimit_gateway_store_unavailable_total", "edgelimit_gateway_fail_open_total",
		"edgelimit_gateway_fail_closed_total", "edgelimit_gateway_circuit_state", "edgelimit_gateway_check_duration_seconds",
		"edgelimit_events_published_total", "edgelimit_events_dropped_total", "edgelimit_events_buffered",
		"edgelimit_consumer_lag", "edgelimit_consumer_rows_inserted_total", "edgelimit_consumer_dead_letters_total",
		"edgelimit_consumer_retries_total", "edgelimit_analytics_runs_total", "edgelimit_gateway_directives_applied_total",
		"edgelimit_build_info",
	} {
		if !used[want] {
			t.Errorf("no panel shows %s", want)
		}
	}
}

// checkQuery checks one PromQL expression against the registered metrics:
// every edgelimit_* name is registered (a _bucket, _sum or _count of a
// histogram), and every label it matches, groups by or puts in the legend
// is a label of one of them (or a target label).
func checkQuery(t *testing.T, panel, expr, legend string, metrics map[string]*metricInfo, vars []string, used map[string]bool) {
	t.Helper()
	if strings.Count(expr, "(") != strings.Count(expr, ")") || strings.Count(expr, "{") != strings.Count(expr, "}") {
		t.Errorf("panel %q: unbalanced brackets in %s", panel, expr)
	}
	labels := []string{"job", "instance", "le"}
	names := metricNameRE.FindAllString(expr, -1)
	if len(names) == 0 {
		t.Errorf("panel %q: %s names no edgelimit metric", panel, expr)
	}
	for _, n := range names {
		info := metrics[n]
		base := n
		if info == nil {
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				if b, ok := strings.CutSuffix(n, suffix); ok && metrics[b] != nil && metrics[b].histogram {
					info, base = metrics[b], b
				}
			}
		}
		if info == nil {
			t.Errorf("panel %q: %s is not a metric the code registers (query: %s)", panel, n, expr)
			continue
		}
		used[base] = true
		labels = append(labels, info.labels...)
	}
	var named []string
	for _, m := range matcherRE.FindAllStringSubmatch(expr, -1) {
		named = append(named, m[1])
	}
	for _, m := range groupingRE.FindAllStringSubmatch(expr, -1) {
		for _, l := range strings.Split(m[1], ",") {
			named = append(named, strings.TrimSpace(l))
		}
	}
	for _, m := range legendRE.FindAllStringSubmatch(legend, -1) {
		named = append(named, m[1])
	}
	for _, l := range named {
		if l != "" && !slices.Contains(labels, l) {
			t.Errorf("panel %q: label %q is not a label of %v (query: %s)", panel, l, names, expr)
		}
	}
	for _, m := range regexp.MustCompile(`\$([a-zA-Z_]+)`).FindAllStringSubmatch(expr, -1) {
		if !strings.HasPrefix(m[1], "__") && !slices.Contains(vars, m[1]) {
			t.Errorf("panel %q: $%s is no dashboard variable (query: %s)", panel, m[1], expr)
		}
	}
}
