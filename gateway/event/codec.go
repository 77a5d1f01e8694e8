package event

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"
)

// The encoding of a Decision, version 1:
//
//	byte 0     the schema version (Version)
//	bytes 1..  a protobuf wire-format message, as if encoded from
//
//	message Decision {
//	  bytes   id             = 1;  // exactly 16 bytes
//	  sint64  time_unix_nano = 2;  // absent when Time.IsZero()
//	  string  gateway_id     = 3;
//	  string  key_id         = 4;
//	  uint32  key_kind       = 5;
//	  string  client_ip      = 6;
//	  fixed64 user_agent_hash = 7;
//	  string  route          = 8;
//	  string  method         = 9;
//	  string  plan           = 10;
//	  string  binding_rule   = 11;
//	  bool    allowed        = 12;
//	  sint64  limit          = 13;
//	  sint64  remaining      = 14;
//	  sint64  cost           = 15;
//	  uint32  store_status   = 16;
//	  uint32  mode           = 17;
//	  sint64  check_latency_ns = 18;
//	}
//
// Fields holding their zero value are left out (proto3 style) and written in
// field-number order. Decoders skip fields they do not know, so a field can be
// added within version 1; removing or changing the meaning of one needs a new
// version. The version byte lets the consumer reject what it cannot read
// before parsing anything else.

// Field numbers of the version 1 message.
const (
	fieldID             = 1
	fieldTime           = 2
	fieldGatewayID      = 3
	fieldKeyID          = 4
	fieldKeyKind        = 5
	fieldClientIP       = 6
	fieldUserAgentHash  = 7
	fieldRoute          = 8
	fieldMethod         = 9
	fieldPlan           = 10
	fieldBindingRule    = 11
	fieldAllowed        = 12
	fieldLimit          = 13
	fieldRemaining      = 14
	fieldCost           = 15
	fieldStoreStatus    = 16
	fieldMode           = 17
	fieldCheckLatencyNS = 18
)

// Protobuf wire types.
const (
	wireVarint  = 0
	wireFixed64 = 1
	wireBytes   = 2
	wireFixed32 = 5
)

// MaxFieldLen is the longest string field Encode writes and Decode accepts,
// in bytes. It bounds a record's size whatever a request carried.
const MaxFieldLen = 1024

// Errors from Encode and Decode. Decode's errors wrap ErrUnknownVersion or
// ErrMalformed, so the consumer can name the dead-letter reason with
// errors.Is.
var (
	// ErrUnknownVersion means the record was written by a schema version this
	// code does not read.
	ErrUnknownVersion = errors.New("event: unknown schema version")
	// ErrMalformed means the bytes are not a valid encoding.
	ErrMalformed = errors.New("event: malformed record")
	// ErrFieldTooLong means a string field exceeds MaxFieldLen.
	ErrFieldTooLong = errors.New("event: field too long")
	// ErrTimeRange means Time cannot be written as int64 Unix nanoseconds
	// (years 1678 to 2262).
	ErrTimeRange = errors.New("event: time out of range")
)

var (
	minTime = time.Unix(0, math.MinInt64)
	maxTime = time.Unix(0, math.MaxInt64)
)

// Encode returns the version-1 encoding of d.
func Encode(d Decision) ([]byte, error) {
	return AppendEncode(make([]byte, 0, 160), d)
}

