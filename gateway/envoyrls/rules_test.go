package envoyrls

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// readmeExamples are the configuration examples of envoyproxy/ratelimit's
// README ("Examples" 1–11), as they are written there.
var readmeExamples = map[string]string{
	"example1.yaml": `
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500

  - key: database
    value: default
    rate_limit:
      unit: second
      requests_per_unit: 500
`,
	"example2.yaml": `
domain: messaging
descriptors:
  # Only allow 5 marketing messages a day
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5

  # Only allow 100 messages a day to any unique phone number
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
`,
	"example3.yaml": `
domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10

  # Black list IP
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0
`,
	"example4.yaml": `
domain: example4
descriptors:
  - key: key
    value: value
    descriptors:
      - key: subkey
        rate_limit:
          requests_per_unit: 300
          unit: second
`,
	"example4-nomatch.yaml": `
domain: example4-nomatch
descriptors:
  - key: key
    value: value
    rate_limit:
      requests_per_unit: 300
      unit: second
`,
	"example5.yaml": `
domain: internal
descriptors:
  - key: ldap
    rate_limit:
      unlimited: true

  - key: azure
    rate_limit:
      unit: minute
      requests_per_unit: 100
`,
	"example6.yaml": `
domain: example6
descriptors:
  - key: service
    descriptors:
      - key: user
        value: user-a
        rate_limit:
          requests_per_unit: 10
          unit: second
        shadow_mode: true
      - key: user
        value: user-b
        rate_limit:
          requests_per_unit: 20
          unit: second
`,
	"example7.yaml": `
domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          name: specific_limit
          requests_per_unit: 5
          unit: second
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 10
          unit: second
`,
	"example8.yaml": `
domain: example8
descriptors:
  - key: key1
    detailed_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: key1
    value: value1
    rate_limit:
      unit: minute
      requests_per_unit: 20
`,
	"example10.yaml": `
domain: example10
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit:
              unit: minute
              requests_per_unit: 60
`,
	"example11.yaml": `
domain: example11
descriptors:
  # With share_threshold: true, all files/* matches share the same threshold
  - key: files
    value: files/*
    share_threshold: true
    rate_limit:
      unit: hour
      requests_per_unit: 10

  # Without share_threshold, each files_no_share/* match has its own isolated threshold
  - key: files_no_share
    value: files_no_share/*
    share_threshold: false
    rate_limit:
      unit: hour
      requests_per_unit: 10
`,
	"example9.yaml": `
domain: example9
descriptors:
  - key: key1
    value: value*
    rate_limit:
      unit: minute
      requests_per_unit: 20
`,
}

func parseExamples(t *testing.T) *Rules {
	t.Helper()
	files := map[string][]byte{}
	for name, body := range readmeExamples {
		files[name] = []byte(body)
	}
	r, err := Parse(files)
	if err != nil {
		t.Fatalf("Parse(README examples): %v", err)
	}
	return r
}

func entries(kv ...string) []entry {
	var out []entry
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, entry{kv[i], kv[i+1]})
	}
	return out
}

