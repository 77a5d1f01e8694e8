package event

import (
	"fmt"
	"strconv"
)

// The names below are the wire contract's text form: the consumer writes them
// to ClickHouse and analysts filter on them, so they never change once
// released. Append new values; never renumber or rename.
var (
	keyKindNames     = [...]string{"unknown", "api_key", "user", "ip"}
	storeStatusNames = [...]string{"unknown", "ok", "unavailable", "timeout", "local_cache"}
	modeNames        = [...]string{"unknown", "enforced", "shadow", "fail_open", "fail_closed", "local_fallback", "admin", "accounting", "settlement"}
)

// String returns the kind's name: unknown, api_key, user or ip. A value this
// version does not know reads KeyKind(n).
func (k KeyKind) String() string {
	if int(k) < len(keyKindNames) {
		return keyKindNames[k]
	}
	return "KeyKind(" + strconv.Itoa(int(k)) + ")"
}

// String returns the status's name: unknown, ok, unavailable, timeout or
// local_cache. A value this version does not know reads StoreStatus(n).
func (s StoreStatus) String() string {
	if int(s) < len(storeStatusNames) {
		return storeStatusNames[s]
	}
	return "StoreStatus(" + strconv.Itoa(int(s)) + ")"
}

// String returns the mode's name: unknown, enforced, shadow, fail_open,
// fail_closed, local_fallback, admin or accounting. A value this version
// does not know reads Mode(n).
func (m Mode) String() string {
	if int(m) < len(modeNames) {
		return modeNames[m]
	}
	return "Mode(" + strconv.Itoa(int(m)) + ")"
}

// ParseKeyKind returns the KeyKind whose String is s.
func ParseKeyKind(s string) (KeyKind, error) {
	i, err := parseName(keyKindNames[:], s, "key kind")
	return KeyKind(i), err
}

// ParseStoreStatus returns the StoreStatus whose String is s.
func ParseStoreStatus(s string) (StoreStatus, error) {
	i, err := parseName(storeStatusNames[:], s, "store status")
	return StoreStatus(i), err
}

// ParseMode returns the Mode whose String is s.
func ParseMode(s string) (Mode, error) {
	i, err := parseName(modeNames[:], s, "mode")
	return Mode(i), err
}

func parseName(names []string, s, what string) (uint8, error) {
	for i, n := range names {
		if n == s {
			return uint8(i), nil
		}
	}
	return 0, fmt.Errorf("event: unknown %s %q", what, s)
}

// MarshalText implements encoding.TextMarshaler with String's names.
func (k KeyKind) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler with ParseKeyKind.
func (k *KeyKind) UnmarshalText(b []byte) (err error) {
	*k, err = ParseKeyKind(string(b))
	return err
}

// MarshalText implements encoding.TextMarshaler with String's names.
func (s StoreStatus) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler with ParseStoreStatus.
func (s *StoreStatus) UnmarshalText(b []byte) (err error) {
	*s, err = ParseStoreStatus(string(b))
	return err
}

// MarshalText implements encoding.TextMarshaler with String's names.
func (m Mode) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler with ParseMode.
func (m *Mode) UnmarshalText(b []byte) (err error) {
	*m, err = ParseMode(string(b))
	return err
}
