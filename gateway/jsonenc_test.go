package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// fillAll sets every field of the struct v points to, recursively, to a
// value that is not its zero, so omitempty omits none: a field the hand
// encoder does not write then shows up as a difference.
func fillAll(v reflect.Value, s string, n int64) {
	switch v.Kind() {
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fillAll(v.Elem(), s, n)
	case reflect.Struct:
		for i := range v.NumField() {
			fillAll(v.Field(i), fmt.Sprintf("%s%d", s, i), n+int64(i))
		}
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 2, 2))
		for i := range 2 {
			fillAll(v.Index(i), s+"/"+fmt.Sprint(i), n*10+int64(i))
		}
	case reflect.String:
		v.SetString(s)
	case reflect.Int, reflect.Int64:
		v.SetInt(n)
	case reflect.Bool:
		v.SetBool(true)
	default:
		panic("fillAll: no case for " + v.Kind().String())
	}
}

// TestJSONEncodingMatchesMarshal: the hand-written encoders write what
// json.Marshal writes, for every field set, none set, and strings that
// need escaping.
func TestJSONEncodingMatchesMarshal(t *testing.T) {
	f, tr, zero := false, true, int64(0)
	full := checkResponse{}
	fillAll(reflect.ValueOf(&full).Elem(), "v", 7)
	fullProblem := problem{}
	fillAll(reflect.ValueOf(&fullProblem).Elem(), "p", -3)
	responses := []checkResponse{
		{},
		full,
		{Allowed: true, KeyKind: "ip", Plan: "bench", Cost: 1, Mode: "enforced", Store: "ok", Binding: "minute",
			Rules: []checkRule{{Name: "minute", Limit: 100, WindowSeconds: 60, Capacity: 100, Allowed: &tr, Remaining: &zero, ResetSeconds: &zero}}},
		{Rules: []checkRule{{Name: "a", Shadow: true, Allowed: &f, RetryAfterMS: &zero}}, Problem: &problem{Status: 429}},
		{Rules: []checkRule{}},
	}
	problems := []problem{{}, fullProblem, {Violated: []violation{}}, {Violated: []violation{{Name: "x"}}}}
	for _, s := range []string{"", "plain", `quote " and \ backslash`, "<tag> & amp", "tab\tnew\nline\x00", "é ü 世界",
		"bad \xff utf8", "line\u2028sep\u2029", "\x7f del", `rule "minute" allows 100 per 1m0s; rule "hour" allows 5000 per 1h0m0s`} {
		responses = append(responses, checkResponse{KeyKind: s, Plan: s, Route: s, Mode: s, Store: s, Reason: s, Binding: s,
			Rules: []checkRule{{Name: s}}, Problem: &problem{Type: s, Title: s, Detail: s, Route: s, Upstream: s, Violated: []violation{{Name: s}}}})
		problems = append(problems, problem{Type: s, Title: s, Detail: s, Route: s, Upstream: s})
	}
	matchesMarshal(t, "appendCheckResponse", responses, appendCheckResponse)
	matchesMarshal(t, "appendProblem", problems, appendProblem)
}

// matchesMarshal checks that enc appends what json.Marshal writes for
// each of vals.
func matchesMarshal[T any](t *testing.T, name string, vals []T, enc func([]byte, *T) []byte) {
	t.Helper()
	for _, v := range vals {
		want, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if got := enc(nil, &v); string(got) != string(want) {
			t.Errorf("%s(%+v)\n got %s\nwant %s", name, v, got, want)
		}
	}
}

