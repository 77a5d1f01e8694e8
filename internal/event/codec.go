package event

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
)

// A record's value is the protobuf encoding of decision.proto's Decision
// message, written by hand (protowire's wire types and parsers, no generated
// code): the gateway encodes one per request, and appending into a pooled
// buffer costs no allocation. The tests parse decision.proto and check this
// code against a generic decoder built from it, byte for byte, so the two
// cannot drift apart.
//
// Fields holding their zero value are left out (proto3 style) and written in
// field-number order. Decoders skip fields they do not know, so a field can be
// added within a version; removing or changing the meaning of one needs a new
// version.

// Field numbers of decision.proto's Decision.
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
	fieldKeyName        = 19
	fieldDomain         = 20
	fieldDescriptor     = 21
	fieldAdmin          = 22
	fieldAccounting     = 23
	fieldSeq            = 24
	fieldSeqEpoch       = 25
	fieldNATFactor      = 26
	fieldSplit          = 27
	fieldReserved       = 28
	fieldSettled        = 29
	maxField            = fieldSettled // the highest field number this code knows

	// DescriptorEntry's and AdminAction's fields.
	fieldEntryKey    = 1
	fieldEntryValue  = 2
	fieldAdminAction = 1
	fieldAdminActor  = 2
	fieldShareGW     = 1
	fieldShare       = 2

	// Accounting's fields.
	fieldAcctRunStart    = 1
	fieldAcctDecisions   = 2
	fieldAcctPublished   = 3
	fieldAcctBufferFull  = 4
	fieldAcctBrokerError = 5
	fieldAcctEncodeError = 6
	fieldAcctClosed      = 7
	fieldAcctFinal       = 8
)

// MaxFieldLen is the longest string field Encode writes and Decode accepts,
// in bytes. It bounds a record's size whatever a request carried.
const MaxFieldLen = 1024

// Errors from Encode, Decode and CheckVersion. Decode's errors wrap
// ErrMalformed and CheckVersion's ErrUnknownVersion, so the consumer can name
// the dead-letter reason with errors.Is.
var (
	// ErrUnknownVersion means the record names no schema version, or one
	// this code does not read.
	ErrUnknownVersion = errors.New("event: unknown schema version")
	// ErrMalformed means the bytes are not a valid encoding.
	ErrMalformed = errors.New("event: malformed record")
	// ErrFieldTooLong means a string field exceeds MaxFieldLen.
	ErrFieldTooLong = errors.New("event: field too long")
	// ErrNotUTF8 means a string field is not valid UTF-8, which proto3
	// requires of a string: a standard decoder of decision.proto refuses
	// the record.
	ErrNotUTF8 = errors.New("event: string not valid UTF-8")
	// ErrTimeRange means Time cannot be written as int64 Unix nanoseconds
	// (years 1678 to 2262).
	ErrTimeRange = errors.New("event: time out of range")
)

var (
	minTime = time.Unix(0, math.MinInt64)
	maxTime = time.Unix(0, math.MaxInt64)

	versionText = strconv.Itoa(Version)
)

// HeaderValue returns the value of the Header a record of this version
// carries. Each call returns a new slice, which the caller may keep.
func HeaderValue() []byte { return []byte(versionText) }

// CheckVersion reports whether a record whose Header has value v (nil: the
// record has no such header) is one Decode reads. Its error wraps
// ErrUnknownVersion.
func CheckVersion(v []byte) error {
	switch {
	case v == nil:
		return fmt.Errorf("%w: no %s header", ErrUnknownVersion, Header)
	case string(v) != versionText:
		return fmt.Errorf("%w: %s %q (this build reads %d)", ErrUnknownVersion, Header, v, Version)
	}
	return nil
}

