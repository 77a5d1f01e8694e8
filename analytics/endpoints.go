package analytics

import (
	_ "embed"
	"encoding/csv"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// TrendsResponse is GET /api/trends' body.
type TrendsResponse struct {
	Span
	Bucket string       `json:"bucket"`
	TZ     string       `json:"tz"`
	By     string       `json:"by"`
	Points []TrendPoint `json:"points"`
}

// trends answers the trend as JSON, or with ?format=csv as a CSV download
// (TrendHeader's columns).
func (a *API) trends(w http.ResponseWriter, r *http.Request) error {
	rg, err := a.rangeOf(r)
	if err != nil {
		return err
	}
	top, err := intParam(r, "top", 10, 0, 1000)
	if err != nil {
		return err
	}
	format := r.URL.Query().Get("format")
	if format != "" && format != "json" && format != "csv" {
		return fmt.Errorf("%w: format %q: want json or csv", ErrBadQuery, format)
	}
	q := TrendQuery{Range: rg, Bucket: bucketOf(r, rg), TZ: r.URL.Query().Get("tz"), By: r.URL.Query().Get("by"), Top: top}
	if q, err = q.normalize(); err != nil {
		return err
	}
	pts, err := a.reader.Trends(r.Context(), q)
	if err != nil {
		return err
	}
	if format == "csv" {
		rows := make([][]string, len(pts))
		for i, p := range pts {
			rows[i] = p.Record()
		}
		return writeCSV(w, "trends.csv", TrendHeader(q.By), rows)
	}
	writeJSON(w, http.StatusOK, TrendsResponse{Span: Span{From: rg.From, To: rg.To}, Bucket: q.Bucket, TZ: q.TZ, By: q.By, Points: nonNil(pts)})
	return nil
}

// writeCSV answers a CSV download named name.
func writeCSV(w http.ResponseWriter, name string, header []string, rows [][]string) error {
	h := w.Header()
	h.Set("Content-Type", "text/csv; charset=utf-8")
	h.Set("Content-Disposition", `attachment; filename="`+name+`"`)
	h.Set("Cache-Control", "no-store")
	// The status is sent: a write error is the client gone, nothing to
	// answer.
	WriteCSV(w, header, rows)
	return nil
}

// WriteCSV writes header and rows as CSV, every cell a spreadsheet would
// run as a formula made plain text (see csvCell): key names, routes,
// plans, methods and gateway ids come from configurations and clients,
// and an export is opened in a spreadsheet.
func WriteCSV(w io.Writer, header []string, rows [][]string) error {
	cw := csv.NewWriter(w)
	for _, rec := range append([][]string{header}, rows...) {
		safe := make([]string, len(rec))
		for i, c := range rec {
			safe[i] = csvCell(c)
		}
		cw.Write(safe)
	}
	cw.Flush()
	return cw.Error()
}

// csvCell is c with a leading apostrophe when a spreadsheet would read it
// as a formula (OWASP's list: it starts with =, +, -, @, a tab or a
// carriage return; "=cmd|' /C calc'!A0", "-2+3", "@SUM(A1)"). A number,
// negative ones included, stays a number.
func csvCell(c string) string {
	if c == "" || !strings.ContainsRune("=+-@\t\r", rune(c[0])) {
		return c
	}
	if _, err := strconv.ParseFloat(c, 64); err == nil {
		return c
	}
	return "'" + c
}

// ranged is a GET route over a range (see rangeOf): body reads the
// request and the range and returns the JSON answer, so each route is
// left with its own parameters, its query and its answer's fields.
func (a *API) ranged(body func(r *http.Request, rg Range) (any, error)) func(http.ResponseWriter, *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		rg, err := a.rangeOf(r)
		if err != nil {
			return err
		}
		v, err := body(r, rg)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, v)
		return nil
	}
}

// key answers a key's page: GET /api/keys/{key}, key an id or a name.
func (a *API) key(r *http.Request, rg Range) (any, error) {
	rep, err := a.reader.KeyReport(r.Context(), rg, r.PathValue("key"), bucketOf(r, rg), r.URL.Query().Get("tz"))
	if err != nil {
		return nil, err
	}
	if a.det != nil {
		switch d, ok, err := a.det.Directives(r.Context()); {
		case err != nil:
			// Redis is down: the page still shows the traffic.
			a.log.Warn("key page: read directives", "error", err.Error())
			rep.Directives = "unavailable (see the analytics log)"
		case ok:
			rep.AddDirectives(d, a.now())
		}
	}
	rep.Keys, rep.Splits, rep.NATs, rep.History = nonNil(rep.Keys), nonNil(rep.Splits), nonNil(rep.NATs), nonNil(rep.History)
	return rep, nil
}

func (a *API) topKeys(r *http.Request, rg Range) (any, error) {
	limit, err := intParam(r, "limit", 20, 1, 10000)
	if err != nil {
		return nil, err
	}
	keys, err := a.reader.TopKeys(r.Context(), rg, limit)
	return map[string]any{"from": rg.From, "to": rg.To, "keys": nonNil(keys)}, err
}

func (a *API) failMinutes(r *http.Request, rg Range) (any, error) {
	ms, err := a.reader.FailMinutes(r.Context(), rg)
	return map[string]any{"from": rg.From, "to": rg.To, "minutes": nonNil(ms)}, err
}

