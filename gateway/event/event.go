// Package event owns the wire contract of a decision event: what a gateway
// publishes for every rate-limit decision and what the consumer stores.
package event

import "time"

// Version is the schema version this package writes. Decoders reject any
// other version with ErrUnknownVersion so the consumer can dead-letter it.
const Version = 1

// KeyKind says what identified the caller.
type KeyKind uint8

// Key kinds.
const (
	KindUnknown KeyKind = iota
	KindAPIKey
	KindUser
	KindIP
)

// StoreStatus says how the limiter's store answered.
type StoreStatus uint8

// Store statuses.
const (
	StoreOK          StoreStatus = iota // Redis answered
	StoreUnavailable                    // Redis failed or the circuit is open
	StoreTimeout                        // Redis missed the deadline
	StoreLocalCache                     // the local deny cache answered
)

// Mode says how the decision was enforced.
type Mode uint8

// Modes.
const (
	ModeEnforced      Mode = iota // the store decided and the decision stands
	ModeShadow                    // a shadow rule denied; the request went on
	ModeFailOpen                  // the store failed; allowed by policy
	ModeFailClosed                // the store failed; denied by policy
	ModeLocalFallback             // the store failed; decided in local memory
)

// Decision is one rate-limit decision. It never holds a raw API key: KeyID
// is a keyed hash (HMAC) of the identity.
type Decision struct {
	ID            [16]byte // unique, time-ordered (48-bit ms time + random)
	Time          time.Time
	GatewayID     string
	KeyID         string
	KeyKind       KeyKind
	ClientIP      string
	UserAgentHash uint64
	Route         string
	Method        string
	Plan          string
	BindingRule   string
	Allowed       bool
	Limit         int64
	Remaining     int64
	Cost          int64
	StoreStatus   StoreStatus
	Mode          Mode
	CheckLatency  time.Duration
}