// TestReadmeExamplesMatch is a conformance table: what the README says
// each example's descriptors get.
func TestReadmeExamplesMatch(t *testing.T) {
	r := parseExamples(t)
	for _, tc := range []struct {
		name   string
		domain string
		give   []entry
		// want is "N/UNIT" (plus " shadow", " unlimited"), or "" for none.
		want string
	}{
		{"1: users", "mongo_cps", entries("database", "users"), "500/SECOND"},
		{"1: default", "mongo_cps", entries("database", "default"), "500/SECOND"},
		{"1: other value", "mongo_cps", entries("database", "other"), ""},
		{"2: marketing to a number", "messaging", entries("message_type", "marketing", "to_number", "2061111111"), "5/DAY"},
		{"2: any number", "messaging", entries("to_number", "2061111111"), "100/DAY"},
		{"2: placeholder alone", "messaging", entries("message_type", "marketing"), ""},
		{"3: any address", "edge_proxy_per_ip", entries("remote_address", "50.0.0.1"), "10/SECOND"},
		{"3: most specific match", "edge_proxy_per_ip", entries("remote_address", "50.0.0.5"), "0/SECOND"},
		{"4: same depth", "example4", entries("key", "value", "subkey", "subvalue"), "300/SECOND"},
		{"4: deeper request, no match", "example4-nomatch", entries("key", "value", "subkey", "subvalue"), ""},
		{"5: unlimited", "internal", entries("ldap", "x"), "0/ unlimited"},
		{"5: limited", "internal", entries("azure", "x"), "100/MINUTE"},
		{"6: shadow", "example6", entries("service", "auth-service", "user", "user-a"), "10/SECOND shadow"},
		{"6: enforced", "example6", entries("service", "auth-service", "user", "user-b"), "20/SECOND"},
		{"7: specific", "example7", entries("key_1", "value_1", "user", "bkthomps"), "5/SECOND"},
		{"7: replacing", "example7", entries("key_2", "value_2", "user", "bkthomps"), "10/SECOND"},
		{"8: unspecified value", "example8", entries("key1", "unspecified_value"), "10/MINUTE"},
		{"8: value1", "example8", entries("key1", "value1"), "20/MINUTE"},
		{"9: wildcard", "example9", entries("key1", "value_1"), "20/MINUTE"},
		{"9: wildcard 2", "example9", entries("key1", "value_2"), "20/MINUTE"},
		{"9: no prefix", "example9", entries("key1", "other"), ""},
		{"10: value_to_metric", "example10", entries("route", "api", "http_method", "GET", "subject_id", "123"), "60/MINUTE"},
		{"11: shared wildcard", "example11", entries("files", "files/a.pdf"), "10/HOUR"},
		{"11: isolated wildcard", "example11", entries("files_no_share", "files_no_share/a.pdf"), "10/HOUR"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := r.domains[tc.domain]
			if d == nil {
				t.Fatalf("no domain %q", tc.domain)
			}
			got := ""
			if n, ok, _, _ := d.match(tc.give); ok {
				l := n.limit
				got = strings.TrimSpace(itoa(l.requestsPerUnit) + "/" + l.unit + flag(l.shadow, " shadow") + flag(l.unlimited, " unlimited"))
			}
			if got != tc.want {
				t.Errorf("match(%s, %v) = %q, want %q", tc.domain, tc.give, got, tc.want)
			}
		})
	}
	// Example 7's replaces is kept for the request-level pass.
	n, _, _, _ := r.domains["example7"].match(entries("key_2", "value_2", "user", "bkthomps"))
	if len(n.limit.replaces) != 1 || n.limit.replaces[0] != "specific_limit" {
		t.Errorf("example7 replaces = %v, want [specific_limit]", n.limit.replaces)
	}
}

func itoa(n uint32) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}

func flag(b bool, s string) string {
	if b {
		return s
	}
	return ""
}

// TestRejectedFiles: what envoyproxy/ratelimit refuses is refused, with
// its message.
func TestRejectedFiles(t *testing.T) {
	for _, tc := range []struct {
		name, give, want string
	}{
		{"no domain", "descriptors: []\n", "config file cannot have empty domain"},
		{"empty file", "", "config file cannot have empty domain"},
		{"bad yaml", "domain: [\n", "error loading config file"},
		{"unknown key", "domain: d\ndescriptors:\n  - key: k\n    rate_limits: {}\n", "config error, unknown key 'rate_limits'"},
		{"unknown nested key", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, burst: 2}\n", "config error, unknown key 'burst'"},
		{"list of scalars", "domain: d\ndescriptors:\n  - k\n", "list of type other than map"},
		{"empty key", "domain: d\ndescriptors:\n  - value: v\n", "descriptor has empty key"},
		{"duplicate", "domain: d\ndescriptors:\n  - {key: k, value: v}\n  - {key: k, value: v}\n", "duplicate descriptor composite key 'd.k_v'"},
		{"bad unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n", "invalid rate limit unit 'fortnight'"},
		{"no unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {requests_per_unit: 1}\n", "invalid rate limit unit ''"},
		{"unlimited with unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: second}\n", "should not specify rate limit unit when unlimited"},
		{"empty replaces", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: ''}]}\n", "should not have an empty replaces entry"},
		{"replaces itself", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {name: a, unit: second, requests_per_unit: 1, replaces: [{name: a}]}\n", "replaces should not contain name of same descriptor"},
		{"share_threshold without a wildcard", "domain: d\ndescriptors:\n  - {key: k, value: v, share_threshold: true}\n", "share_threshold can only be used with wildcard values (ending with '*'), but found key 'k_v'"},
		{"negative limit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n", "error loading config file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(map[string][]byte{"bad.yaml": []byte(tc.give)})
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "bad.yaml") {
				t.Errorf("Parse(%q) = %v, want an error naming bad.yaml and %q", tc.give, err, tc.want)
			}
		})
	}
	_, err := Parse(map[string][]byte{"a.yaml": []byte("domain: d\n"), "b.yaml": []byte("domain: d\n")})
	if err == nil || !strings.Contains(err.Error(), "duplicate domain 'd' in config file") {
		t.Errorf("a domain in two files: %v, want refused", err)
	}
}

