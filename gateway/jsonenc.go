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

// optStr and optInt write a member tagged omitempty: not at all when zero.
func (o *jsonObject) optStr(k, v string) {
	if v != "" {
		o.str(k, v)
	}
}

func (o *jsonObject) optInt(k string, v int64) {
	if v != 0 {
		o.int(k, v)
	}
}

// optList writes an array member tagged omitempty of n elements, each
// appended by elem.
func (o *jsonObject) optList(k string, n int, elem func(b []byte, i int) []byte) {
	if n == 0 {
		return
	}
	o.key(k)
	o.b = append(o.b, '[')
	for i := range n {
		if i > 0 {
			o.b = append(o.b, ',')
		}
		o.b = elem(o.b, i)
	}
	o.b = append(o.b, ']')
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
	o.optStr("detail", p.Detail)
	o.optList("violated_rules", len(p.Violated), func(b []byte, i int) []byte { return appendViolation(b, &p.Violated[i]) })
	o.optStr("route", p.Route)
	o.optStr("upstream", p.Upstream)
	return append(o.b, '}')
}

// rule opens an object with the members a violation and a check rule
// both begin with.
func (o *jsonObject) rule(name string, limit, window, capacity int64) {
	o.b = append(o.b, '{')
	o.str("name", name)
	o.int("limit", limit)
	o.int("window_seconds", window)
	o.int("capacity", capacity)
}

func appendViolation(b []byte, v *violation) []byte {
	o := jsonObject{b: b}
	o.rule(v.Name, v.Limit, v.WindowSeconds, v.Capacity)
	o.int("remaining", v.Remaining)
	o.optInt("retry_after_seconds", v.RetryAfterSeconds)
	if v.InFlight {
		o.bool("in_flight", true)
	}
	return append(o.b, '}')
}

// appendCheckResponse appends r as json.Marshal(r) does.
func appendCheckResponse(b []byte, r *checkResponse) []byte {
	o := jsonObject{b: append(b, '{')}
	o.bool("allowed", r.Allowed)
	o.str("key_kind", r.KeyKind)
	o.str("plan", r.Plan)
	o.optStr("route", r.Route)
	o.int("cost", r.Cost)
	o.str("mode", r.Mode)
	o.str("store", r.Store)
	o.optInt("retry_after_ms", r.RetryAfterMS)
	o.optInt("retry_after_seconds", r.RetryAfterSeconds)
	o.optStr("reason", r.Reason)
	o.optStr("binding_rule", r.Binding)
	o.optList("rules", len(r.Rules), func(b []byte, i int) []byte { return appendCheckRule(b, &r.Rules[i]) })
	if r.Problem != nil {
		o.key("problem")
		o.b = appendProblem(o.b, r.Problem)
	}
	return append(o.b, '}')
}

func appendCheckRule(b []byte, r *checkRule) []byte {
	o := jsonObject{b: b}
	o.rule(r.Name, r.Limit, r.WindowSeconds, r.Capacity)
	if r.Shadow {
		o.bool("shadow", r.Shadow)
	}
	if r.Allowed != nil {
		o.bool("allowed", *r.Allowed)
	}
	for _, f := range [...]struct {
		k string
		v *int64
	}{{"remaining", r.Remaining}, {"reset_seconds", r.ResetSeconds}, {"retry_after_ms", r.RetryAfterMS}} {
		if f.v != nil {
			o.int(f.k, *f.v)
		}
	}
	return append(o.b, '}')
}
