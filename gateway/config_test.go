package gateway

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/limiter"
	"go.yaml.in/yaml/v3"
)

func validConfig() Config {
	return Config{
		Plans: map[string]Plan{
			"free": {Rules: []Rule{{Rule: limiter.Rule{Name: "minute", Limit: 100, Period: time.Minute}}, {Rule: limiter.Rule{Name: "day", Limit: 5000, Period: 24 * time.Hour}}}},
			"pro":  {Rules: []Rule{{Rule: limiter.Rule{Name: "minute", Limit: 1000, Period: time.Minute}, FailurePolicy: FailLocal}}},
		},
		AnonymousPlan: "free",
		APIKeys:       []APIKey{{ID: "acme", SHA256: strings.Repeat("ab", 32), Plan: "pro", Overrides: map[string]Override{"minute": {Limit: 2000}}}},
		Upstreams:     map[string]Upstream{"app": {URL: "http://127.0.0.1:9000"}},
		Routes:        []Route{{PathPrefix: "/", Upstream: "app"}, {PathPrefix: "/v1/export", Methods: []string{"POST"}, Upstream: "app", Cost: 10}},
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		give func(*Config)
		want string // substring of the error; "" means valid
	}{
		{"valid", func(*Config) {}, ""},
		{"no plans", func(c *Config) { c.Plans = nil }, "plans: at least one plan"},
		{"empty plan", func(c *Config) { c.Plans["x"] = Plan{} }, "plans.x.rules: a plan needs at least one rule"},
		{"bad rule", func(c *Config) {
			c.Plans["x"] = Plan{Rules: []Rule{{Rule: limiter.Rule{Name: "r", Limit: 0, Period: time.Second}}}}
		}, "plans.x.rules[0]: limiter: invalid rule \"r\": limit 0"},
		{"rule name with quote", func(c *Config) {
			c.Plans["x"] = Plan{Rules: []Rule{{Rule: limiter.Rule{Name: `a"b`, Limit: 1, Period: time.Second}}}}
		}, "plans.x.rules[0].name"},
		{"duplicate rule", func(c *Config) {
			c.Plans["x"] = Plan{Rules: []Rule{{Rule: limiter.Rule{Name: "a", Limit: 1, Period: time.Second}}, {Rule: limiter.Rule{Name: "a", Limit: 2, Period: time.Second}}}}
		}, "duplicate rule \"a\""},
		{"bad algorithm", func(c *Config) {
			c.Plans["x"] = Plan{Rules: []Rule{{Rule: limiter.Rule{Name: "a", Limit: 1, Period: time.Second, Algorithm: "leaky"}}}}
		}, "unknown algorithm"},
		{"bad rule policy", func(c *Config) {
			c.Plans["x"] = Plan{Rules: []Rule{{Rule: limiter.Rule{Name: "a", Limit: 1, Period: time.Second}, FailurePolicy: "maybe"}}}
		}, "plans.x.rules[0].failure_policy"},
		{"h2c upgrade", func(c *Config) { c.Routes[0].Upgrades = []string{"websocket", "H2C"} }, "routes[0].upgrades[1]: h2c would tunnel"},
		{"unknown anonymous plan", func(c *Config) { c.AnonymousPlan = "gold" }, "anonymous_plan: unknown plan \"gold\""},
		{"user header without plan", func(c *Config) { c.AnonymousPlan = ""; c.UserHeader = "X-User-ID" }, "user_plan: a plan is needed"},
		{"unknown key anonymous without plan", func(c *Config) { c.AnonymousPlan = ""; c.UnknownKey = UnknownKeyAnonymous }, "unknown_key"},
		{"bad unknown key", func(c *Config) { c.UnknownKey = "ignore" }, "unknown_key: \"ignore\""},
		{"empty key param", func(c *Config) { c.APIKeyParams = []string{""} }, "api_key_params[0]"},
		{"key param with separator", func(c *Config) { c.APIKeyParams = []string{"key", "a&b"} }, "api_key_params[1]"},
		{"key param with escape", func(c *Config) { c.APIKeyParams = []string{"a%5F"} }, "api_key_params[0]"},
		{"no key params beside others", func(c *Config) { c.APIKeyParams = []string{"-", "api_key"} }, "api_key_params[0]"},
		{"no key params", func(c *Config) { c.APIKeyParams = []string{"-"} }, ""},
		{"short sha", func(c *Config) { c.APIKeys[0].SHA256 = "abc" }, "api_keys[0].sha256: want 64 hex digits"},
		{"raw key instead of hash", func(c *Config) { c.APIKeys[0].SHA256 = strings.Repeat("z", 64) }, "api_keys[0].sha256"},
		{"duplicate key", func(c *Config) {
			c.APIKeys = append(c.APIKeys, APIKey{ID: "b", SHA256: strings.Repeat("AB", 32), Plan: "free"})
		}, "api_keys[1].sha256: same key as api_keys[0]"},
		{"duplicate key id", func(c *Config) {
			c.APIKeys = append(c.APIKeys, APIKey{ID: "acme", SHA256: strings.Repeat("cd", 32), Plan: "free"})
		}, "api_keys[1].id"},
		{"key without plan", func(c *Config) { c.APIKeys[0].Plan = "" }, "api_keys[0].plan: a plan is needed"},
		// Parts of limiter keys: longer ones could make a key the limiter
		// refuses (a 500), at once or when a split adds the gateway's id.
		{"longest key id", func(c *Config) { c.APIKeys[0].ID = strings.Repeat("k", 128) }, ""},
		{"key id too long", func(c *Config) { c.APIKeys[0].ID = strings.Repeat("k", 129) }, "api_keys[0].id: 129 bytes, at most 128"},
		{"plan name too long", func(c *Config) {
			c.Plans[strings.Repeat("p", 129)] = c.Plans["free"]
		}, "plans." + strings.Repeat("p", 129) + ": a plan name is at most 128 bytes"},
		{"override of unknown rule", func(c *Config) { c.APIKeys[0].Overrides = map[string]Override{"hour": {Limit: 1}} }, "api_keys[0].overrides.hour: plan \"pro\" has no rule"},
		{"override makes rule invalid", func(c *Config) { c.APIKeys[0].Overrides = map[string]Override{"minute": {Limit: -1}} }, "api_keys[0].overrides.minute"},
		{"bad trusted proxy", func(c *Config) { c.TrustedProxies = []string{"10.0.0.0/8", "lan"} }, "trusted_proxies[1]"},
		{"single trusted ip", func(c *Config) { c.TrustedProxies = []string{"10.1.2.3", "::1"} }, ""},
		{"no routes", func(c *Config) { c.Routes = nil }, "routes: at least one route"},
		{"relative prefix", func(c *Config) { c.Routes[0].PathPrefix = "v1" }, "routes[0].path_prefix"},
		{"unknown upstream", func(c *Config) { c.Routes[0].Upstream = "db" }, "routes[0].upstream: unknown upstream \"db\""},
		{"unknown route plan", func(c *Config) { c.Routes[0].Plan = "gold" }, "routes[0].plan"},
		{"negative cost", func(c *Config) { c.Routes[0].Cost = -1 }, "routes[0].cost"},
		{"bad method", func(c *Config) { c.Routes[1].Methods = []string{"PO ST"} }, "routes[1].methods"},
		{"duplicate route", func(c *Config) {
			c.Routes = append(c.Routes, Route{Name: "again", PathPrefix: "/v1/export/", Methods: []string{"post"}, Upstream: "app"})
		}, "routes[2]: same path prefix and method as routes[1]"},
		{"duplicate route name", func(c *Config) { c.Routes[1].Name = "/" }, "routes[1].name"},
		{"route name with brace", func(c *Config) { c.Routes[1].Name = "a{b}" }, "routes[1].name"},
		{"upstream scheme", func(c *Config) { c.Upstreams["app"] = Upstream{URL: "ftp://x"} }, "upstreams.app.url"},
		{"upstream no host", func(c *Config) { c.Upstreams["app"] = Upstream{URL: "http://"} }, "has no host"},
		{"upstream timeout above write", func(c *Config) { c.Upstreams["app"] = Upstream{URL: "http://x", Timeout: 2 * time.Minute} }, "must be shorter than timeouts.write"},
		{"bad policy", func(c *Config) { c.FailurePolicy = "sometimes" }, "failure_policy"},
		{"negative gateways", func(c *Config) { c.ExpectedGateways = -2 }, "expected_gateways"},
		{"deadline in seconds", func(c *Config) { c.StoreDeadline = 10 * time.Second }, "store_deadline"},
		{"deadline too short", func(c *Config) { c.StoreDeadline = time.Microsecond }, "store_deadline"},
		{"breaker", func(c *Config) { c.Breaker.Failures = -1 }, "breaker.failures"},
		{"negative jitter", func(c *Config) { c.RetryJitter = -time.Second }, "retry_jitter"},
		{"header limit", func(c *Config) { c.MaxHeaderBytes = 100 }, "max_header_bytes"},
		{"body limit", func(c *Config) { c.MaxBodyBytes = -1 }, "max_body_bytes"},
		{"check path", func(c *Config) { c.CheckPath = "check" }, "check_path"},
		{"check disabled", func(c *Config) { c.CheckPath = "-" }, ""},
		{"gateway id with brace", func(c *Config) { c.GatewayID = "gw{1}" }, "gateway_id"},
		{"gateway id of the others' share", func(c *Config) { c.GatewayID = "*" }, "gateway_id"},
		{"gateway id", func(c *Config) { c.GatewayID = "gw-1.eu" }, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := validConfig()
			tt.give(&c)
			err := c.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("Validate() = %v, want nil", err)
			case tt.want != "" && err == nil:
				t.Errorf("Validate() = nil, want an error containing %q", tt.want)
			case tt.want != "" && !strings.Contains(err.Error(), tt.want):
				t.Errorf("Validate() = %v, want it to contain %q", err, tt.want)
			case err != nil && !errors.Is(err, ErrInvalidConfig):
				t.Errorf("Validate() = %v, want it to wrap ErrInvalidConfig", err)
			}
		})
	}
}