// Encode returns the encoding of d.
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
		{"key_name", d.KeyName},
		{"domain", d.Domain}, {"admin.action", d.Admin.Action}, {"admin.actor", d.Admin.Actor},
	} {
		if len(f.v) > MaxFieldLen || !utf8.ValidString(f.v) {
			return dst, fmt.Errorf("encode %s: %w", f.name, checkString(f.v))
		}
	}
	if len(d.Descriptor) > MaxDescriptorEntries {
		return dst, fmt.Errorf("encode descriptor: %d entries, at most %d: %w", len(d.Descriptor), MaxDescriptorEntries, ErrFieldTooLong)
	}
	for i, e := range d.Descriptor {
		if err := errors.Join(checkString(e.Key), checkString(e.Value)); err != nil {
			return dst, fmt.Errorf("encode descriptor entry %d: %w", i, err)
		}
	}
	if len(d.Split) > MaxSplitShares {
		return dst, fmt.Errorf("encode split: %d shares, at most %d: %w", len(d.Split), MaxSplitShares, ErrFieldTooLong)
	}
	for i, sh := range d.Split {
		if err := checkString(sh.Gateway); err != nil {
			return dst, fmt.Errorf("encode split share %d: %w", i, err)
		}
	}
	for _, t := range [...]time.Time{d.Time, d.Accounting.RunStart, d.SeqEpoch} {
		if !t.IsZero() && (t.Before(minTime) || t.After(maxTime)) {
			return dst, fmt.Errorf("encode time %v: %w", t, ErrTimeRange)
		}
	}

	b := dst
	if d.ID != ([16]byte{}) {
		b = appendTag(b, fieldID, protowire.BytesType)
		b = binary.AppendUvarint(b, uint64(len(d.ID)))
		b = append(b, d.ID[:]...)
	}
	if !d.Time.IsZero() {
		// optional in the .proto: present even when 0 (the Unix epoch).
		b = appendTag(b, fieldTime, protowire.VarintType)
		b = binary.AppendUvarint(b, protowire.EncodeZigZag(d.Time.UnixNano()))
	}
	b = appendString(b, fieldGatewayID, d.GatewayID)
	b = appendString(b, fieldKeyID, d.KeyID)
	b = appendVarintField(b, fieldKeyKind, uint64(d.KeyKind))
	b = appendString(b, fieldClientIP, d.ClientIP)
	if d.UserAgentHash != 0 {
		b = appendTag(b, fieldUserAgentHash, protowire.Fixed64Type)
		b = protowire.AppendFixed64(b, d.UserAgentHash)
	}
	b = appendString(b, fieldRoute, d.Route)
	b = appendString(b, fieldMethod, d.Method)
	b = appendString(b, fieldPlan, d.Plan)
	b = appendString(b, fieldBindingRule, d.BindingRule)
	b = appendVarintField(b, fieldAllowed, protowire.EncodeBool(d.Allowed))
	b = appendVarintField(b, fieldLimit, protowire.EncodeZigZag(d.Limit))
	b = appendVarintField(b, fieldRemaining, protowire.EncodeZigZag(d.Remaining))
	b = appendVarintField(b, fieldCost, protowire.EncodeZigZag(d.Cost))
	b = appendVarintField(b, fieldStoreStatus, uint64(d.StoreStatus))
	b = appendVarintField(b, fieldMode, uint64(d.Mode))
	b = appendVarintField(b, fieldCheckLatencyNS, protowire.EncodeZigZag(int64(d.CheckLatency)))
	b = appendString(b, fieldKeyName, d.KeyName)
	b = appendString(b, fieldDomain, d.Domain)
	for _, e := range d.Descriptor {
		b = appendPair(b, fieldDescriptor, fieldEntryKey, e.Key, fieldEntryValue, e.Value)
	}
	if d.Admin != (AdminAction{}) {
		b = appendPair(b, fieldAdmin, fieldAdminAction, d.Admin.Action, fieldAdminActor, d.Admin.Actor)
	}
	if d.Accounting != (Accounting{}) {
		b = appendAccounting(b, d.Accounting)
	}
	b = appendVarintField(b, fieldSeq, protowire.EncodeZigZag(d.Seq))
	if !d.SeqEpoch.IsZero() {
		b = appendVarintField(b, fieldSeqEpoch, protowire.EncodeZigZag(d.SeqEpoch.UnixNano()))
	}
	if d.NATFactor != 0 {
		b = appendTag(b, fieldNATFactor, protowire.Fixed64Type)
		b = protowire.AppendFixed64(b, math.Float64bits(d.NATFactor))
	}
	for _, sh := range d.Split {
		n := 0
		if sh.Gateway != "" {
			n += protowire.SizeTag(fieldShareGW) + protowire.SizeBytes(len(sh.Gateway))
		}
		if sh.Share != 0 {
			n += protowire.SizeTag(fieldShare) + 8
		}
		b = appendTag(b, fieldSplit, protowire.BytesType)
		b = binary.AppendUvarint(b, uint64(n))
		b = appendString(b, fieldShareGW, sh.Gateway)
		if sh.Share != 0 {
			b = appendTag(b, fieldShare, protowire.Fixed64Type)
			b = protowire.AppendFixed64(b, math.Float64bits(sh.Share))
		}
	}
	b = appendVarintField(b, fieldReserved, protowire.EncodeZigZag(d.Reserved))
	b = appendVarintField(b, fieldSettled, protowire.EncodeZigZag(d.Settled))
	return b, nil
}