func TestLoadDirReadsYAMLFilesOnly(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a.yaml", "domain: a\n")
	write("b.yml", "domain: b\n")
	write("notes.txt", "not yaml at all: [")
	write(".hidden.yaml", "domain: [")
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	r, err := LoadDir(dir)
	if err != nil {
		t.Fatalf("LoadDir: %v", err)
	}
	if got := strings.Join(r.Domains(), ","); got != "a,b" {
		t.Errorf("domains %q, want a,b", got)
	}
	if _, err := LoadDir(filepath.Join(dir, "missing")); err == nil {
		t.Error("LoadDir(missing) succeeded")
	}
	before, ok := DirSum(dir)
	write("notes.txt", "other text") // not a file LoadDir reads
	if after, _ := DirSum(dir); !ok || string(after) != string(before) {
		t.Error("DirSum changed with a file LoadDir ignores")
	}
	write("a.yaml", "domain: a2\n")
	if after, _ := DirSum(dir); string(after) == string(before) {
		t.Error("DirSum did not change with a.yaml's content")
	}
	if _, ok := DirSum(filepath.Join(dir, "missing")); ok {
		t.Error("DirSum(missing) ok")
	}
}

func TestRuleNamesAreBounded(t *testing.T) {
	for _, tc := range []struct{ dom, path, want string }{
		{"test", "generic_key_three", "test.generic_key_three"},
		{"a b", `k_"v"`, "a_b.k__v_"},
	} {
		if got := ruleName(tc.dom, tc.path); got != tc.want {
			t.Errorf("ruleName(%q, %q) = %q, want %q", tc.dom, tc.path, got, tc.want)
		}
	}
	long := ruleName("domain", strings.Repeat("key_value.", 20))
	if len(long) != 64 || !strings.Contains(long, "~") {
		t.Errorf("long name %q (%d bytes), want 64 bytes ending in a hash", long, len(long))
	}
	if bucket("d", entries("a", "b")) == bucket("d", entries("a", "b", "", "")) || bucket("d", entries("ab", "")) == bucket("d", entries("a", "b")) {
		t.Error("buckets of different entries collide")
	}
}

func TestIdentityNamesTheWholeRequest(t *testing.T) {
	d := &domain{name: "d", tag: domainTag("d")}
	req := func(ds ...[]entry) []resolved {
		var out []resolved
		for _, e := range ds {
			out = append(out, resolved{entries: e})
		}
		return out
	}
	a := identity(d, req(entries("k", "v"), entries("x", "y")))
	if a != identity(d, req(entries("k", "v"), entries("x", "y"))) {
		t.Error("the same request has two identities")
	}
	if a == identity(d, req(entries("k", "v", "x", "y"))) {
		t.Error("one descriptor of two entries names the same identity as two descriptors of one")
	}
	if strings.Contains(a, "v") && strings.Contains(a, "y") && strings.Contains(a, "|k") {
		t.Errorf("identity %q holds the values", a)
	}
}
