package outbox

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"regexp"
	"slices"
	"sync"
	"testing"
	"time"
)

var canonicalV7 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// checkV7 fails the test unless id is a canonical UUIDv7 and returns its
// timestamp in milliseconds.
func checkV7(t *testing.T, id string) int64 {
	t.Helper()
	if !canonicalV7.MatchString(id) {
		t.Fatalf("%q is not a canonical lower-case UUIDv7", id)
	}
	u, ok := parseUUID(id)
	if !ok {
		t.Fatalf("parseUUID(%q) failed", id)
	}
	if v := u[6] >> 4; v != 7 {
		t.Fatalf("%s: version %d", id, v)
	}
	if u[8]&0xC0 != 0x80 {
		t.Fatalf("%s: variant bits %02b", id, u[8]>>6)
	}
	return int64(binary.BigEndian.Uint64(append([]byte{0, 0}, u[:6]...)))
}

func TestNewIDIsV7WithTheCurrentTime(t *testing.T) {
	before := time.Now().UnixMilli()
	id := NewID()
	after := time.Now().UnixMilli()
	ms := checkV7(t, id)
	// The generator may run up to a few ms ahead after a burst of ids in
	// this process; allow for it.
	if ms < before || ms > after+100 {
		t.Fatalf("%s: timestamp %d outside [%d, %d]", id, ms, before, after)
	}
}

func TestNewIDIsStrictlyIncreasingAndUnique(t *testing.T) {
	const n = 20000
	ids := make([]string, n)
	for i := range ids {
		ids[i] = NewID()
	}
	for i := 1; i < n; i++ {
		if ids[i] <= ids[i-1] {
			t.Fatalf("id %d %s not after id %d %s", i, ids[i], i-1, ids[i-1])
		}
	}
}

func TestNewIDIsUniqueAcrossGoroutines(t *testing.T) {
	const goroutines, each = 8, 5000
	var wg sync.WaitGroup
	out := make([][]string, goroutines)
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ids := make([]string, each)
			for i := range ids {
				ids[i] = NewID()
			}
			out[g] = ids
		}()
	}
	wg.Wait()
	seen := make(map[string]bool, goroutines*each)
	for g, ids := range out {
		if !slices.IsSorted(ids) {
			t.Fatalf("goroutine %d: ids not increasing", g)
		}
		for _, id := range ids {
			checkV7(t, id)
			if seen[id] {
				t.Fatalf("duplicate id %s", id)
			}
			seen[id] = true
		}
	}
}

// fakeClock is a settable clock for uuidGen.
type fakeClock struct{ ms int64 }

func (c *fakeClock) now() time.Time { return time.UnixMilli(c.ms) }

func TestIDsSortByTimestamp(t *testing.T) {
	clock := &fakeClock{ms: 1_700_000_000_000}
	g := &uuidGen{now: clock.now, rand: rand.Reader}
	var ids []string
	for step := range 50 {
		clock.ms += int64(step % 3) // several ids per millisecond, then on
		id := formatUUID(g.next())
		if ms := checkV7(t, id); ms != clock.ms {
			t.Fatalf("%s: timestamp %d, want %d", id, ms, clock.ms)
		}
		ids = append(ids, id)
	}
	if !slices.IsSorted(ids) {
		t.Fatalf("ids not sorted: %v", ids)
	}
}

func TestCounterOverflowMovesTheTimestampOn(t *testing.T) {
	clock := &fakeClock{ms: 1_700_000_000_000}
	// All-ones random bits seed the counter at its highest start, 0x7FF.
	g := &uuidGen{now: clock.now, rand: bytes.NewReader(bytes.Repeat([]byte{0xFF}, 10*5000))}
	prev := ""
	var last int64
	for i := range 5000 {
		id := formatUUID(g.next())
		last = checkV7(t, id)
		if id <= prev {
			t.Fatalf("id %d %s not after %s", i, id, prev)
		}
		prev = id
	}
	// 0x7FF..0xFFF holds 2049 ids per millisecond.
	if want := clock.ms + 2; last != want {
		t.Fatalf("after 5000 ids in one real millisecond the timestamp is %d, want %d", last, want)
	}
}

func TestClockGoingBackKeepsIDsIncreasing(t *testing.T) {
	clock := &fakeClock{ms: 1_700_000_000_000}
	g := &uuidGen{now: clock.now, rand: rand.Reader}
	a := formatUUID(g.next())
	clock.ms -= 1000
	b := formatUUID(g.next())
	if b <= a {
		t.Fatalf("after the clock went back, %s is not after %s", b, a)
	}
	if ms := checkV7(t, b); ms != clock.ms+1000 {
		t.Fatalf("timestamp went back to %d", ms)
	}
}

func TestParseUUID(t *testing.T) {
	for _, tc := range []struct {
		in   string
		ok   bool
		want string
	}{
		{"0192B3C4-D5E6-7F80-9A1B-2C3D4E5F6071", true, "0192b3c4-d5e6-7f80-9a1b-2c3d4e5f6071"},
		{"0192b3c4-d5e6-7f80-9a1b-2c3d4e5f6071", true, "0192b3c4-d5e6-7f80-9a1b-2c3d4e5f6071"},
		{"0192b3c4d5e67f809a1b2c3d4e5f6071", false, ""},
		{"0192b3c4-d5e6-7f80-9a1b-2c3d4e5f607g", false, ""},
		{"0192b3c4-d5e6-7f80-9a1b+2c3d4e5f6071", false, ""},
		{"order-42", false, ""},
	} {
		u, ok := parseUUID(tc.in)
		if ok != tc.ok {
			t.Errorf("parseUUID(%q) ok = %v", tc.in, ok)
			continue
		}
		if ok && formatUUID(u) != tc.want {
			t.Errorf("parseUUID(%q) = %s, want %s", tc.in, formatUUID(u), tc.want)
		}
	}
}

func BenchmarkNewID(b *testing.B) {
	for b.Loop() {
		_ = NewID()
	}
}