// appendAccounting writes a's message, its zero fields left out.
func appendAccounting(b []byte, a Accounting) []byte {
	var start int64
	if !a.RunStart.IsZero() {
		start = a.RunStart.UnixNano()
	}
	fields := [...]struct {
		num protowire.Number
		v   uint64
	}{
		{fieldAcctRunStart, protowire.EncodeZigZag(start)},
		{fieldAcctDecisions, protowire.EncodeZigZag(a.Decisions)},
		{fieldAcctPublished, protowire.EncodeZigZag(a.Published)},
		{fieldAcctBufferFull, protowire.EncodeZigZag(a.DroppedBufferFull)},
		{fieldAcctBrokerError, protowire.EncodeZigZag(a.DroppedBrokerError)},
		{fieldAcctEncodeError, protowire.EncodeZigZag(a.DroppedEncodeError)},
		{fieldAcctClosed, protowire.EncodeZigZag(a.DroppedClosed)},
		{fieldAcctFinal, protowire.EncodeBool(a.Final)},
	}
	n := 0
	for _, f := range fields {
		if f.v != 0 {
			n += protowire.SizeTag(f.num) + protowire.SizeVarint(f.v)
		}
	}
	b = appendTag(b, fieldAccounting, protowire.BytesType)
	b = binary.AppendUvarint(b, uint64(n))
	for _, f := range fields {
		b = appendVarintField(b, f.num, f.v)
	}
	return b
}

// appendPair writes a sub-message of two string fields a and bv, each left
// out when empty; the message itself is written even when both are (a
// repeated entry, or a set message, is present regardless).
func appendPair(b []byte, field, fa protowire.Number, a string, fb protowire.Number, bv string) []byte {
	n := 0
	if a != "" {
		n += protowire.SizeTag(fa) + protowire.SizeBytes(len(a))
	}
	if bv != "" {
		n += protowire.SizeTag(fb) + protowire.SizeBytes(len(bv))
	}
	b = appendTag(b, field, protowire.BytesType)
	b = binary.AppendUvarint(b, uint64(n))
	b = appendString(b, fa, a)
	return appendString(b, fb, bv)
}

// appendVarintField writes a varint field unless v is zero.
func appendVarintField(b []byte, field protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = appendTag(b, field, protowire.VarintType)
	return binary.AppendUvarint(b, v)
}

