package boot

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// LoadYAML decodes the YAML file at path into dst strictly: a field dst
// does not have is an error naming its line, not a silently ignored typo.
// An empty path or an empty file leaves dst as it is.
func LoadYAML(path string, dst any) error {
	if path == "" {
		return nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read config: %w", err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(dst); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// Config is what Load needs of a process's file configuration T.
type Config[T any] interface {
	*T
	// ApplyEnv overrides the file from the environment.
	ApplyEnv(*Env) error
	// WithDefaults returns the configuration with its defaults set.
	WithDefaults() T
	// Validate joins every problem (errors.Join).
	Validate() error
}

// Load is every process's configuration contract, in this order: the file
// (strictly, see LoadYAML), the environment (which wins), the defaults,
// then Validate, which joins every problem found.
func Load[T any, PT Config[T]](path string, getenv func(string) string) (T, error) {
	var c T
	if err := LoadYAML(path, &c); err != nil {
		return c, err
	}
	if err := PT(&c).ApplyEnv(NewEnv(getenv)); err != nil {
		return c, err
	}
	c = PT(&c).WithDefaults()
	return c, PT(&c).Validate()
}

// PrintYAML writes cfg as YAML under a header line; Secret fields print
// redacted. It is what every process's "check" prints.
func PrintYAML(w io.Writer, header string, cfg any) error {
	out, err := yaml.Marshal(cfg)
	if err != nil {
		return fmt.Errorf("print config: %w", err)
	}
	_, err = fmt.Fprintf(w, "# %s\n%s", header, out)
	return err
}

// Env reads EDGELIMIT_* overrides: a variable that is set (non-empty) wins
// over the file. Bad values are collected; Err returns them all.
type Env struct {
	getenv func(string) string
	errs   []error
}

// NewEnv reads overrides through getenv (os.Getenv in main, a map in
// tests).
func NewEnv(getenv func(string) string) *Env { return &Env{getenv: getenv} }

// Lookup returns the variable's value, "" when unset.
func (e *Env) Lookup(name string) string { return e.getenv(name) }

// String sets *dst from name.
func (e *Env) String(dst *string, name string) {
	if v := e.getenv(name); v != "" {
		*dst = v
	}
}

// Secret sets *dst from name, or from the file named by name_FILE (a
// mounted secret; surrounding whitespace trimmed). Setting both is an
// error, and so is a file that holds nothing (or only whitespace): naming
// a file says the secret is in it, and an empty one is a mount gone wrong
// that would otherwise leave the secret unset without a word (no
// password, a random key_hash_secret, the admin API off).
func (e *Env) Secret(dst *Secret, name string) {
	v, file := e.getenv(name), e.getenv(name+"_FILE")
	switch {
	case v != "" && file != "":
		e.errs = append(e.errs, fmt.Errorf("set %s or %s_FILE, not both", name, name))
	case v != "":
		*dst = Secret(v)
	case file != "":
		s, err := readSecretFile(file)
		if err != nil {
			e.errs = append(e.errs, fmt.Errorf("%s_FILE: %w", name, err))
			return
		}
		*dst = s
	}
}

// maxSecretFile bounds what readSecretFile reads: a password, token or
// URL is far shorter, and a path mistaken for a secret's (/dev/zero, a
// log) must not be read whole into memory.
const maxSecretFile = 64 << 10

// readSecretFile is the secret in the file at path, trimmed. Its errors
// name the file, never its content.
func readSecretFile(path string) (Secret, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSecretFile+1))
	if err != nil {
		return "", err // a *PathError: "read PATH: is a directory"
	}
	if len(b) > maxSecretFile {
		return "", fmt.Errorf("%s is over %d KiB: not a secret's file", path, maxSecretFile>>10)
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	return Secret(s), nil
}

// List sets *dst from name, a comma-separated list; items are trimmed and
// empty ones dropped.
func (e *Env) List(dst *[]string, name string) {
	if v := e.getenv(name); v != "" {
		*dst = SplitList(v)
	}
}

// Int sets *dst from name.
func (e *Env) Int(dst *int, name string) { parseEnv(e, dst, name, strconv.Atoi) }

// IntPtr sets *dst to a new int from name, for settings whose zero differs
// from unset.
func (e *Env) IntPtr(dst **int, name string) {
	if e.getenv(name) == "" {
		return
	}
	var n int
	e.Int(&n, name)
	*dst = &n
}

// Bool sets *dst from name (true, false, 1, 0, ...).
func (e *Env) Bool(dst *bool, name string) { parseEnv(e, dst, name, strconv.ParseBool) }

// Duration sets *dst from name (Go syntax: 500ms, 2m).
func (e *Env) Duration(dst *time.Duration, name string) { parseEnv(e, dst, name, time.ParseDuration) }

// parseEnv sets *dst from name with parse, recording a bad value.
func parseEnv[T any](e *Env, dst *T, name string, parse func(string) (T, error)) {
	v := e.getenv(name)
	if v == "" {
		return
	}
	x, err := parse(v)
	if err != nil {
		e.errs = append(e.errs, fmt.Errorf("%s=%q: %w", name, v, err))
		return
	}
	*dst = x
}

// Fail records an error found while applying the environment.
func (e *Env) Fail(err error) { e.errs = append(e.errs, err) }

// Err joins every error met so far.
func (e *Env) Err() error { return errors.Join(e.errs...) }

// SplitList splits a comma-separated list, trimming items and dropping
// empty ones.
func SplitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
