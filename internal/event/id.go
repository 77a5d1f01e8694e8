package event

import (
	"encoding/binary"
	"encoding/hex"
	"math/rand/v2"
	"time"
)

// NewID returns a unique, time-ordered event id laid out as a UUIDv7 (RFC
// 9562): 48 bits of Unix milliseconds from now, the version and variant
// bits, and 74 random bits. Ids sort by their millisecond; within one
// millisecond their order is random. With 74 random bits, two gateways
// colliding in the same millisecond is not a practical concern (it takes
// about 2^37 ids in one millisecond for an even chance).
//
// The random bits come from math/rand/v2's per-thread ChaCha8 generator,
// seeded from the OS: unpredictable enough for an id, and lock-free on the
// request path. The ids are not secrets.
func NewID(now time.Time) [16]byte {
	var id [16]byte
	ms := uint64(now.UnixMilli())
	binary.BigEndian.PutUint64(id[0:8], ms<<16|rand.Uint64()&0xffff)
	binary.BigEndian.PutUint64(id[8:16], rand.Uint64())
	id[6] = id[6]&0x0f | 0x70 // version 7
	id[8] = id[8]&0x3f | 0x80 // variant 10
	return id
}

// IDTime returns the millisecond timestamp NewID stored in id.
func IDTime(id [16]byte) time.Time {
	ms := int64(binary.BigEndian.Uint64(id[0:8]) >> 16)
	return time.UnixMilli(ms).UTC()
}

// FormatID returns id in the canonical UUID text form,
// xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx.
func FormatID(id [16]byte) string {
	var b [36]byte
	hex.Encode(b[0:8], id[0:4])
	b[8] = '-'
	hex.Encode(b[9:13], id[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], id[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], id[8:10])
	b[23] = '-'
	hex.Encode(b[24:], id[10:])
	return string(b[:])
}