// AppendEncode appends the encoding of d to dst and returns the extended
// slice. On error it returns dst unchanged.
func AppendEncode(dst []byte, d Decision) ([]byte, error) {
	for _, f := range [...]struct {
		name, v string
	}{
		{"gateway_id", d.GatewayID}, {"key_id", d.KeyID}, {"client_ip", d.ClientIP},
		{"route", d.Route}, {"method", d.Method}, {"plan", d.Plan}, {"binding_rule", d.BindingRule},
	} {
		if len(f.v) > MaxFieldLen {
			return dst, fmt.Errorf("encode %s (%d bytes): %w", f.name, len(f.v), ErrFieldTooLong)
		}
	}
	if !d.Time.IsZero() && (d.Time.Before(minTime) || d.Time.After(maxTime)) {
		return dst, fmt.Errorf("encode time %v: %w", d.Time, ErrTimeRange)
	}

	b := append(dst, Version)
	if d.ID != ([16]byte{}) {
		b = appendBytes(b, fieldID, d.ID[:])
	}
	if !d.Time.IsZero() {
		b = appendTag(b, fieldTime, wireVarint)
		b = binary.AppendUvarint(b, zigzag(d.Time.UnixNano()))
	}
	b = appendString(b, fieldGatewayID, d.GatewayID)
	b = appendString(b, fieldKeyID, d.KeyID)
	b = appendUvarint(b, fieldKeyKind, uint64(d.KeyKind))
	b = appendString(b, fieldClientIP, d.ClientIP)
	if d.UserAgentHash != 0 {
		b = appendTag(b, fieldUserAgentHash, wireFixed64)
		b = binary.LittleEndian.AppendUint64(b, d.UserAgentHash)
	}
	b = appendString(b, fieldRoute, d.Route)
	b = appendString(b, fieldMethod, d.Method)
	b = appendString(b, fieldPlan, d.Plan)
	b = appendString(b, fieldBindingRule, d.BindingRule)
	if d.Allowed {
		b = appendUvarint(b, fieldAllowed, 1)
	}
	b = appendUvarint(b, fieldLimit, zigzag(d.Limit))
	b = appendUvarint(b, fieldRemaining, zigzag(d.Remaining))
	b = appendUvarint(b, fieldCost, zigzag(d.Cost))
	b = appendUvarint(b, fieldStoreStatus, uint64(d.StoreStatus))
	b = appendUvarint(b, fieldMode, uint64(d.Mode))
	b = appendUvarint(b, fieldCheckLatencyNS, zigzag(int64(d.CheckLatency)))
	return b, nil
}

func appendTag(b []byte, field, wire int) []byte {
	return binary.AppendUvarint(b, uint64(field)<<3|uint64(wire))
}

// appendUvarint writes a varint field unless v is zero.
func appendUvarint(b []byte, field int, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = appendTag(b, field, wireVarint)
	return binary.AppendUvarint(b, v)
}

