package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestPrintKeyEntry(t *testing.T) {
	tests := []struct {
		name, give, id, plan string
		want, wantErr        string
	}{
		{"echo's newline", "test\n", "acme", "standard",
			"- {id: acme, sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08, plan: standard}\n", ""},
		{"default id, no plan", "test", "", "",
			"- {id: 9f86d081884c7d65, sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08, plan: PLAN}  # PLAN: one of plans (or -key-plan)\n", ""},
		{"empty", "\n", "", "", "", "no key on stdin"},
		{"two keys", "a\nb\n", "", "", "", "whitespace"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out strings.Builder
			err := printKeyEntry(strings.NewReader(tt.give), &out, tt.id, tt.plan)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("printKeyEntry(%q) = %v, want an error saying %q", tt.give, err, tt.wantErr)
				}
				return
			}
			if err != nil || out.String() != tt.want {
				t.Errorf("printKeyEntry(%q) = %q, %v, want %q", tt.give, out.String(), err, tt.want)
			}
		})
	}
}

// TestHashKeyEntryAdmitsTheKey: the line `gateway -hash-key` prints, pasted
// into api_keys, makes a gateway admit that key and only that key.
func TestHashKeyEntryAdmitsTheKey(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdin := os.Stdin
	os.Stdin = r
	defer func() { os.Stdin = stdin }()
	go func() { w.WriteString("s3cret-key-of-acme\n"); w.Close() }()
	var entry strings.Builder
	if err := run(t.Context(), []string{"-hash-key", "-key-id", "acme", "-key-plan", "free"}, env(nil), &entry); err != nil {
		t.Fatalf("run -hash-key: %v", err)
	}
	os.Stdin = stdin

	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer up.Close()
	path := filepath.Join(t.TempDir(), "gw.yaml")
	cfg := fmt.Sprintf(configTmpl, 100, up.URL, true) + "unknown_key: reject\napi_keys:\n  " + entry.String()
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	g := start(t, []string{"-config", path}, env(nil))
	for _, tc := range []struct {
		key  string
		want int
	}{{"s3cret-key-of-acme", 200}, {"another-key", 401}} {
		req, _ := http.NewRequest(http.MethodGet, g.addr+"/", nil)
		req.Header.Set("X-API-Key", tc.key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("X-API-Key %s: %d, want %d (entry %q)", tc.key, resp.StatusCode, tc.want, entry.String())
		}
	}
}