func TestConfigValidateReportsAll(t *testing.T) {
	c := validConfig()
	c.AnonymousPlan = "gold"
	c.Routes[0].Upstream = "db"
	err := c.Validate()
	if err == nil || !strings.Contains(err.Error(), "anonymous_plan") || !strings.Contains(err.Error(), "routes[0].upstream") {
		t.Errorf("Validate() = %v, want both problems", err)
	}
}

func TestConfigDefaults(t *testing.T) {
	c := validConfig().WithDefaults()
	if c.StoreDeadline != 25*time.Millisecond || c.FailurePolicy != FailOpen || c.ExpectedGateways != 1 ||
		c.AdminListen != "127.0.0.1:9090" || c.UnknownKey != UnknownKeyReject || c.Routes[0].Cost != 1 ||
		c.Routes[0].Name != "/" || c.Upstreams["app"].Timeout != 30*time.Second || c.Timeouts.ReadHeader == 0 {
		t.Errorf("WithDefaults() = %+v", c)
	}
	// Defaults must not write through to the caller's maps and slices.
	orig := validConfig()
	_ = orig.WithDefaults()
	if orig.Routes[0].Cost != 0 || orig.Upstreams["app"].Timeout != 0 {
		t.Errorf("WithDefaults changed its receiver's routes or upstreams")
	}
}

