package event

import (
	"encoding/json"
	"testing"
)

func TestEnumNames(t *testing.T) {
	tests := []struct {
		give fmtParser
		want string
	}{
		{give: KindUnknown, want: "unknown"},
		{give: KindAPIKey, want: "api_key"},
		{give: KindUser, want: "user"},
		{give: KindIP, want: "ip"},
		{give: StoreUnknown, want: "unknown"},
		{give: StoreOK, want: "ok"},
		{give: StoreUnavailable, want: "unavailable"},
		{give: StoreTimeout, want: "timeout"},
		{give: StoreLocalCache, want: "local_cache"},
		{give: ModeUnknown, want: "unknown"},
		{give: ModeEnforced, want: "enforced"},
		{give: ModeShadow, want: "shadow"},
		{give: ModeFailOpen, want: "fail_open"},
		{give: ModeFailClosed, want: "fail_closed"},
		{give: ModeLocalFallback, want: "local_fallback"},
	}
	for _, tt := range tests {
		if got := tt.give.String(); got != tt.want {
			t.Errorf("%T(%d).String() = %q, want %q", tt.give, tt.give, got, tt.want)
		}
		back, err := tt.give.parse(tt.want)
		if err != nil || back != tt.give {
			t.Errorf("parse %T %q = %v, %v; want %v", tt.give, tt.want, back, err, tt.give)
		}
	}
}

// fmtParser lets one table cover the three enums.
type fmtParser interface {
	String() string
	parse(string) (fmtParser, error)
}

func (KeyKind) parse(s string) (fmtParser, error)     { return ParseKeyKind(s) }
func (StoreStatus) parse(s string) (fmtParser, error) { return ParseStoreStatus(s) }
func (Mode) parse(s string) (fmtParser, error)        { return ParseMode(s) }

func TestEnumUnknown(t *testing.T) {
	if got := Mode(9).String(); got != "Mode(9)" {
		t.Errorf("Mode(9).String() = %q", got)
	}
	if got := KeyKind(200).String(); got != "KeyKind(200)" {
		t.Errorf("KeyKind(200).String() = %q", got)
	}
	if got := StoreStatus(5).String(); got != "StoreStatus(5)" {
		t.Errorf("StoreStatus(5).String() = %q", got)
	}
	for _, s := range []string{"", "Enforced", "fail-open", "Mode(9)"} {
		if _, err := ParseMode(s); err == nil {
			t.Errorf("ParseMode(%q) = nil error, want one", s)
		}
	}
}

func TestEnumJSON(t *testing.T) {
	type row struct {
		Kind  KeyKind
		Store StoreStatus
		Mode  Mode
	}
	give := row{KindIP, StoreLocalCache, ModeFailOpen}
	b, err := json.Marshal(give)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"Kind":"ip","Store":"local_cache","Mode":"fail_open"}`; string(b) != want {
		t.Errorf("json.Marshal = %s, want %s", b, want)
	}
	var got row
	if err := json.Unmarshal(b, &got); err != nil || got != give {
		t.Errorf("json.Unmarshal(%s) = %+v, %v; want %+v", b, got, err, give)
	}
	if err := json.Unmarshal([]byte(`{"Mode":"bogus"}`), &got); err == nil {
		t.Error("json.Unmarshal of an unknown mode = nil error, want one")
	}
}
