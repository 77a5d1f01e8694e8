// Package event owns the wire contract of a decision event: what a gateway
// publishes for every rate-limit decision and what the consumer stores. The
// contract is decision.proto, beside this file: a record's value is that
// protobuf message and its Header names the schema version.
package event

import "time"

// Version is the schema version this package writes and reads. Version 1
// (a version byte before the message, no header) is no longer read.
const Version = 2

// Header is the Kafka record header that carries a record's schema version,
// in ASCII decimal ("2"). It is a header, not part of the value, so the value
// is plain protobuf that any Kafka tool can decode with decision.proto.
const Header = "edgelimit-schema"

// The enums below number their values as decision.proto does, zero being
// the proto's *_UNSPECIFIED: a Decision that never set one says so.

// KeyKind says what identified the caller.
type KeyKind uint8

// Key kinds.
const (
	KindUnknown KeyKind = iota // not set (KEY_KIND_UNSPECIFIED)
	KindAPIKey
	KindUser
	KindIP
)

// StoreStatus says how the limiter's store answered.
type StoreStatus uint8

// Store statuses.
const (
	StoreUnknown     StoreStatus = iota // not set (STORE_STATUS_UNSPECIFIED)
	StoreOK                             // Redis answered
	StoreUnavailable                    // Redis failed or the circuit is open
	StoreTimeout                        // Redis missed the deadline
	StoreLocalCache                     // the local deny cache answered
)

// Mode says how the decision was enforced.
type Mode uint8

// Modes.
const (
	ModeUnknown       Mode = iota // not set (MODE_UNSPECIFIED)
	ModeEnforced                  // the store decided and the decision stands
	ModeShadow                    // a shadow rule denied; the request went on
	ModeFailOpen                  // the store failed; allowed by policy
	ModeFailClosed                // the store failed; denied by policy
	ModeLocalFallback             // the store failed; decided in local memory
	ModeAdmin                     // no decision: an operator's audit record (Decision.Admin)
	ModeAccounting                // no decision: a gateway's accounting record (Decision.Accounting)
	ModeSettlement                // no decision: what an admitted request used (Decision.Reserved)
)

// Decision is one rate-limit decision. It never holds a raw API key: KeyID
// is a keyed hash (HMAC) of the identity, and KeyName the API key's
// configured id.
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
	// KeyName is the configured id of an API key caller (not a secret);
	// empty for users and IPs.
	KeyName string
	// Domain and Descriptor are set by Envoy's rate limit API only: the
	// request's domain and the checked descriptors' entries, at most
	// MaxDescriptorEntries, secrets already hashed (see decision.proto).
	Domain     string
	Descriptor []DescriptorEntry
	// Admin is set on an operator's audit record only (ModeAdmin).
	Admin AdminAction
	// Accounting is set on a gateway's accounting record only
	// (ModeAccounting).
	Accounting Accounting
	// Seq and SeqEpoch number the decision in its identity's sequence in
	// the shared store (see decision.proto); 0 and zero when none.
	Seq      int64
	SeqEpoch time.Time
	// NATFactor and Split are the directive that changed the decision's
	// rules, as the gateway applied it (see decision.proto); zero and nil
	// when none did.
	NATFactor float64
	Split     []SplitShare
	// Reserved and Settled are set on a settlement record only
	// (ModeSettlement): what the request's check reserved and what its
	// answer used; its Cost is Settled - Reserved.
	Reserved, Settled int64
}

// SplitShare is one gateway's fraction of a split key's limits; Gateway
// "*" stands for every gateway the split does not name.
type SplitShare struct {
	Gateway string
	Share   float64
}

// MaxSplitShares is the most split shares Encode writes and Decode
// accepts.
const MaxSplitShares = 64

// MaxDescriptorEntries is the most descriptor entries Encode writes and
// Decode accepts: it bounds a record whatever a request carried.
const MaxDescriptorEntries = 16

// DescriptorEntry is one key/value pair of an Envoy rate limit descriptor.
type DescriptorEntry struct {
	Key, Value string
}

// AdminAction is an operator's change of a key's limiter state; the zero
// value is none.
type AdminAction struct {
	// Action is "reset", "clear" or "grant" (see decision.proto).
	Action string
	// Actor names the admin token used, never the token.
	Actor string
}

// Accounting is a gateway publisher's running totals since it started (see
// decision.proto); the zero value is none.
type Accounting struct {
	// RunStart is when the publisher started; GatewayID and RunStart name
	// one run.
	RunStart time.Time
	// Decisions is how many decision events the publisher was given,
	// Published how many Kafka acknowledged.
	Decisions, Published int64
	// Dropped by reason.
	DroppedBufferFull, DroppedBrokerError, DroppedEncodeError, DroppedClosed int64
	// Final marks the run's last record, sent as the publisher closes.
	Final bool
}

// Dropped is the drops of every reason.
func (a Accounting) Dropped() int64 {
	return a.DroppedBufferFull + a.DroppedBrokerError + a.DroppedEncodeError + a.DroppedClosed
}
