package analytics

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// ProposalParser reads a what-if proposal: rules is a plan set in the
// gateway's YAML syntax (a whole gateway configuration does), change an
// optional changed rule (its plan and the rule's fields). cmd/analytics
// supplies one built on the gateway's configuration types; its errors are
// the caller's mistakes and are shown to them.
type ProposalParser func(rules, change string) (Proposal, error)

// WhatIfRequest is POST /api/whatif's body.
type WhatIfRequest struct {
	// Rules is the proposal (YAML), Change an optional changed rule (YAML).
	Rules  string `json:"rules"`
	Change string `json:"change"`
	// Ran is the rules that ran (YAML), replayed for the self-check;
	// default Rules when Change is given (the change is then to them).
	Ran string `json:"ran"`
	// From (default 24h ago) and To (default now), as ParseTime reads them.
	From string `json:"from"`
	To   string `json:"to"`
	// Plan, Route and Key filter as WhatIfQuery says.
	Plan  string `json:"plan"`
	Route string `json:"route"`
	Key   string `json:"key"`
	// Top is how many keys each list holds; default 20.
	Top int `json:"top"`
}

// Bounds of the what-if route.
const (
	maxWhatIfBody = 1 << 20
	// maxWhatIfs is how many replays may run at once: each keeps a core
	// and ClickHouse busy for up to WhatIfTimeout.
	maxWhatIfs = 2
)

const (
	probBusy    = "urn:edgelimit:problem:busy"
	probTimeout = "urn:edgelimit:problem:timeout"
)

// whatIf answers POST /api/whatif with a WhatIfReport.
func (a *API) whatIf(w http.ResponseWriter, r *http.Request) error {
	if a.ParseProposal == nil {
		writeProblem(w, problem{Type: probNotFound, Status: http.StatusNotFound, Detail: "What-if is not configured on this server."})
		return nil
	}
	// The slot is taken first, so the work bounded includes reading the
	// body and the proposal.
	if n := a.whatIfs.Add(1); n > maxWhatIfs {
		a.whatIfs.Add(-1)
		w.Header().Set("Retry-After", "30")
		writeProblem(w, problem{Type: probBusy, Status: http.StatusTooManyRequests,
			Detail: fmt.Sprintf("%d what-if replays are running; try again when one is done.", maxWhatIfs)})
		return nil
	}
	defer a.whatIfs.Add(-1)
	// A replay may take WhatIfTimeout, longer than the server lets any
	// answer take to write (cmd's 60s): without this its answer, the
	// report or the timeout's 503, would be cut off and the client see a
	// dropped connection. The ten seconds are for encoding and sending.
	if err := http.NewResponseController(w).SetWriteDeadline(time.Now().Add(WhatIfTimeout + 10*time.Second)); err != nil {
		a.log.Warn("what-if: extend the write deadline", "error", err.Error())
	}
	var req WhatIfRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxWhatIfBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return fmt.Errorf("%w: body: want a JSON object {rules, change, ran, from, to, plan, route, key, top} of at most %d bytes: %v", ErrBadQuery, maxWhatIfBody, err)
	}
	q, err := a.whatIfQuery(req)
	if err != nil {
		return err
	}
	rep, err := a.reader.WhatIf(r.Context(), q)
	switch {
	case r.Context().Err() != nil:
		return nil // the client went away; the replay stopped with it
	case errors.Is(err, context.DeadlineExceeded):
		writeProblem(w, problem{Type: probTimeout, Status: http.StatusServiceUnavailable,
			Detail: fmt.Sprintf("The replay took longer than %v; narrow the range or filter by plan or key.", WhatIfTimeout)})
		return nil
	case err != nil:
		return err
	}
	writeJSON(w, http.StatusOK, rep)
	return nil
}

// whatIfQuery reads a request into a query, every mistake an ErrBadQuery.
func (a *API) whatIfQuery(req WhatIfRequest) (WhatIfQuery, error) {
	now := a.now().UTC()
	from, err := ParseTime(req.From, now, now.Add(-24*time.Hour))
	if err != nil {
		return WhatIfQuery{}, err
	}
	to, err := ParseTime(req.To, now, now)
	if err != nil {
		return WhatIfQuery{}, err
	}
	if strings.TrimSpace(req.Rules) == "" {
		return WhatIfQuery{}, fmt.Errorf("%w: rules: the proposal is empty; give plans in the gateway's YAML syntax", ErrBadQuery)
	}
	parse := func(what, rules, change string) (Proposal, error) {
		p, err := a.ParseProposal(rules, change)
		if err != nil && !errors.Is(err, ErrBadQuery) {
			err = fmt.Errorf("%w: %s: %v", ErrBadQuery, what, err)
		}
		return p, err
	}
	p, err := parse("rules", req.Rules, req.Change)
	if err != nil {
		return WhatIfQuery{}, err
	}
	q := WhatIfQuery{Range: Range{From: from, To: to, Plan: req.Plan, Route: req.Route, KeyID: req.Key}, Proposal: p, Top: req.Top}
	ran := req.Ran
	if strings.TrimSpace(ran) == "" && strings.TrimSpace(req.Change) != "" {
		ran = req.Rules
	}
	if strings.TrimSpace(ran) != "" {
		r, err := parse("ran", ran, "")
		if err != nil {
			return WhatIfQuery{}, err
		}
		q.Ran = &r
	}
	if q.Top == 0 {
		q.Top = 20
	}
	return q, q.Validate()
}