// appendString writes a length-delimited field unless s is empty.
func appendString(b []byte, field int, s string) []byte {
	if s == "" {
		return b
	}
	b = appendTag(b, field, wireBytes)
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendBytes(b []byte, field int, v []byte) []byte {
	b = appendTag(b, field, wireBytes)
	b = binary.AppendUvarint(b, uint64(len(v)))
	return append(b, v...)
}

func zigzag(v int64) uint64   { return uint64(v<<1) ^ uint64(v>>63) }
func unzigzag(v uint64) int64 { return int64(v>>1) ^ -int64(v&1) }

// Decode parses one encoded Decision. It never panics: bytes that are not a
// version-1 encoding give an error wrapping ErrUnknownVersion or
// ErrMalformed. Fields it does not know are skipped.
func Decode(b []byte) (Decision, error) {
	var d Decision
	err := DecodeInto(&d, b)
	return d, err
}

// DecodeInto is Decode writing into d, which it resets first.
func DecodeInto(d *Decision, b []byte) error {
	*d = Decision{}
	if len(b) == 0 {
		return fmt.Errorf("%w: empty", ErrMalformed)
	}
	if b[0] != Version {
		return fmt.Errorf("%w: %d (this build reads %d)", ErrUnknownVersion, b[0], Version)
	}
	r := reader{b: b, i: 1}
	for r.i < len(r.b) {
		tag, err := r.uvarint()
		if err != nil {
			return err
		}
		field, wire := tag>>3, int(tag&7)
		if field == 0 || field > math.MaxInt32 {
			return fmt.Errorf("%w: field number %d at byte %d", ErrMalformed, field, r.i)
		}
		if known, want := wantWire(field); known && wire != want {
			return fmt.Errorf("%w: field %d has wire type %d, want %d", ErrMalformed, field, wire, want)
		}
		switch wire {
		case wireVarint:
			v, err := r.uvarint()
			if err != nil {
				return err
			}
			if err := d.setVarint(field, v); err != nil {
				return err
			}
		case wireFixed64:
			v, err := r.fixed64()
			if err != nil {
				return err
			}
			if field == fieldUserAgentHash {
				d.UserAgentHash = v
			}
		case wireBytes:
			v, err := r.bytes()
			if err != nil {
				return err
			}
			if err := d.setBytes(field, v); err != nil {
				return err
			}
		case wireFixed32:
			if err := r.skip(4); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%w: wire type %d for field %d", ErrMalformed, wire, field)
		}
	}
	return nil
}

// wantWire returns the wire type of a known field.
func wantWire(field uint64) (known bool, wire int) {
	switch field {
	case fieldID, fieldGatewayID, fieldKeyID, fieldClientIP, fieldRoute,
		fieldMethod, fieldPlan, fieldBindingRule:
		return true, wireBytes
	case fieldUserAgentHash:
		return true, wireFixed64
	case fieldTime, fieldKeyKind, fieldAllowed, fieldLimit, fieldRemaining,
		fieldCost, fieldStoreStatus, fieldMode, fieldCheckLatencyNS:
		return true, wireVarint
	}
	return false, 0
}

func (d *Decision) setVarint(field, v uint64) error {
	switch field {
	case fieldTime:
		d.Time = time.Unix(0, unzigzag(v)).UTC()
	case fieldKeyKind:
		if v > math.MaxUint8 {
			return fmt.Errorf("%w: key kind %d", ErrMalformed, v)
		}
		d.KeyKind = KeyKind(v)
	case fieldAllowed:
		if v > 1 {
			return fmt.Errorf("%w: allowed %d", ErrMalformed, v)
		}
		d.Allowed = v == 1
	case fieldLimit:
		d.Limit = unzigzag(v)
	case fieldRemaining:
		d.Remaining = unzigzag(v)
	case fieldCost:
		d.Cost = unzigzag(v)
	case fieldStoreStatus:
		if v > math.MaxUint8 {
			return fmt.Errorf("%w: store status %d", ErrMalformed, v)
		}
		d.StoreStatus = StoreStatus(v)
	case fieldMode:
		if v > math.MaxUint8 {
			return fmt.Errorf("%w: mode %d", ErrMalformed, v)
		}
		d.Mode = Mode(v)
	case fieldCheckLatencyNS:
		d.CheckLatency = time.Duration(unzigzag(v))
	}
	return nil
}

func (d *Decision) setBytes(field uint64, v []byte) error {
	if field == fieldID {
		if len(v) != len(d.ID) {
			return fmt.Errorf("%w: id has %d bytes, want %d", ErrMalformed, len(v), len(d.ID))
		}
		copy(d.ID[:], v)
		return nil
	}
	var s *string
	switch field {
	case fieldGatewayID:
		s = &d.GatewayID
	case fieldKeyID:
		s = &d.KeyID
	case fieldClientIP:
		s = &d.ClientIP
	case fieldRoute:
		s = &d.Route
	case fieldMethod:
		s = &d.Method
	case fieldPlan:
		s = &d.Plan
	case fieldBindingRule:
		s = &d.BindingRule
	default:
		return nil // unknown field, skipped
	}
	if len(v) > MaxFieldLen {
		return fmt.Errorf("%w: field %d has %d bytes, over %d", ErrMalformed, field, len(v), MaxFieldLen)
	}
	*s = string(v)
	return nil
}

// reader walks an encoded message; every method fails with ErrMalformed
// rather than read past the end.
type reader struct {
	b []byte
	i int
}

func (r *reader) uvarint() (uint64, error) {
	v, n := binary.Uvarint(r.b[r.i:])
	if n <= 0 {
		return 0, fmt.Errorf("%w: bad varint at byte %d", ErrMalformed, r.i)
	}
	r.i += n
	return v, nil
}

func (r *reader) fixed64() (uint64, error) {
	if len(r.b)-r.i < 8 {
		return 0, fmt.Errorf("%w: truncated fixed64 at byte %d", ErrMalformed, r.i)
	}
	v := binary.LittleEndian.Uint64(r.b[r.i:])
	r.i += 8
	return v, nil
}

func (r *reader) bytes() ([]byte, error) {
	n, err := r.uvarint()
	if err != nil {
		return nil, err
	}
	if n > uint64(len(r.b)-r.i) {
		return nil, fmt.Errorf("%w: length %d past the end at byte %d", ErrMalformed, n, r.i)
	}
	v := r.b[r.i : r.i+int(n)]
	r.i += int(n)
	return v, nil
}

func (r *reader) skip(n int) error {
	if len(r.b)-r.i < n {
		return fmt.Errorf("%w: truncated at byte %d", ErrMalformed, r.i)
	}
	r.i += n
	return nil
}
