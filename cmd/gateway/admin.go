package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/edgelimit/edgelimit/gateway"
	"github.com/edgelimit/edgelimit/internal/boot"
)

const adminUsage = `usage: gateway admin key show|reset|clear [flags] (-api-key ID | -user ID | -ip ADDR) [-route NAME | -plan NAME]

  show    the key's live limiter state for every rule set it can hit (or
          -route's), with the split and NAT directives in force for it
  reset   refill those rule sets to full (audited: log line and event)
  clear   delete the key's limiter state (audited)

The token is read from EDGELIMIT_ADMIN_TOKEN (or, like every secret, from
the file its _FILE variable names), never from a flag, so it stays out of
shell history and process lists.
`

// runAdmin is "gateway admin key ...": a client of a running gateway's key
// admin API, printing its JSON answer.
func runAdmin(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	if len(args) < 2 || args[0] != "key" {
		fmt.Fprint(stdout, adminUsage)
		return errors.New("gateway admin: want key show|reset|clear")
	}
	action := args[1]
	method, path := http.MethodPost, gateway.AdminPath+"/"+action
	switch action {
	case "show":
		method, path = http.MethodGet, gateway.AdminPath
	case "reset", "clear":
	default:
		fmt.Fprint(stdout, adminUsage)
		return fmt.Errorf("gateway admin key: unknown action %q, want show, reset or clear", action)
	}
	fs := flag.NewFlagSet("gateway admin key "+action, flag.ContinueOnError)
	fs.SetOutput(stdout)
	fs.Usage = func() { fmt.Fprint(stdout, adminUsage); fs.PrintDefaults() }
	addr := fs.String("admin", "http://127.0.0.1:9090", "the gateway's admin listener (admin_listen)")
	apiKey := fs.String("api-key", "", "the API key's configured id (api_keys[].id), never the key itself")
	user := fs.String("user", "", "a user id, as the user header carries it")
	ip := fs.String("ip", "", "a client address")
	route := fs.String("route", "", "only the rule set this route checks; default every rule set")
	plan := fs.String("plan", "", "only the bucket POST /v1/check keeps for this plan (its \"plan\" field)")
	timeout := fs.Duration("timeout", 10*time.Second, "how long to wait for the gateway")
	if err := fs.Parse(args[2:]); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("gateway admin key %s: unexpected arguments %q", action, fs.Args())
	}
	env := boot.NewEnv(getenv)
	var token boot.Secret
	env.Secret(&token, "EDGELIMIT_ADMIN_TOKEN")
	if err := env.Err(); err != nil {
		return err
	}
	if token == "" {
		return errors.New("gateway admin: set EDGELIMIT_ADMIN_TOKEN (or its _FILE variable) to the gateway's admin token")
	}
	q := url.Values{}
	for name, v := range map[string]string{"api_key": *apiKey, "user": *user, "ip": *ip, "route": *route, "plan": *plan} {
		if v != "" {
			q.Set(name, v)
		}
	}
	base := strings.TrimSuffix(*addr, "/")
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, base+path+"?"+q.Encode(), nil)
	if err != nil {
		return fmt.Errorf("gateway admin: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+string(token))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("gateway admin: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return fmt.Errorf("gateway admin: read the answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		var p struct{ Title, Detail string }
		if json.Unmarshal(body, &p) == nil && p.Detail != "" {
			return fmt.Errorf("gateway admin: %s: %s", resp.Status, p.Detail)
		}
		return fmt.Errorf("gateway admin: %s", resp.Status)
	}
	_, err = stdout.Write(body)
	return err
}
