package analytics_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/edgelimit/edgelimit/analytics"
)

// endlessStore answers every query with rows rows of zeros, counting how
// many the reader asked for: a store whose answer is larger than any a
// real test could seed (a year of failing minutes × gateways).
type endlessStore struct{ rows, read int }

func (s *endlessStore) Query(context.Context, string, ...any) (driver.Rows, error) {
	return &endlessRows{s: s}, nil
}

type endlessRows struct {
	driver.Rows // the methods the reader does not call
	s           *endlessStore
}

func (r *endlessRows) Next() bool {
	r.s.read++
	return r.s.read <= r.s.rows
}
func (r *endlessRows) Scan(...any) error { return nil }
func (r *endlessRows) Close() error      { return nil }
func (r *endlessRows) Err() error        { return nil }

// TestAnswerBound: an answer past the row bound is refused as a bad query
// (a 400 problem naming what to narrow) as soon as the bound is passed,
// rather than held and encoded whole. The real-server tier checks the
// bounds computed before a query runs (TestReaderOnSeededFleet's bad
// queries); this one the bound on what comes back.
func TestAnswerBound(t *testing.T) {
	store := &endlessStore{rows: 5 * analytics.MaxRows}
	r := analytics.NewReader(store)
	now := time.Now().UTC()
	rg := analytics.Range{From: now.Add(-365 * 24 * time.Hour), To: now}
	if ms, err := r.FailMinutes(context.Background(), rg); !errors.Is(err, analytics.ErrBadQuery) || ms != nil {
		t.Errorf("FailMinutes over %d rows = %d minutes, %v; want ErrBadQuery", store.rows, len(ms), err)
	}
	if store.read > analytics.MaxRows+1 {
		t.Errorf("FailMinutes read %d rows, want it to stop after %d", store.read, analytics.MaxRows+1)
	}

	api, err := analytics.NewAPI(analytics.NewReader(&endlessStore{rows: analytics.MaxRows + 1}), nil, testToken, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api.Handler())
	defer srv.Close()
	resp, body := get(t, srv.Client(), srv.URL+"/api/store-health?from=-30d&bucket=minute", testToken)
	wantProblem(t, "GET /api/store-health over too many rows", resp, body, http.StatusBadRequest, "urn:edgelimit:problem:bad-query")
	// An answer at the bound is still an answer.
	api, _ = analytics.NewAPI(analytics.NewReader(&endlessStore{rows: analytics.MaxRows}), nil, testToken, nil, nil)
	srv2 := httptest.NewServer(api.Handler())
	defer srv2.Close()
	if resp, _ := get(t, srv2.Client(), srv2.URL+"/api/fail-minutes?from=-30d", testToken); resp.StatusCode != http.StatusOK {
		t.Errorf("GET /api/fail-minutes over %d rows = %d, want 200", analytics.MaxRows, resp.StatusCode)
	}
}
