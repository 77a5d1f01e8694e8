package envoyrls

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRatelimitTestConfigs loads envoyproxy/ratelimit's own test
// configurations (test/config/*.yaml of its module, e.g. from the module
// cache after `go install github.com/envoyproxy/ratelimit/src/service_cmd`)
// and expects what its config_test.go expects: the valid files load, each
// invalid one is refused with ratelimit's message and the file's name.
// EDGELIMIT_RATELIMIT_SRC names the module's directory; without it the
// test skips (the files are ratelimit's, not copied here).
func TestRatelimitTestConfigs(t *testing.T) {
	src := os.Getenv("EDGELIMIT_RATELIMIT_SRC")
	if src == "" {
		t.Skip("EDGELIMIT_RATELIMIT_SRC not set: no envoyproxy/ratelimit source to test against")
	}
	dir := filepath.Join(src, "test", "config")
	load := func(names ...string) error {
		files := map[string][]byte{}
		for _, n := range names {
			b, err := os.ReadFile(filepath.Join(dir, n))
			if err != nil {
				t.Fatal(err)
			}
			files[n] = b
		}
		_, err := Parse(files)
		return err
	}
	// wildcard.yaml's mid-value '*' ("bar*b") is literal, as in ratelimit.
	if r, err := Parse(map[string][]byte{"w.yaml": mustRead(t, filepath.Join(dir, "wildcard.yaml"))}); err == nil {
		d := r.domains["test-domain"]
		for _, tc := range []struct {
			give []entry
			want bool
		}{
			{entries("wild", "foo1"), true},
			{entries("nestedWild", "val1", "wild", "goo2"), true},
			{entries("wild", "bar"), false},
			{entries("noWild", "foo1"), false},
			{entries("midWild", "barab"), false},
			{entries("midWild", "bar*b"), true},
			{entries("noVal", "foo1"), true},
		} {
			if _, ok, _, _ := d.match(tc.give); ok != tc.want {
				t.Errorf("wildcard.yaml: match(%v) = %v, want %v", tc.give, ok, tc.want)
			}
		}
	}
	// basic_config.yaml: what ratelimit's TestBasicConfig expects of it.
	if r, err := Parse(map[string][]byte{"b.yaml": mustRead(t, filepath.Join(dir, "basic_config.yaml"))}); err == nil {
		d := r.domains["test-domain"]
		for _, tc := range []struct {
			give []entry
			want string // "N/UNIT", "unlimited" or "" (no limit)
		}{
			{nil, ""},
			{entries("key1", "something"), ""},
			{entries("key1", "value1"), ""},
			{entries("key2", "value2", "subkey", "subvalue"), ""},
			{entries("key5", "value5", "subkey5", "subvalue"), ""},
			{entries("key1", "value1", "subkey1", "something"), "5/SECOND"},
			{entries("key1", "value1", "subkey1", "subvalue1"), "10/SECOND"},
			{entries("key2", "something"), "20/MINUTE"},
			{entries("key2", "value2"), "30/MINUTE"},
			{entries("key2", "value3"), ""},
			{entries("key3", "foo"), "1/HOUR"},
			{entries("key4", "foo"), "1/DAY"},
			{entries("key6", "foo"), "unlimited"},
			{entries("key7", "unspecified_value"), "70/MINUTE"},
			{entries("key7", "another_value"), "70/MINUTE"},
		} {
			got := ""
			if n, ok, _, _ := d.match(tc.give); ok {
				got = itoa(n.limit.requestsPerUnit) + "/" + n.limit.unit
				if n.limit.unlimited {
					got = "unlimited"
				}
			}
			if got != tc.want {
				t.Errorf("basic_config.yaml: match(%v) = %q, want %q", tc.give, got, tc.want)
			}
		}
	}
	for _, name := range []string{"basic_config.yaml", "shadowmode_config.yaml", "wildcard.yaml", "share_threshold.yaml", "merge_domain_key1.yaml", "merge_domain_key2.yaml"} {
		if err := load(name); err != nil {
			t.Errorf("%s: %v, want it loaded", name, err)
		}
	}
	for _, tc := range []struct {
		files []string
		want  string
	}{
		{[]string{"empty_domain.yaml"}, "empty_domain.yaml: config file cannot have empty domain"},
		{[]string{"basic_config.yaml", "duplicate_domain.yaml"}, "duplicate_domain.yaml: duplicate domain 'test-domain' in config file"},
		{[]string{"empty_key.yaml"}, "empty_key.yaml: descriptor has empty key"},
		{[]string{"duplicate_key.yaml"}, "duplicate_key.yaml: duplicate descriptor composite key 'test-domain.key1_value1'"},
		// MERGE_DOMAIN_CONFIG is not supported: a domain in two files is refused.
		{[]string{"merge_domain_key1.yaml", "merge_domain_key2.yaml"}, "duplicate domain"},
		{[]string{"bad_limit_unit.yaml"}, "bad_limit_unit.yaml: invalid rate limit unit 'foo'"},
		{[]string{"replaces_self.yaml"}, "replaces_self.yaml: replaces should not contain name of same descriptor"},
		{[]string{"replaces_empty.yaml"}, "replaces_empty.yaml: should not have an empty replaces entry"},
		{[]string{"bad_yaml.yaml"}, "bad_yaml.yaml: error loading config file"},
		{[]string{"misspelled_key.yaml"}, "misspelled_key.yaml: config error, unknown key 'ratelimit'"},
		{[]string{"misspelled_key2.yaml"}, "misspelled_key2.yaml: config error, unknown key 'requestsperunit'"},
		{[]string{"non_string_key.yaml"}, "non_string_key.yaml: config error, key is not of type string: 0.25"},
		{[]string{"non_map_list.yaml"}, "non_map_list.yaml: config error, yaml file contains list of type other than map: a"},
		{[]string{"unlimited_with_unit.yaml"}, "unlimited_with_unit.yaml: should not specify rate limit unit when unlimited"},
	} {
		err := load(tc.files...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error holding %q", tc.files, err, tc.want)
		}
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
