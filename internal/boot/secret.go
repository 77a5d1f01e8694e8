package boot

import (
	"encoding/json"
	"log/slog"
)

// redacted is what a set Secret prints as, everywhere.
const redacted = "[redacted]"

// Secret is a string that never prints: fmt (%v, %+v, %s, %#v), slog, JSON
// and YAML all see "[redacted]" (or "" when it is unset, so a printed
// configuration still shows whether it is set). Convert it with string(s)
// where the secret is used.
type Secret string

// String redacts the secret.
func (s Secret) String() string {
	if s == "" {
		return ""
	}
	return redacted
}

// GoString redacts the secret for %#v.
func (s Secret) GoString() string { return `"` + s.String() + `"` }

// LogValue redacts the secret in slog attributes.
func (s Secret) LogValue() slog.Value { return slog.StringValue(s.String()) }

// MarshalJSON redacts the secret.
func (s Secret) MarshalJSON() ([]byte, error) { return json.Marshal(s.String()) }

// MarshalYAML redacts the secret when a configuration is printed.
func (s Secret) MarshalYAML() (any, error) { return s.String(), nil }

// MarshalText redacts the secret for every text encoder.
func (s Secret) MarshalText() ([]byte, error) { return []byte(s.String()), nil }
