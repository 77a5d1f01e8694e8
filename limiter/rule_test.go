package limiter

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestValidate(t *testing.T) {
	ok := Rule{Name: "minute", Limit: 100, Period: time.Minute}
	tests := []struct {
		name  string
		key   string
		rules []Rule
		cost  int64
		want  error
	}{
		{"valid", "k", []Rule{ok}, 1, nil},
		{"empty key", "", []Rule{ok}, 1, ErrEmptyKey},
		{"oversized key", strings.Repeat("k", MaxKeyLen+1), []Rule{ok}, 1, ErrKeyTooLong},
		{"no rules", "k", nil, 1, ErrNoRules},
		{"too many rules", "k", make([]Rule, MaxRules+1), 1, ErrTooManyRules},
		{"zero cost", "k", []Rule{ok}, 0, ErrInvalidCost},
		{"negative cost", "k", []Rule{ok}, -1, ErrInvalidCost},
		{"zero limit", "k", []Rule{{Name: "a", Limit: 0, Period: time.Second}}, 1, ErrInvalidRule},
		{"negative limit", "k", []Rule{{Name: "a", Limit: -5, Period: time.Second}}, 1, ErrInvalidRule},
		{"zero period", "k", []Rule{{Name: "a", Limit: 1}}, 1, ErrInvalidRule},
		{"negative burst", "k", []Rule{{Name: "a", Limit: 1, Period: time.Second, Burst: -1}}, 1, ErrInvalidRule},
		{"unknown algorithm", "k", []Rule{{Name: "a", Limit: 1, Period: time.Second, Algorithm: "leaky"}}, 1, ErrInvalidRule},
		{"empty name", "k", []Rule{{Limit: 1, Period: time.Second}}, 1, ErrInvalidRule},
		{"name with brace", "k", []Rule{{Name: "a{b}", Limit: 1, Period: time.Second}}, 1, ErrInvalidRule},
		{"duplicate names", "k", []Rule{ok, ok}, 1, ErrInvalidRule},
		{"huge limit", "k", []Rule{{Name: "a", Limit: 1 << 40, Period: time.Second}}, 1, ErrInvalidRule},
		{"rule cost", "k", []Rule{{Name: "a", Limit: 1, Period: time.Second, Cost: MaxCost}}, 1, nil},
		{"give-back", "k", []Rule{{Name: "a", Limit: 1, Period: time.Second, Cost: -MaxCost}}, 1, nil},
		{"give-back above 2^53", "k", []Rule{{Name: "a", Limit: 1, Period: time.Second, Cost: -MaxCost - 1}}, 1, ErrInvalidRule},
		{"rule cost above 2^53", "k", []Rule{{Name: "a", Limit: 1, Period: time.Second, Cost: MaxCost + 1}}, 1, ErrInvalidRule},
	}
	stores := map[string]allower{"memory": NewMemory(nil, 0)}
	for _, tt := range tests {
		got := validate(tt.key, tt.rules, tt.cost)
		if tt.want != nil && !errors.Is(got, ErrInput) {
			t.Errorf("%s: validate() = %v, want it to wrap ErrInput", tt.name, got)
		}
		if !errors.Is(got, tt.want) {
			t.Errorf("%s: validate() = %v, want %v", tt.name, got, tt.want)
		}
		for sname, s := range stores {
			if _, got := s.Allow(context.Background(), tt.key, tt.rules, tt.cost); !errors.Is(got, tt.want) {
				t.Errorf("%s: %s Allow() error = %v, want %v", tt.name, sname, got, tt.want)
			}
		}
	}
}

func TestDecideBinding(t *testing.T) {
	minute := Rule{Name: "minute", Limit: 100, Period: time.Minute}
	hour := Rule{Name: "hour", Limit: 1000, Period: time.Hour}
	shadow := Rule{Name: "shadow", Limit: 1, Period: time.Hour, Shadow: true}
	tests := []struct {
		name        string
		give        []RuleResult
		wantAllowed bool
		wantBinding int
	}{
		{
			name:        "allowed: fewest remaining binds",
			give:        []RuleResult{{Rule: minute, Allowed: true, Remaining: 50}, {Rule: hour, Allowed: true, Remaining: 10}},
			wantAllowed: true, wantBinding: 1,
		},
		{
			name:        "denied: the denying rule binds",
			give:        []RuleResult{{Rule: minute, Allowed: false, RetryAfter: time.Second}, {Rule: hour, Allowed: true, Remaining: 0}},
			wantAllowed: false, wantBinding: 0,
		},
		{
			name:        "denied twice: longest wait binds",
			give:        []RuleResult{{Rule: minute, RetryAfter: time.Second}, {Rule: hour, RetryAfter: time.Minute}},
			wantAllowed: false, wantBinding: 1,
		},
		{
			name:        "shadow denial neither denies nor binds",
			give:        []RuleResult{{Rule: minute, Allowed: true, Remaining: 5}, {Rule: shadow, Allowed: false, RetryAfter: time.Hour}},
			wantAllowed: true, wantBinding: 0,
		},
		{
			name:        "shadow first, enforced rule still binds",
			give:        []RuleResult{{Rule: shadow, Allowed: true, Remaining: 0}, {Rule: minute, Allowed: true, Remaining: 5}},
			wantAllowed: true, wantBinding: 1,
		},
	}
	for _, tt := range tests {
		d := decide(tt.give)
		if d.Allowed != tt.wantAllowed || d.Binding != tt.wantBinding {
			t.Errorf("%s: decide() = allowed %v binding %d, want %v %d", tt.name, d.Allowed, d.Binding, tt.wantAllowed, tt.wantBinding)
		}
	}
}