func FuzzJSONString(f *testing.F) {
	for _, s := range []string{"", "a", `"\`, "<>&", "\u2028", "\xff", "\x01"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, _ := json.Marshal(s)
		if got := appendJSONString(nil, s); string(got) != string(want) {
			t.Errorf("appendJSONString(%q) = %s, want %s", s, got, want)
		}
	})
}

// decodeLikeBefore is how the check API read its body before the hand
// parser: a json.Decoder over the bounded body, unknown fields refused.
func decodeLikeBefore(body string) (checkRequest, error) {
	var req checkRequest
	err := decodeCheckRequest(http.MaxBytesReader(httptest.NewRecorder(), io.NopCloser(strings.NewReader(body)), maxCheckBody), &req)
	return req, err
}

// readLikeNow is readCheckRequest on body sent with its Content-Length.
func readLikeNow(body string) (checkRequest, error) {
	r := httptest.NewRequest(http.MethodPost, "/v1/check", strings.NewReader(body))
	var req checkRequest
	err := readCheckRequest(httptest.NewRecorder(), r, &req)
	return req, err
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

var checkBodies = []string{
	`{"ip":"10.1.2.3"}`,
	` { "key" : "k-1" , "method":"post", "path":"/items?x=1", "cost": 12 } `,
	"{\n\t\"user\":\"u\",\r\n\"plan\":\"gold\"}",
	`{}`, ` {} `, `{"ip":"a","ip":"b"}`, `{"cost":0}`, `{"cost":-5}`, `{"cost":-0}`,
	`{"cost":123456789012345678}`, `{"cost":1234567890123456789}`, `{"cost":99999999999999999999}`,
	`{"cost":1.5}`, `{"cost":1e3}`, `{"cost":01}`, `{"cost":"1"}`, `{"cost":null}`, `{"cost":-}`,
	`{"ip":null}`, `{"ip":1}`, `{"ip":true}`, `{"IP":"10.1.2.3"}`, `{"Ip":"x","cost":2}`, `{"other":"x"}`,
	`{"ip":"a\"b"}`, `{"ip":"\u0031"}`, `{"ip":"é"}`, "{\"ip\":\"\xff\"}", "{\"ip\":\"a\tb\"}",
	``, ` `, `null`, `[]`, `"x"`, `{`, `{"ip"`, `{"ip":`, `{"ip":"x"`, `{"ip":"x",}`, `{,}`, `{"ip":"x"}}`,
	`{"ip":"x"} trailing`, `{"ip":"x"}{"ip":"y"}`, `{"ip":"x"} {`, `{"ip" "x"}`, `{"ip":"x" "cost":1}`,
	`{"key":"k","user":"u","ip":"i","plan":"p","method":"m","path":"/p","cost":3}`,
}

// TestCheckRequestParsingMatchesJSON: whatever the body, the check API
// reads the request and refuses it exactly as json.Decoder did, message
// included.
func TestCheckRequestParsingMatchesJSON(t *testing.T) {
	for _, body := range append(checkBodies, strings.Repeat(" ", maxFastCheckBody)+`{"ip":"far"}`) {
		want, wantErr := decodeLikeBefore(body)
		got, err := readLikeNow(body)
		if diff := cmp.Diff(want, got); diff != "" || errText(err) != errText(wantErr) {
			t.Errorf("read %q: %+v, %v; want %+v, %v (-want +got)\n%s", body, got, err, want, wantErr, diff)
		}
	}
}

// TestCheckRequestTooLarge: an oversized body is still the 413's error,
// with or without a Content-Length.
func TestCheckRequestTooLarge(t *testing.T) {
	body := `{"ip":"` + strings.Repeat("x", maxCheckBody) + `"}`
	for _, length := range []int64{int64(len(body)), -1} {
		r := httptest.NewRequest(http.MethodPost, "/v1/check", strings.NewReader(body))
		r.ContentLength = length
		var req checkRequest
		err := readCheckRequest(httptest.NewRecorder(), r, &req)
		var tooLarge *http.MaxBytesError
		if !errors.As(err, &tooLarge) {
			t.Errorf("Content-Length %d: readCheckRequest = %v, want a MaxBytesError", length, err)
		}
	}
}

// TestCheckRequestReadError: a body cut short is json's error about it.
func TestCheckRequestReadError(t *testing.T) {
	cut := errors.New("connection reset")
	r := httptest.NewRequest(http.MethodPost, "/v1/check", io.MultiReader(strings.NewReader(`{"ip":"1`), errReader{cut}))
	r.ContentLength = 20
	var req checkRequest
	if err := readCheckRequest(httptest.NewRecorder(), r, &req); !errors.Is(err, cut) {
		t.Errorf("readCheckRequest of a cut body = %v, want %v", err, cut)
	}
}

func FuzzCheckRequestParsing(f *testing.F) {
	for _, b := range checkBodies {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, body string) {
		want, wantErr := decodeLikeBefore(body)
		got, err := readLikeNow(body)
		if !reflect.DeepEqual(want, got) || errText(err) != errText(wantErr) {
			t.Errorf("read %q: %+v, %v; want %+v, %v", body, got, err, want, wantErr)
		}
	})
}

// TestReadAllInto reads what io.ReadAll reads, across buffer growth.
func TestReadAllInto(t *testing.T) {
	s := strings.Repeat("0123456789", 200)
	got, err := readAllInto(make([]byte, 0, 3), strings.NewReader(s))
	if err != nil || !bytes.Equal(got, []byte(s)) {
		t.Errorf("readAllInto = %d bytes, %v; want %d bytes", len(got), err, len(s))
	}
}