// appendString writes a length-delimited field unless s is empty.
func appendString(b []byte, field protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = appendTag(b, field, protowire.BytesType)
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// appendTag writes a field's tag, as protowire.AppendTag does. The varints
// here come from encoding/binary: the same base-128 encoding, but small
// enough to inline, where a call to protowire's unrolled encoder per field
// made Encode twice as slow.
func appendTag(b []byte, field protowire.Number, typ protowire.Type) []byte {
	return binary.AppendUvarint(b, uint64(field)<<3|uint64(typ))
}

// Decode parses one encoded Decision. It never panics: bytes that are not a
// valid encoding give an error wrapping ErrMalformed. Fields it does not know
// are skipped. The record's version is CheckVersion's business.
func Decode(b []byte) (Decision, error) {
	var d Decision
	err := DecodeInto(&d, b)
	return d, err
}

// DecodeInto is Decode writing into d, which it resets first.
func DecodeInto(d *Decision, b []byte) error {
	*d = Decision{}
	// Where the plain fields go, by field number, each as a pointer whose
	// type says how it is read: string, sint64 (every integer of
	// decision.proto is one) or an enum. The other fields have cases of
	// their own below.
	plain := [maxField + 1]any{
		fieldGatewayID: &d.GatewayID, fieldKeyID: &d.KeyID, fieldKeyKind: (*uint8)(&d.KeyKind),
		fieldClientIP: &d.ClientIP, fieldRoute: &d.Route, fieldMethod: &d.Method, fieldPlan: &d.Plan,
		fieldBindingRule: &d.BindingRule, fieldLimit: &d.Limit, fieldRemaining: &d.Remaining,
		fieldCost: &d.Cost, fieldStoreStatus: (*uint8)(&d.StoreStatus), fieldMode: (*uint8)(&d.Mode),
		fieldCheckLatencyNS: (*int64)(&d.CheckLatency), fieldKeyName: &d.KeyName, fieldDomain: &d.Domain,
		fieldSeq: &d.Seq, fieldReserved: &d.Reserved, fieldSettled: &d.Settled,
	}
	r := reader{b: b}
	for len(r.b) > 0 {
		tag, n := consumeVarint(r.b)
		num, typ := protowire.DecodeTag(tag)
		if n > 0 && num < protowire.MinValidNumber {
			n = -1 // as protowire.ConsumeTag: not a field number
		}
		if n < 0 {
			return fmt.Errorf("%w: bad tag", ErrMalformed)
		}
		r.b = r.b[n:]
		r.typ = typ
		var dst any
		if num <= maxField {
			dst = plain[num]
		}
		var err error
		switch dst := dst.(type) {
		case *string:
			err = r.string(dst)
		case *int64:
			err = r.sint64(dst)
		case *uint8:
			err = r.enum(dst)
		default:
			err = r.other(d, num)
		}
		if err != nil {
			return fmt.Errorf("%w: field %d: %w", ErrMalformed, num, err)
		}
	}
	return nil
}

// other reads field num of d, one that is not a plain field of
// DecodeInto's, skipping a field this code does not know.
func (r *reader) other(d *Decision, num protowire.Number) error {
	switch num {
	case fieldID:
		return r.id(&d.ID)
	case fieldTime:
		var ns int64
		err := r.sint64(&ns)
		if err == nil {
			d.Time = time.Unix(0, ns).UTC()
		}
		return err
	case fieldUserAgentHash:
		return r.fixed64(&d.UserAgentHash)
	case fieldAllowed:
		return r.bool(&d.Allowed)
	case fieldDescriptor:
		if len(d.Descriptor) == MaxDescriptorEntries {
			return fmt.Errorf("more than %d descriptor entries", MaxDescriptorEntries)
		}
		var e DescriptorEntry
		err := r.pair(fieldEntryKey, &e.Key, fieldEntryValue, &e.Value)
		if err == nil {
			d.Descriptor = append(d.Descriptor, e)
		}
		return err
	case fieldAdmin:
		// A message field met twice merges, as protobuf's do.
		return r.pair(fieldAdminAction, &d.Admin.Action, fieldAdminActor, &d.Admin.Actor)
	case fieldAccounting:
		return r.accounting(&d.Accounting)
	case fieldSeqEpoch:
		var ns int64
		err := r.sint64(&ns)
		if err == nil {
			d.SeqEpoch = time.Unix(0, ns).UTC()
		}
		return err
	case fieldNATFactor:
		return r.double(&d.NATFactor)
	case fieldSplit:
		if len(d.Split) == MaxSplitShares {
			return fmt.Errorf("more than %d split shares", MaxSplitShares)
		}
		var sh SplitShare
		err := r.message(func(sub *reader, num protowire.Number) (bool, error) {
			switch num {
			case fieldShareGW:
				return true, sub.string(&sh.Gateway)
			case fieldShare:
				return true, sub.double(&sh.Share)
			}
			return false, nil
		})
		if err == nil {
			d.Split = append(d.Split, sh)
		}
		return err
	}
	// A newer writer's field: skip it, whatever its wire type.
	n := protowire.ConsumeFieldValue(num, r.typ, r.b)
	if n < 0 {
		return protowire.ParseError(n)
	}
	r.b = r.b[n:]
	return nil
}

// reader consumes one field value at a time from b; typ is the wire type of
// the field whose tag was just read. Each method checks that type, so a
// field written with the wrong one is malformed rather than misread.
type reader struct {
	b   []byte
	typ protowire.Type
}

func (r *reader) want(t protowire.Type) error {
	if r.typ != t {
		return fmt.Errorf("wire type %d, want %d", r.typ, t)
	}
	return nil
}

func (r *reader) varint() (uint64, error) {
	if err := r.want(protowire.VarintType); err != nil {
		return 0, err
	}
	v, n := consumeVarint(r.b)
	if n < 0 {
		return 0, protowire.ParseError(n)
	}
	r.b = r.b[n:]
	return v, nil
}

// consumeVarint is protowire.ConsumeVarint with the one-byte case (most
// tags and enum values) inlined: the call otherwise costs Decode a fifth of
// its time.
func consumeVarint(b []byte) (uint64, int) {
	if len(b) > 0 && b[0] < 0x80 {
		return uint64(b[0]), 1
	}
	return protowire.ConsumeVarint(b)
}

func (r *reader) bytes() ([]byte, error) {
	if err := r.want(protowire.BytesType); err != nil {
		return nil, err
	}
	v, n := protowire.ConsumeBytes(r.b)
	if n < 0 {
		return nil, protowire.ParseError(n)
	}
	r.b = r.b[n:]
	return v, nil
}

func (r *reader) sint64(dst *int64) error {
	v, err := r.varint()
	*dst = protowire.DecodeZigZag(v)
	return err
}

// bool reads any non-zero varint as true, as every protobuf decoder does.
func (r *reader) bool(dst *bool) error {
	v, err := r.varint()
	*dst = protowire.DecodeBool(v)
	return err
}

// enum reads an enum value; the Go enums are uint8, so a larger one is
// malformed rather than truncated.
func (r *reader) enum(dst *uint8) error {
	v, err := r.varint()
	if err == nil && v > math.MaxUint8 {
		return fmt.Errorf("enum value %d", v)
	}
	*dst = uint8(v)
	return err
}

// double reads a protobuf double (a little-endian IEEE 754 fixed64).
func (r *reader) double(dst *float64) error {
	var bits uint64
	err := r.fixed64(&bits)
	*dst = math.Float64frombits(bits)
	return err
}

func (r *reader) fixed64(dst *uint64) error {
	if err := r.want(protowire.Fixed64Type); err != nil {
		return err
	}
	v, n := protowire.ConsumeFixed64(r.b)
	if n < 0 {
		return protowire.ParseError(n)
	}
	r.b = r.b[n:]
	*dst = v
	return nil
}

func (r *reader) string(dst *string) error {
	v, err := r.bytes()
	if err != nil {
		return err
	}
	// checkString's rules, checked before the string is allocated.
	if len(v) > MaxFieldLen {
		return fmt.Errorf("%d bytes, over %d: %w", len(v), MaxFieldLen, ErrFieldTooLong)
	}
	if !utf8.Valid(v) {
		return ErrNotUTF8
	}
	*dst = string(v)
	return nil
}

// checkString is what Encode and Decode require of every string field: at
// most MaxFieldLen bytes, and valid UTF-8 as proto3 has it, so that what one
// writes the other (and any decoder of decision.proto) reads.
func checkString(s string) error {
	if len(s) > MaxFieldLen {
		return fmt.Errorf("%d bytes, over %d: %w", len(s), MaxFieldLen, ErrFieldTooLong)
	}
	if !utf8.ValidString(s) {
		return ErrNotUTF8
	}
	return nil
}

// pair reads a sub-message of two string fields, fa into a and fb into b,
// skipping fields it does not know.
func (r *reader) pair(fa protowire.Number, a *string, fb protowire.Number, b *string) error {
	return r.message(func(sub *reader, num protowire.Number) (bool, error) {
		switch num {
		case fa:
			return true, sub.string(a)
		case fb:
			return true, sub.string(b)
		}
		return false, nil
	})
}

// accounting reads an Accounting message into a (merging, as protobuf
// does with a message met twice), skipping fields it does not know.
func (r *reader) accounting(a *Accounting) error {
	return r.message(func(sub *reader, num protowire.Number) (bool, error) {
		var dst *int64
		switch num {
		case fieldAcctRunStart:
			var ns int64
			err := sub.sint64(&ns)
			a.RunStart = time.Unix(0, ns).UTC()
			return true, err
		case fieldAcctFinal:
			return true, sub.bool(&a.Final)
		case fieldAcctDecisions:
			dst = &a.Decisions
		case fieldAcctPublished:
			dst = &a.Published
		case fieldAcctBufferFull:
			dst = &a.DroppedBufferFull
		case fieldAcctBrokerError:
			dst = &a.DroppedBrokerError
		case fieldAcctEncodeError:
			dst = &a.DroppedEncodeError
		case fieldAcctClosed:
			dst = &a.DroppedClosed
		default:
			return false, nil
		}
		return true, sub.sint64(dst)
	})
}

// message reads a sub-message, handing each field to field, which reads
// it and says so, or leaves it to be skipped.
func (r *reader) message(field func(sub *reader, num protowire.Number) (bool, error)) error {
	v, err := r.bytes()
	if err != nil {
		return err
	}
	sub := reader{b: v}
	for len(sub.b) > 0 {
		num, typ, n := protowire.ConsumeTag(sub.b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		sub.b, sub.typ = sub.b[n:], typ
		read, err := field(&sub, num)
		if err != nil {
			return fmt.Errorf("field %d: %w", num, err)
		}
		if !read {
			n := protowire.ConsumeFieldValue(num, typ, sub.b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			sub.b = sub.b[n:]
		}
	}
	return nil
}

func (r *reader) id(dst *[16]byte) error {
	v, err := r.bytes()
	if err != nil {
		return err
	}
	if len(v) != len(dst) {
		return fmt.Errorf("id has %d bytes, want %d", len(v), len(dst))
	}
	copy(dst[:], v)
	return nil
}
