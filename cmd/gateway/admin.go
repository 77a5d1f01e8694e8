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
	"strconv"
	"strings"
	"time"

	"github.com/edgelimit/edgelimit/gateway"
	"github.com/edgelimit/edgelimit/internal/boot"
)

const adminUsage = `usage: gateway admin key show|reset|clear [flags] (-api-key ID | -user ID | -ip ADDR) [-route NAME | -plan NAME]
       gateway admin key grant [flags] (-api-key ID | ...) -rule NAME -units N
       gateway admin key show|reset|clear [flags] -domain NAME -entry KEY=VALUE [-entry KEY=VALUE ...]

  show    the key's live limiter state for every rule set it can hit (or
          -route's), with the split and NAT directives in force for it
  reset   refill those rule sets to full (audited: log line and event)
  clear   delete the key's limiter state (audited)
  grant   give the key N more units of calendar rule -rule's current
          window (a negative N takes back what was granted, never below
          none); the grant ends with the window (audited)

With -domain and -entry (one Envoy descriptor's entries, in order), the
same for the bucket the gateway's Envoy rate limit service counts that
descriptor in under its configured limit; reset and clear both refill it.

With -admin listing every gateway of a fleet, each is asked in turn and
prints its answer (one JSON document each): a reset is stored in Redis
once, but a gateway forgets its cached denials of the key only when asked.
A grant is the exception: it is asked of the gateways in turn until one
answers from the shared store (Redis holds it for the whole fleet, whose
cached denials of a calendar rule last a second at most); asked of each,
it would be granted once per gateway. With in-memory stores each gateway
is asked.

The token is read from EDGELIMIT_ADMIN_TOKEN (or, like every secret, from
the file its _FILE variable names), never from a flag, so it stays out of
shell history and process lists.
`

// runAdmin is "gateway admin key ...": a client of a running gateway's key
// admin API, printing its JSON answer.
func runAdmin(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	if len(args) < 2 || args[0] != "key" {
		fmt.Fprint(stdout, adminUsage)
		return errors.New("gateway admin: want key show|reset|clear|grant")
	}
	action := args[1]
	method, path := http.MethodPost, gateway.AdminPath+"/"+action
	switch action {
	case "show":
		method, path = http.MethodGet, gateway.AdminPath
	case "reset", "clear", "grant":
	default:
		fmt.Fprint(stdout, adminUsage)
		return fmt.Errorf("gateway admin key: unknown action %q, want show, reset, clear or grant", action)
	}
	fs := flag.NewFlagSet("gateway admin key "+action, flag.ContinueOnError)
	fs.SetOutput(stdout)
	fs.Usage = func() { fmt.Fprint(stdout, adminUsage); fs.PrintDefaults() }
	addr := fs.String("admin", "http://127.0.0.1:9090", "the gateway's admin listener (admin_listen); comma-separated for a fleet, each asked in turn")
	apiKey := fs.String("api-key", "", "the API key's configured id (api_keys[].id), never the key itself")
	user := fs.String("user", "", "a user id, as the user header carries it")
	ip := fs.String("ip", "", "a client address")
	route := fs.String("route", "", "only the rule set this route checks; default every rule set")
	plan := fs.String("plan", "", "only the bucket POST /v1/check keeps for this plan (its \"plan\" field)")
	domain := fs.String("domain", "", "an Envoy rate limit domain: the bucket of one descriptor of it (with -entry)")
	var entries []string
	fs.Func("entry", "KEY=VALUE, an entry of the -domain descriptor; repeat, in order", func(v string) error {
		entries = append(entries, v)
		return nil
	})
	rule := fs.String("rule", "", "grant: the calendar rule whose current window gets the units")
	units := fs.Int64("units", 0, "grant: how many units to add; negative takes back what was granted")
	timeout := fs.Duration("timeout", 10*time.Second, "how long to wait for each gateway")
	if err := fs.Parse(args[2:]); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("gateway admin key %s: unexpected arguments %q", action, fs.Args())
	}
	switch {
	case action == "grant" && (*rule == "" || *units == 0):
		return errors.New("gateway admin key grant: give -rule (a calendar rule) and -units (non-zero)")
	case action != "grant" && (*rule != "" || *units != 0):
		return fmt.Errorf("gateway admin key %s: -rule and -units are grant's", action)
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
	for name, v := range map[string]string{"api_key": *apiKey, "user": *user, "ip": *ip, "route": *route, "plan": *plan, "domain": *domain} {
		if v != "" {
			q.Set(name, v)
		}
	}
	for _, e := range entries {
		q.Add("entry", e)
	}
	if action == "grant" {
		q.Set("rule", *rule)
		q.Set("units", strconv.FormatInt(*units, 10))
	}
	// Every gateway asked, in order, each answer printed as it comes: a
	// reset is in Redis once, but each gateway's deny cache and local
	// fallback memory forget the key only when that gateway is asked.
	var errs []error
	for _, a := range boot.SplitList(*addr) {
		base, name, err := adminBase(a)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		body, err := adminCall(ctx, method, base, path+"?"+q.Encode(), token, *timeout)
		if err != nil {
			errs = append(errs, fmt.Errorf("gateway admin %s: %w", name, err))
			continue
		}
		if _, err := stdout.Write(body); err != nil {
			return err
		}
		var answer struct{ Store string }
		if action == "grant" && json.Unmarshal(body, &answer) == nil && answer.Store == "shared" {
			// in Redis once for the whole fleet: asking on would grant again
			return nil
		}
	}
	return errors.Join(errs...)
}

// adminBase reads one -admin address (host:port, or a URL with a scheme
// and maybe a path, e.g. behind a proxy) as the base of the API's URLs,
// and names it for errors by scheme and host only: a password in its user
// info is never printed. A query or fragment would end up in the middle
// of the URL, and is refused.
func adminBase(addr string) (base, name string, err error) {
	if !strings.Contains(addr, "://") {
		addr = "http://" + addr
	}
	u, err := url.Parse(addr)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		// Not echoed: it may hold a password.
		return "", "", errors.New("gateway admin: an -admin address is not host:port or an http(s) URL")
	}
	name = u.Scheme + "://" + u.Host
	if u.RawQuery != "" || u.ForceQuery || u.Fragment != "" {
		return "", "", fmt.Errorf("gateway admin %s: an -admin address takes no query or fragment", name)
	}
	return strings.TrimSuffix(u.String(), "/"), name, nil
}

// adminClient follows no redirect: Go's client would send the bearer
// token again to the same host on another port or over plain http, and
// turn the POST of a reset or clear into a GET, which answers 200 with
// the key's state as if it had been reset. The admin API never redirects.
var adminClient = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// adminCall sends one admin API request to the gateway at base (see
// adminBase) and returns its JSON answer, or the problem it answered as an
// error.
func adminCall(ctx context.Context, method, base, pathQuery string, token boot.Secret, timeout time.Duration) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, base+pathQuery, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+string(token))
	resp, err := adminClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		to := "elsewhere"
		if u, err := resp.Location(); err == nil {
			to = u.Scheme + "://" + u.Host // its path or query may hold anything
		}
		return nil, fmt.Errorf("%s: redirected to %s, not followed (it would carry the admin token there, and turn a reset into a show): give -admin the address that answers", resp.Status, to)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return nil, fmt.Errorf("read the answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		var p struct{ Detail string }
		if json.Unmarshal(body, &p) == nil && p.Detail != "" {
			return nil, fmt.Errorf("%s: %s", resp.Status, p.Detail)
		}
		return nil, errors.New(resp.Status)
	}
	return body, nil
}