func (a *API) storeHealth(r *http.Request, rg Range) (any, error) {
	b := bucketOf(r, rg)
	gh, err := a.reader.StoreHealth(r.Context(), rg, b)
	return map[string]any{"from": rg.From, "to": rg.To, "bucket": b, "points": nonNil(gh)}, err
}

// hotKeys answers the detector's current hot keys; with ?key=ID, that
// key's history per bucket and gateway instead.
func (a *API) hotKeys(r *http.Request, rg Range) (any, error) {
	if rg.KeyID != "" {
		b := bucketOf(r, rg)
		h, err := a.reader.KeyHistory(r.Context(), rg, b)
		return map[string]any{"key_id": rg.KeyID, "from": rg.From, "to": rg.To, "bucket": b, "history": nonNil(h)}, err
	}
	hot, at, err := current(a, r, func(rep Report) []HotKey { return rep.HotKeys }, func(cfg Config) ([]HotKey, error) {
		return a.reader.HotKeys(r.Context(), cfg.Hot, rg.From, rg.To, 0, nil)
	})
	return map[string]any{"at": at, "hot_keys": nonNil(hot)}, err
}

// natIPs answers the detector's current NAT IPs; with ?ip=ADDR, that
// address's history per bucket instead.
func (a *API) natIPs(r *http.Request, rg Range) (any, error) {
	if ip := r.URL.Query().Get("ip"); ip != "" {
		b := bucketOf(r, rg)
		h, err := a.reader.IPHistory(r.Context(), rg, ip, b)
		return map[string]any{"ip": ip, "from": rg.From, "to": rg.To, "bucket": b, "history": nonNil(h)}, err
	}
	nats, at, err := current(a, r, func(rep Report) []NATIP { return rep.NATIPs }, func(cfg Config) ([]NATIP, error) {
		return a.reader.NATIPs(r.Context(), cfg.NAT, rg.From, rg.To, nil)
	})
	return map[string]any{"at": at, "nat_ips": nonNil(nats)}, err
}

// current returns the detector's last findings, or, without a detector
// (or before its first run) or when the request names a range, runs the
// detector's query over that range without writing anything.
func current[T any](a *API, r *http.Request, last func(Report) []T, adhoc func(Config) ([]T, error)) ([]T, time.Time, error) {
	q := r.URL.Query()
	if a.det != nil && q.Get("from") == "" && q.Get("to") == "" {
		if rep := a.det.Last(); !rep.At.IsZero() {
			return last(rep), rep.At, nil
		}
	}
	cfg := Config{}.WithDefaults()
	if a.det != nil {
		cfg = a.det.Config()
	}
	out, err := adhoc(cfg)
	return out, a.now().UTC(), err
}

func (a *API) alerts(w http.ResponseWriter, r *http.Request) error {
	var rep Report
	if a.det != nil {
		rep = a.det.Last()
	}
	var firing []Alert
	for _, al := range rep.Alerts {
		if al.Firing {
			firing = append(firing, al)
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"at": rep.At, "firing": nonNil(firing), "evaluated": nonNil(rep.Alerts)})
	return nil
}

func (a *API) status(w http.ResponseWriter, r *http.Request) error {
	if a.det == nil {
		writeJSON(w, http.StatusOK, map[string]any{"detector": false})
		return nil
	}
	rep := a.det.Last()
	writeJSON(w, http.StatusOK, map[string]any{
		"detector": true, "last_run": rep.At, "duration_ms": rep.Duration.Milliseconds(),
		"hot_keys": len(rep.HotKeys), "nat_ips": len(rep.NATIPs), "errors": nonNil(rep.Errors),
		"splits_written": rep.SplitsWritten, "nats_written": rep.NATsWritten,
	})
	return nil
}

// nonNil makes empty lists encode as [] rather than null.
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// usage answers a usage statement (UsageStatement) as JSON, or with
// ?format=csv (or Accept: text/csv) its rows as a CSV download:
// ?month=2026-11 or ?from=&to=, ?tz=, ?key= (repeated), ?by=key,plan.
func (a *API) usage(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	format := q.Get("format")
	if format == "" && strings.Contains(r.Header.Get("Accept"), "text/csv") {
		format = "csv"
	}
	if format != "" && format != "json" && format != "csv" {
		return fmt.Errorf("%w: format %q: want json or csv", ErrBadQuery, format)
	}
	tz := q.Get("tz")
	if tz == "" {
		tz = "UTC"
	}
	loc, err := LoadZone(tz)
	if err != nil {
		return err
	}
	uq := UsageQuery{TZ: tz, Keys: q["key"]}
	if b := q.Get("by"); b != "" {
		uq.By = strings.Split(b, ",")
	}
	if uq.From, uq.To, err = UsagePeriod(q.Get("month"), q.Get("from"), q.Get("to"), loc, a.now()); err != nil {
		return err
	}
	st, err := a.reader.Usage(r.Context(), uq)
	if err != nil {
		return err
	}
	if format == "csv" {
		rows := make([][]string, len(st.Rows))
		for i, u := range st.Rows {
			rows[i] = u.Record(st.By)
		}
		return writeCSV(w, "usage.csv", UsageHeader(st.By), rows)
	}
	st.Rows, st.Keys = nonNil(st.Rows), nonNil(st.Keys)
	writeJSON(w, http.StatusOK, st)
	return nil
}
