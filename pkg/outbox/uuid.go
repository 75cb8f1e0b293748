package outbox

import (
	"crypto/rand"
	"encoding/hex"
	"io"
	"sync"
	"time"
)

// NewID returns a new UUIDv7 (RFC 9562) in its canonical lower-case form,
// e.g. "01920c4e-7a3b-7c1d-9e2f-3a4b5c6d7e8f".
//
// The first 48 bits are the Unix time in milliseconds, so ids sort by
// creation time, which keeps the outbox's primary key index append-only.
// Within one process ids are strictly increasing: the 12 bits after the
// version are a counter that starts at a random value in each millisecond
// and increments for each id (RFC 9562 section 6.2, method 1); if it runs
// out, the timestamp moves on by one millisecond. The remaining 62 bits are
// random (crypto/rand). NewID is safe for concurrent use.
func NewID() string {
	u := defaultGen.next()
	return formatUUID(u)
}

var defaultGen = &uuidGen{now: time.Now, rand: rand.Reader}

// uuidGen generates UUIDv7 values that increase strictly in the order they
// are handed out.
type uuidGen struct {
	now  func() time.Time
	rand io.Reader

	mu     sync.Mutex
	lastMS int64  // the timestamp of the last id, never decreasing
	seq    uint16 // the 12-bit counter of the last id
}

// maxSeq is the largest value of the 12-bit counter (rand_a).
const maxSeq = 0xFFF

func (g *uuidGen) next() [16]byte {
	// Random bits, read outside the lock: 2 bytes seed the counter, 8 fill
	// rand_b (of which 62 bits are used).
	var r [10]byte
	if _, err := io.ReadFull(g.rand, r[:]); err != nil {
		// crypto/rand.Reader never fails (Go 1.24+); an injected reader
		// that fails is a bug in the caller.
		panic("outbox: reading random bits: " + err.Error())
	}
	// The seed leaves the counter's top bit clear, so that at least 2048
	// ids fit in a millisecond before the timestamp must move on.
	seed := uint16(r[0]&0x07)<<8 | uint16(r[1])

	g.mu.Lock()
	ms := g.now().UnixMilli()
	switch {
	case ms > g.lastMS:
		g.lastMS, g.seq = ms, seed
	case g.seq < maxSeq:
		// Same millisecond, or the clock went back: keep the last
		// timestamp and count on, so ids never go backwards.
		g.seq++
	default:
		g.lastMS++
		g.seq = seed
	}
	ms, seq := g.lastMS, g.seq
	g.mu.Unlock()

	var u [16]byte
	u[0] = byte(ms >> 40)
	u[1] = byte(ms >> 32)
	u[2] = byte(ms >> 24)
	u[3] = byte(ms >> 16)
	u[4] = byte(ms >> 8)
	u[5] = byte(ms)
	u[6] = 0x70 | byte(seq>>8)&0x0F // version 7
	u[7] = byte(seq)
	u[8] = 0x80 | r[2]&0x3F // variant 10
	copy(u[9:], r[3:])
	return u
}

// formatUUID returns u as 8-4-4-4-12 lower-case hex digits.
func formatUUID(u [16]byte) string {
	var b [36]byte
	hex.Encode(b[0:8], u[0:4])
	b[8] = '-'
	hex.Encode(b[9:13], u[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], u[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], u[8:10])
	b[23] = '-'
	hex.Encode(b[24:], u[10:])
	return string(b[:])
}

// hexPos are the offsets of the 16 hex digit pairs in the canonical form.
var hexPos = [16]int{0, 2, 4, 6, 9, 11, 14, 16, 19, 21, 24, 26, 28, 30, 32, 34}

// parseUUID parses the canonical 8-4-4-4-12 form, in either case.
func parseUUID(s string) (u [16]byte, ok bool) {
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return u, false
	}
	for j, i := range hexPos {
		hi, ok1 := unhex(s[i])
		lo, ok2 := unhex(s[i+1])
		if !ok1 || !ok2 {
			return u, false
		}
		u[j] = hi<<4 | lo
	}
	return u, true
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// canonicalID returns a UUID written in the canonical form in lower case,
// as PostgreSQL prints a uuid column, so that table and message modes give
// the same id; any other id is returned unchanged.
func canonicalID(id string) string {
	if u, ok := parseUUID(id); ok {
		return formatUUID(u)
	}
	return id
}
