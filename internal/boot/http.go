package boot

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"
)

// HTTP is the client side of an HTTP link, such as analytics' Alertmanager
// or webhook: TLS (a private CA, a client certificate) and one kind of
// authentication, basic (Username + Password) or bearer (BearerToken).
type HTTP struct {
	// TLS applies to https URLs.
	TLS TLS `yaml:"tls"`
	// Username and Password are HTTP basic auth.
	Username string `yaml:"username"`
	Password Secret `yaml:"password"`
	// BearerToken is sent as "Authorization: Bearer ..." instead.
	BearerToken Secret `yaml:"bearer_token"`
}

// ApplyEnv overrides h from PREFIX_USERNAME, PREFIX_PASSWORD (or _FILE),
// PREFIX_BEARER_TOKEN (or _FILE) and the TLS settings PREFIX_TLS,
// _TLS_CA_FILE, _TLS_CERT_FILE, _TLS_KEY_FILE, _TLS_SERVER_NAME and
// _TLS_MIN_VERSION.
func (h *HTTP) ApplyEnv(e *Env, prefix string) {
	e.String(&h.Username, prefix+"_USERNAME")
	e.Secret(&h.Password, prefix+"_PASSWORD")
	e.Secret(&h.BearerToken, prefix+"_BEARER_TOKEN")
	h.TLS.applyEnv(e, prefix)
}

// Validate joins every problem with h, named after its YAML section.
func (h HTTP) Validate(section string) error {
	var errs []error
	if h.BearerToken != "" && (h.Username != "" || h.Password != "") {
		errs = append(errs, fmt.Errorf("%s: set basic auth (username, password) or bearer_token, not both", section))
	}
	if (h.Username == "") != (h.Password == "") {
		errs = append(errs, fmt.Errorf("%s: username and password go together", section))
	}
	errs = append(errs, h.TLS.validate(section+".tls"))
	return errors.Join(errs...)
}

// NewHTTPClient returns one client for several links, keyed by a URL of
// each: a request goes through the link whose scheme, host and path it is
// under (the longest path, when two links share a host: Alertmanager and
// a webhook behind one proxy), so each destination gets its own CA and
// sees its own credentials only. A request to any other place gets
// neither. timeout bounds every request.
func NewHTTPClient(timeout time.Duration, links map[string]HTTP) (*http.Client, error) {
	rt := routes{other: http.DefaultTransport, by: map[string][]route{}}
	for raw, h := range links {
		u, err := url.Parse(raw)
		if err != nil {
			// Neither raw nor err (which quotes it): a webhook's path is
			// often its token.
			return nil, errors.New("an HTTP link's URL does not parse (not shown: it may hold a token)")
		}
		tc, err := h.TLS.Config()
		if err != nil {
			return nil, err
		}
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.TLSClientConfig = tc
		origin := u.Scheme + "://" + u.Host
		rt.by[origin] = append(rt.by[origin], route{path: strings.TrimSuffix(u.Path, "/"), rt: authTransport{h: h, next: t}})
	}
	for _, rs := range rt.by {
		slices.SortFunc(rs, func(a, b route) int { return cmp.Compare(len(b.path), len(a.path)) })
	}
	// No redirect is followed: Go's client would re-send a POST of alerts
	// as a GET (301, 302, 303), whose 200 would count as delivered, and
	// could take the request over plain http. A redirect is an answer that
	// the link is configured wrong (CheckHTTP says so at start).
	return &http.Client{Timeout: timeout, Transport: rt, CheckRedirect: noRedirect}, nil
}

func noRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// routes picks a request's transport by its scheme, host and path.
type routes struct {
	by    map[string][]route // by scheme://host, longest path first
	other http.RoundTripper
}

// route is one link's transport, for the requests under its path.
type route struct {
	path string // without a trailing slash; "" is the whole host
	rt   http.RoundTripper
}

func (r routes) RoundTrip(req *http.Request) (*http.Response, error) {
	p := req.URL.Path
	for _, t := range r.by[req.URL.Scheme+"://"+req.URL.Host] {
		if p == t.path || strings.HasPrefix(p, t.path+"/") {
			return t.rt.RoundTrip(req)
		}
	}
	return r.other.RoundTrip(req)
}

// authTransport adds h's credentials to each request.
type authTransport struct {
	h    HTTP
	next http.RoundTripper
}

func (a authTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if a.h.Username == "" && a.h.BearerToken == "" {
		return a.next.RoundTrip(req)
	}
	req = req.Clone(req.Context()) // a RoundTripper must not change its request
	if a.h.BearerToken != "" {
		req.Header.Set("Authorization", "Bearer "+string(a.h.BearerToken))
	} else {
		req.SetBasicAuth(a.h.Username, string(a.h.Password))
	}
	return a.next.RoundTrip(req)
}

// CheckHTTP checks the HTTP link named name at rawURL with client (from
// NewHTTPClient), within CheckTimeout, by sending method (GET for
// Alertmanager's /api/v2/status; HEAD for a webhook, which must not be
// posted to): a LinkError when the connection, its TLS, or the
// credentials (401, 403) fail, or the answer is a redirect (never
// followed, see NewHTTPClient); nil for any other answer. A webhook that
// does not know HEAD still proves its certificate and its reachability.
func CheckHTTP(ctx context.Context, client *http.Client, name, method, rawURL string) error {
	ctx, cancel := checkContext(ctx)
	defer cancel()
	u, err := url.Parse(rawURL)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	// The link's name shows the scheme and host only: the path of a
	// webhook URL may carry a token.
	link := name + " (" + u.Scheme + "://" + u.Host + ")"
	req, err := http.NewRequestWithContext(ctx, method, rawURL, nil)
	if err != nil {
		return fmt.Errorf("%s: %w", link, err)
	}
	resp, err := client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // its text repeats the URL, token and all
		}
		return linkError(link, err, func(error) bool { return false })
	}
	resp.Body.Close()
	if resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden {
		return &LinkError{Link: link, Kind: ErrAuth, Err: errors.New(resp.Status)}
	}
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		to := "elsewhere"
		if l, err := resp.Location(); err == nil {
			to = l.Scheme + "://" + l.Host // its path may carry a token
		}
		return &LinkError{Link: link, Kind: ErrRedirect, Err: fmt.Errorf("%s to %s", resp.Status, to)}
	}
	return nil
}