func TestSecretRedacted(t *testing.T) {
	s := Secret("hunter2")
	if got := s.String(); got != "[redacted]" {
		t.Errorf("String() = %q", got)
	}
	if v, _ := s.MarshalYAML(); v != "[redacted]" {
		t.Errorf("MarshalYAML() = %v", v)
	}
}

// TestPasswordsInURLsRedacted: -check and validation errors never show a
// password inside an upstream URL (issue 9), in its user info or its
// query (a token the upstream wants there).
func TestPasswordsInURLsRedacted(t *testing.T) {
	for _, raw := range []string{"http://svc:s3cret-pw@upstream:8080/", "ftp://svc:s3cret-pw@upstream/", "http://svc:s3cret-pw@%zz/",
		"http://upstream:8080/?access_token=s3cret-pw", "ftp://upstream/?a=1;key=s3cret-pw", "http://svc:s3cret-pw@%zz/?t=s3cret-pw#x=s3cret-pw"} {
		cfg := validConfig()
		cfg.Upstreams = map[string]Upstream{"app": {URL: raw}}
		out, err := yaml.Marshal(cfg)
		if err != nil {
			t.Fatal(err)
		}
		msg := ""
		if err := cfg.Validate(); err != nil {
			msg = err.Error()
		}
		if strings.Contains(string(out), "s3cret-pw") || strings.Contains(msg, "s3cret-pw") {
			t.Errorf("URL %q: password shown in YAML %q or error %q", raw, out, msg)
		}
	}
}
