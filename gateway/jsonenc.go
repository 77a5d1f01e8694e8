package gateway

import (
	"encoding/json"
	"strconv"
	"sync"
)

// The check API's and the problems' bodies are written by hand: through
// encoding/json they cost a fifth of a /v1/check's CPU (reflection, and an
// allocation per pointer field). The output is byte for byte what
// json.Marshal writes for the same struct, tags and omitempty included;
// TestJSONEncodingMatchesMarshal holds the two together, so a field added
// to a struct and not here fails there.

// jsonBuffers lends the encoders their buffers. A body over maxPooledJSON
// (a problem with a long detail) is not kept, so the pool holds only
// small buffers.
var jsonBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

const maxPooledJSON = 4 << 10

func getJSONBuffer() *[]byte { return jsonBuffers.Get().(*[]byte) }

func putJSONBuffer(b *[]byte) {
	if cap(*b) > maxPooledJSON {
		return
	}
	*b = (*b)[:0]
	jsonBuffers.Put(b)
}

// jsonObject appends one object's members, a comma before all but the
// first.
type jsonObject struct {
	b    []byte
	more bool
}

func (o *jsonObject) key(k string) {
	if o.more {
		o.b = append(o.b, ',')
	}
	o.more = true
	o.b = append(o.b, '"')
	o.b = append(o.b, k...)
	o.b = append(o.b, '"', ':')
}

func (o *jsonObject) str(k, v string) {
	o.key(k)
	o.b = appendJSONString(o.b, v)
}

func (o *jsonObject) int(k string, v int64) {
	o.key(k)
	o.b = strconv.AppendInt(o.b, v, 10)
}

func (o *jsonObject) bool(k string, v bool) {
	o.key(k)
	o.b = strconv.AppendBool(o.b, v)
}

// appendJSONString appends s quoted as encoding/json quotes it. Strings of
// printable ASCII other than <, > and & (all names, types and most
// details) are written here; any other is left to encoding/json, whose
// escaping (HTML-safe, invalid UTF-8 replaced, U+2028 escaped) is then
// the same by construction.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s)
			return append(b, q...)
		}
	}
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == '"' || c == '\\' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', c)
			start = i + 1
		}
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// appendProblem appends p as json.Marshal(p) does.
func appendProblem(b []byte, p *problem) []byte {
	o := jsonObject{b: append(b, '{')}
	o.str("type", p.Type)
	o.str("title", p.Title)
	o.int("status", int64(p.Status))
	if p.Detail != "" {
		o.str("detail", p.Detail)
	}
	if len(p.Violated) > 0 {
		o.key("violated_rules")
		o.b = append(o.b, '[')
		for i := range p.Violated {
			if i > 0 {
				o.b = append(o.b, ',')
			}
			o.b = appendViolation(o.b, &p.Violated[i])
		}
		o.b = append(o.b, ']')
	}
	if p.Route != "" {
		o.str("route", p.Route)
	}
	if p.Upstream != "" {
		o.str("upstream", p.Upstream)
	}
	return append(o.b, '}')
}

func appendViolation(b []byte, v *violation) []byte {
	o := jsonObject{b: append(b, '{')}
	o.str("name", v.Name)
	o.int("limit", v.Limit)
	o.int("window_seconds", v.WindowSeconds)
	o.int("capacity", v.Capacity)
	o.int("remaining", v.Remaining)
	if v.RetryAfterSeconds != 0 {
		o.int("retry_after_seconds", v.RetryAfterSeconds)
	}
	return append(o.b, '}')
}

// appendCheckResponse appends r as json.Marshal(r) does.
func appendCheckResponse(b []byte, r *checkResponse) []byte {
	o := jsonObject{b: append(b, '{')}
	o.bool("allowed", r.Allowed)
	o.str("key_kind", r.KeyKind)
	o.str("plan", r.Plan)
	if r.Route != "" {
		o.str("route", r.Route)
	}
	o.int("cost", r.Cost)
	o.str("mode", r.Mode)
	o.str("store", r.Store)
	if r.RetryAfterMS != 0 {
		o.int("retry_after_ms", r.RetryAfterMS)
	}
	if r.RetryAfterSeconds != 0 {
		o.int("retry_after_seconds", r.RetryAfterSeconds)
	}
	if r.Reason != "" {
		o.str("reason", r.Reason)
	}
	if r.Binding != "" {
		o.str("binding_rule", r.Binding)
	}
	if len(r.Rules) > 0 {
		o.key("rules")
		o.b = append(o.b, '[')
		for i := range r.Rules {
			if i > 0 {
				o.b = append(o.b, ',')
			}
			o.b = appendCheckRule(o.b, &r.Rules[i])
		}
		o.b = append(o.b, ']')
	}
	if r.Problem != nil {
		o.key("problem")
		o.b = appendProblem(o.b, r.Problem)
	}
	return append(o.b, '}')
}

func appendCheckRule(b []byte, r *checkRule) []byte {
	o := jsonObject{b: append(b, '{')}
	o.str("name", r.Name)
	o.int("limit", r.Limit)
	o.int("window_seconds", r.WindowSeconds)
	o.int("capacity", r.Capacity)
	if r.Shadow {
		o.bool("shadow", r.Shadow)
	}
	if r.Allowed != nil {
		o.bool("allowed", *r.Allowed)
	}
	if r.Remaining != nil {
		o.int("remaining", *r.Remaining)
	}
	if r.ResetSeconds != nil {
		o.int("reset_seconds", *r.ResetSeconds)
	}
	if r.RetryAfterMS != nil {
		o.int("retry_after_ms", *r.RetryAfterMS)
	}
	return append(o.b, '}')
}
