package replication

import (
	"bytes"
	"context"
	"errors"
	"net"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// scriptedConn is a socket whose reads return what the script says, in
// order, and record when they were made (by the test's clock): the pacing
// is a matter of when reads start, which a real socket cannot script.
type scriptedConn struct {
	net.Conn
	reads [][]byte // what each read returns (it fills at most len(b))
	clock *fakeClock
	at    []time.Duration // when each read started, from the clock's start
}

func (c *scriptedConn) Read(b []byte) (int, error) {
	c.at = append(c.at, c.clock.t.Sub(c.clock.start))
	r := c.reads[0]
	c.reads = c.reads[1:]
	return copy(b, r), nil
}

type fakeClock struct{ start, t time.Time }

func (f *fakeClock) now() time.Time          { return f.t }
func (f *fakeClock) sleep(d time.Duration)   { f.t = f.t.Add(d) }
func (f *fakeClock) advance(d time.Duration) { f.t = f.t.Add(d) }

// TestPacedReadsWaitAfterAReadThatEmptiedTheSocket: a read that returns
// less than it had room for (the socket is empty) makes the next read start
// wait later, less the time spent in between; a read that fills its buffer
// (more is queued) lets the next start at once, and so does pacing off.
func TestPacedReadsWaitAfterAReadThatEmptiedTheSocket(t *testing.T) {
	const wait = 5 * time.Millisecond
	clock := &fakeClock{start: time.Unix(1000, 0), t: time.Unix(1000, 0)}
	full := bytes.Repeat([]byte{'x'}, 8)
	sc := &scriptedConn{clock: clock, reads: [][]byte{
		[]byte("B"),  // short: the socket is empty
		[]byte("RC"), // 5 ms later; short again
		full,         // 5 ms later (2 of them spent processing); full
		full,         // at once
		[]byte("B"),  // at once; short
		[]byte("B"),  // pacing off: at once
	}}
	var marks []int
	p := &pacedConn{Conn: sc, wait: wait, now: clock.now, sleep: clock.sleep,
		lowWater: func(n int) bool { marks = append(marks, n); return true }}
	p.set(true)
	buf := make([]byte, 8)
	read := func() {
		t.Helper()
		if _, err := p.Read(buf); err != nil {
			t.Fatal(err)
		}
	}
	read()
	read()
	clock.advance(2 * time.Millisecond) // processing what was read
	read()
	read()
	read()
	p.set(false)
	read()
	want := []time.Duration{0, 5 * time.Millisecond, 10 * time.Millisecond, 10 * time.Millisecond, 10 * time.Millisecond, 10 * time.Millisecond}
	for i, at := range sc.at {
		if at != want[i] {
			t.Fatalf("read %d started at %v, want %v (all: %v)", i+1, at, want[i], sc.at)
		}
	}
	// The mark goes up after each short read and down before the next
	// read, and down when pacing is switched off.
	wantMarks := []int{paceLowWater, 1, paceLowWater, 1, paceLowWater, 1}
	if !slices.Equal(marks, wantMarks) {
		t.Fatalf("low-water marks set: %v, want %v", marks, wantMarks)
	}
}

// TestPacingIsOffWhileCatchingUp: catching up, the low-water mark gathers
// reads and pacing would only add to it; caught up again, pacing is back.
func TestPacingIsOffWhileCatchingUp(t *testing.T) {
	s, _ := fakeWalsender(t)
	s.pace = newPacedConn(nil, time.Millisecond)
	s.pace.set(true)
	s.setCatchingUp(true)
	if s.catchingUp && s.pace.on {
		t.Fatal("catching up, and reads are paced")
	}
	s.setCatchingUp(false)
	if !s.pace.on {
		t.Fatal("caught up, and reads are not paced")
	}
}

// TestPacedReadsNeverHoldALoneMessage: on a real socket, a paced read
// raises the low-water mark while it waits, and must lower it before it
// reads: a lone COMMIT (a few bytes, nothing after it) comes out, not at
// the caller's deadline.
func TestPacedReadsNeverHoldALoneMessage(t *testing.T) {
	const wait = 20 * time.Millisecond
	var pc *pacedConn
	s, server := fakeWalsenderWith(t, func(nc net.Conn) net.Conn {
		pc = newPacedConn(nc, wait)
		return pc
	})
	s.pace = pc
	s.pace.set(true)
	ctx := context.Background()
	if _, err := server.Write(benchXLogData(nil, 0x1000, beginAt(0x1080, 7, time.Now()))); err != nil {
		t.Fatal(err)
	}
	ev, err := s.Receive(ctx, time.Now().Add(10*time.Second))
	if err != nil || ev.Begin == nil {
		t.Fatalf("Receive of BEGIN: %+v, %v", ev, err)
	}
	if runtime.GOOS == "linux" {
		if got := recvLowWater(t, underlying(s.conn.Conn())); got != paceLowWater {
			t.Fatalf("SO_RCVLOWAT = %d after a short paced read, want %d", got, paceLowWater)
		}
	}
	// The COMMIT is written while the next read waits, or after it has
	// started; either way it is the only thing queued.
	write := time.AfterFunc(wait+30*time.Millisecond, func() {
		_, _ = server.Write(benchXLogData(nil, 0x1080, benchCommit(0x1080, 0x10a0)))
	})
	defer write.Stop()
	start := time.Now()
	ev, err = s.Receive(ctx, start.Add(10*time.Second))
	if err != nil || ev.Commit == nil {
		t.Fatalf("Receive of the lone COMMIT after %v: %+v, %v", time.Since(start), ev, err)
	}
	if took := time.Since(start); took < wait {
		t.Fatalf("the paced read started after %v, before the %v wait", took, wait)
	}
}

// TestReceiveBatchWaitIsBoundedAndWrapsOnlyTheReplicationSocket: 5 ms by
// default, 0 turns pacing off (the socket is not wrapped), and a wait
// that is negative or above 100 ms is refused by name.
func TestReceiveBatchWaitIsBoundedAndWrapsOnlyTheReplicationSocket(t *testing.T) {
	cfg := DefaultConfig()
	cfg.DSN = "host=127.0.0.1 user=x"
	if cfg.ReceiveBatchWait != 5*time.Millisecond {
		t.Fatalf("default receive.batch.wait %v, want 5ms", cfg.ReceiveBatchWait)
	}
	for _, w := range []time.Duration{0, time.Millisecond, maxReceiveBatchWait} {
		cfg.ReceiveBatchWait = w
		if err := cfg.Validate(); err != nil {
			t.Fatalf("receive.batch.wait %v refused: %v", w, err)
		}
	}
	for _, w := range []time.Duration{-time.Millisecond, maxReceiveBatchWait + time.Millisecond} {
		cfg.ReceiveBatchWait = w
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "receive.batch.wait") {
			t.Fatalf("receive.batch.wait %v: want an error naming it, got %v", w, err)
		}
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() { // ends when the listener closes
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	for _, w := range []time.Duration{0, 5 * time.Millisecond} {
		cfg.ReceiveBatchWait = w
		pcfg, err := cfg.replicationConfig()
		if err != nil {
			t.Fatal(err)
		}
		nc, err := pcfg.DialFunc(context.Background(), "tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		p := pacer(nc)
		nc.Close()
		if (p != nil) != (w > 0) {
			t.Fatalf("receive.batch.wait %v: socket paced %v", w, p != nil)
		}
		if p != nil && p.wait != w {
			t.Fatalf("paced with %v, want %v", p.wait, w)
		}
		if _, ok := underlying(nc).(*net.TCPConn); !ok {
			t.Fatalf("the socket under the pacing is %T, want *net.TCPConn", underlying(nc))
		}
	}
}

// TestAMarkThatCannotBeLoweredEndsTheRead: a read with the mark stuck up
// would hold messages until the deadline; it fails instead, so that the
// session reconnects.
func TestAMarkThatCannotBeLoweredEndsTheRead(t *testing.T) {
	clock := &fakeClock{start: time.Unix(1000, 0), t: time.Unix(1000, 0)}
	sc := &scriptedConn{clock: clock, reads: [][]byte{[]byte("B"), []byte("C")}}
	stuck := false
	p := &pacedConn{Conn: sc, wait: time.Millisecond, now: clock.now, sleep: clock.sleep,
		lowWater: func(n int) bool { return n != 1 || !stuck }}
	p.set(true)
	buf := make([]byte, 8)
	if _, err := p.Read(buf); err != nil {
		t.Fatal(err)
	}
	stuck = true
	if _, err := p.Read(buf); !errors.Is(err, errLowWater) {
		t.Fatalf("read with the mark stuck up: %v, want errLowWater", err)
	}
	if len(sc.at) != 1 {
		t.Fatalf("the socket was read %d times, want 1", len(sc.at))
	}
}
