package boot

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
)

// ParseLevel reads a log_level setting: debug, info, warn or error (any
// case); empty is info.
func ParseLevel(s string) (slog.Level, error) {
	if s == "" {
		return slog.LevelInfo, nil
	}
	var l slog.Level
	if err := l.UnmarshalText([]byte(strings.ToUpper(s))); err != nil {
		return 0, fmt.Errorf("log_level %q: want debug, info, warn or error", s)
	}
	return l, nil
}

// NewLogger returns the process's JSON logger at level (see ParseLevel).
// Attributes are snake_case; an error goes under the key "error" and a
// duration in milliseconds under a key ending in "_ms".
func NewLogger(w io.Writer, level string) (*slog.Logger, error) {
	l, err := ParseLevel(level)
	if err != nil {
		return nil, err
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: l})), nil
}

// atLeast drops records below min, so a chatty library logs only what
// matters whatever the process's level.
type atLeast struct {
	slog.Handler
	min slog.Level
}

func (h atLeast) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.min && h.Handler.Enabled(ctx, l)
}

func (h atLeast) WithAttrs(as []slog.Attr) slog.Handler {
	return atLeast{h.Handler.WithAttrs(as), h.min}
}

func (h atLeast) WithGroup(name string) slog.Handler {
	return atLeast{h.Handler.WithGroup(name), h.min}
}
