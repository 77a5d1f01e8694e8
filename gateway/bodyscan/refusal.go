package bodyscan

import "net/http"

// A Refusal ends a scanned body before the upstream has it whole: the
// scanner returns it in place of the body's last bytes, and the gateway
// answers with its status, after the decision and so with its rate-limit
// headers. Reason names it in metrics and picks its problem type.
type Refusal struct {
	Reason string
	Status int
	Detail string
}

func (e *Refusal) Error() string { return e.Detail }

// The reasons a scanned body is refused.
var (
	// ErrMethodOverride: a POST's form or JSON names another route's method.
	ErrMethodOverride = &Refusal{"method_override", http.StatusBadRequest,
		"The body names, as _method (or X-HTTP-Method-Override), a method that this gateway limits on another route than POST; frameworks that honour it would run the request as that method. Send that method itself."}
	// ErrKey: a form or JSON field names an API key other than the one
	// the request was charged to: Laravel's input(), PHP's $_REQUEST and
	// Rails' params read it, so the upstream could serve the request as
	// that key.
	ErrKey = &Refusal{"ambiguous_key", http.StatusBadRequest,
		"The body carries an API key (api_key, access_token, …) other than the one this request was charged to; send one key, in X-API-Key, Authorization: Bearer or the query."}
	// ErrKeyOnly: a body names an API key where the request carried none,
	// and was charged to its address or user.
	ErrKeyOnly = &Refusal{"ambiguous_key", http.StatusBadRequest,
		"The body carries an API key (api_key, access_token, …), which this gateway does not identify callers by: the request was charged to its address, not to that key. Send the key in X-API-Key, Authorization: Bearer or the query."}
	// ErrTooLarge: the body inflates past the bound, past which the
	// gateway would no longer read what the upstream inflates.
	ErrTooLarge = &Refusal{"body_too_large", http.StatusRequestEntityTooLarge,
		"The request body, decoded as its Content-Encoding says, is larger than this gateway accepts."}
	// ErrMalformed: the body cannot be read to its end (a multipart form
	// broken before its closing boundary, a corrupt compressed stream):
	// what the upstream reads past that point, the gateway could not.
	ErrMalformed = &Refusal{"malformed_body", http.StatusBadRequest,
		"The request body cannot be read to its end as its Content-Type and Content-Encoding say (a malformed multipart form or compressed stream)."}
	// errContentTypes: two different Content-Type fields, which upstreams
	// read differently.
	errContentTypes = &Refusal{"ambiguous_content_type", http.StatusBadRequest,
		"The request has two different Content-Type fields, which services behind this gateway could read differently; send one."}
	// errJSONCharset: a JSON body in UTF-16 or UTF-32.
	errJSONCharset = &Refusal{"unsupported_charset", http.StatusUnsupportedMediaType,
		"The JSON body is in UTF-16 or UTF-32, which this gateway does not read, and it must read this body; send UTF-8."}
)

func unsupportedEncoding(detail string) *Refusal {
	return &Refusal{"unsupported_encoding", http.StatusUnsupportedMediaType, detail}
}
