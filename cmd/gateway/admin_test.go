package main

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestAdminCLINeverPrintsAddressSecrets: an -admin address with a password
// in its user info, or a query, is named in errors by scheme and host
// only; a query is refused rather than glued into the middle of the URL.
func TestAdminCLINeverPrintsAddressSecrets(t *testing.T) {
	const password = "hunter2-admin-proxy-password"
	refused := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = w.Write([]byte(`{"status":401,"detail":"Wrong admin token."}`))
	}))
	defer refused.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close() // a gateway that is down: the dial fails
	host := strings.TrimPrefix(refused.URL, "http://")
	getenv := env(map[string]string{"EDGELIMIT_ADMIN_TOKEN": "cli-admin-token-0123456789"})
	tests := []struct{ name, addr, want string }{
		{"401 through user info", "http://oncall:" + password + "@" + host, "401"},
		{"down, user info without a scheme", "oncall:" + password + "@" + closed, "connection refused"},
		{"a query", refused.URL + "/?token=" + password, "no query"},
		{"a fragment", refused.URL + "/#" + password, "no query or fragment"},
		{"not a URL", "http://oncall:" + password + "@[::1", "not host:port"},
	}
	for _, tt := range tests {
		var out strings.Builder
		err := run(context.Background(), []string{"admin", "key", "show", "-admin", tt.addr, "-ip", "127.0.0.1"}, getenv, &out)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want an error with %q", tt.name, err, tt.want)
			continue
		}
		if strings.Contains(err.Error()+out.String(), password) {
			t.Errorf("%s: the CLI printed the address's secret: %v %s", tt.name, err, out.String())
		}
	}
}

// TestAdminCLIFollowsNoRedirect: an -admin address that redirects (a
// proxy sending http to another port, or https to http) gets neither the
// token nor the request: the CLI stops with the redirect's scheme and host,
// rather than re-sending the token and reporting a reset that became a GET
// of the key's state as done.
func TestAdminCLIFollowsNoRedirect(t *testing.T) {
	const token = "cli-admin-token-0123456789"
	seen := make(chan string, 4)
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Method + " " + r.Header.Get("Authorization")
		_, _ = w.Write([]byte(`{"kind":"ip"}`))
	}))
	defer other.Close()
	for _, code := range []int{http.StatusMovedPermanently, http.StatusFound, http.StatusTemporaryRedirect} {
		redirecting := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, other.URL+r.URL.Path+"?secret-path-token="+token[:4], code)
		}))
		var out strings.Builder
		err := run(context.Background(), []string{"admin", "key", "reset", "-admin", redirecting.URL, "-ip", "127.0.0.1"},
			env(map[string]string{"EDGELIMIT_ADMIN_TOKEN": token}), &out)
		redirecting.Close()
		if err == nil || !strings.Contains(err.Error(), "redirected to "+other.URL+", not followed") {
			t.Errorf("reset through a %d: %v, want an error naming %s, not followed", code, err, other.URL)
		}
		if err != nil && strings.Contains(err.Error(), "secret-path-token") {
			t.Errorf("reset through a %d: the error shows the redirect's query: %v", code, err)
		}
		select {
		case got := <-seen:
			t.Errorf("reset through a %d: the redirect's target got %q, want nothing", code, got)
		default:
		}
	}
}
