package limiter

import (
	"strings"
	"testing"
)

func TestIPKey(t *testing.T) {
	tests := []struct {
		give   string
		want   string
		wantOK bool
	}{
		{"192.0.2.7", "ip:192.0.2.7", true},
		{"::ffff:192.0.2.7", "ip:192.0.2.7", true},
		{"2001:db8:1:2:3:4:5:6", "ip:2001:db8:1:2::/64", true},
		{"2001:db8:1:2::ffff", "ip:2001:db8:1:2::/64", true},
		{"2001:db8:1:2::", "ip:2001:db8:1:2::/64", true},
		{"fe80::1%eth0", "ip:fe80::/64", true},
		{"", "", false},
		{"not an ip", "", false},
	}
	for _, tt := range tests {
		got, ok := IPKey(tt.give)
		if got != tt.want || ok != tt.wantOK {
			t.Errorf("IPKey(%q) = %q, %v, want %q, %v", tt.give, got, ok, tt.want, tt.wantOK)
		}
	}
}

func TestUserKey(t *testing.T) {
	if got := UserKey("alice@example.com"); got != "u:alice@example.com" {
		t.Errorf("UserKey(plain) = %q", got)
	}
	for _, u := range []string{"a}b{c", strings.Repeat("x", 500), "with space"} {
		if got := UserKey(u); !strings.HasPrefix(got, "u#") || len(got) != 34 {
			t.Errorf("UserKey(%.20q) = %q, want a hashed key", u, got)
		}
	}
}

func TestDirectiveKey(t *testing.T) {
	if got, want := DirectiveKey("api_key", "abc"), "api_key:abc"; got != want {
		t.Errorf("DirectiveKey = %q, want %q", got, want)
	}
}
