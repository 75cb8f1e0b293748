package replication

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"go.uber.org/zap"
)

// fakeWalsender is the server side of a loopback connection that a Stream
// reads, for the timing cases a real walsender does not produce on demand
// (a message cut in two by the status deadline, a read blocked when the
// context ends).
func fakeWalsender(t testing.TB) (*Stream, net.Conn) {
	t.Helper()
	return fakeWalsenderWith(t, func(nc net.Conn) net.Conn { return nc })
}

// fakeWalsenderWith is fakeWalsender with the client's socket wrapped.
func fakeWalsenderWith(t testing.TB, wrap func(net.Conn) net.Conn) (*Stream, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() { // ends with the Accept
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server, ok := <-accepted
	if !ok {
		t.Fatal("accept failed")
	}
	nc = wrap(nc)
	pcfg, err := pgconn.ParseConfig("host=127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgconn.Construct(&pgconn.HijackedConn{Conn: nc, Config: pcfg, ParameterStatuses: map[string]string{},
		Frontend: pgproto3.NewFrontend(nc, nc), TxStatus: 'I'})
	if err != nil {
		t.Fatal(err)
	}
	s := &Stream{cfg: Config{Slot: "deadline"}, log: zap.NewNop(), conn: conn, dec: NewDecoder()}
	t.Cleanup(func() {
		_ = s.Close(context.Background())
		_ = server.Close()
	})
	return s, server
}

// TestReceiveReturnsAtTheDeadlineAndResumesAPartialMessage: with nothing to
// read, Receive returns an empty event at the deadline; a message cut in
// two by the deadline is read whole by the next Receive (the deadline is
// set on the socket once per value, and a timeout must not lose bytes).
func TestReceiveReturnsAtTheDeadlineAndResumesAPartialMessage(t *testing.T) {
	s, server := fakeWalsender(t)
	ctx := context.Background()

	start := time.Now()
	ev, err := s.Receive(ctx, start.Add(50*time.Millisecond))
	if err != nil {
		t.Fatalf("Receive at the deadline: %v", err)
	}
	if ev != (Event{}) {
		t.Fatalf("Receive at the deadline returned %+v, want an empty event", ev)
	}
	if took := time.Since(start); took < 50*time.Millisecond || took > 30*time.Second {
		t.Fatalf("Receive returned after %v, want at the 50 ms deadline", took)
	}

	msg := benchXLogData(nil, 0x1000, beginAt(0x1080, 42, time.Now()))
	half := len(msg) / 2
	if _, err := server.Write(msg[:half]); err != nil {
		t.Fatal(err)
	}
	// The first half arrives, the deadline passes mid-message.
	ev, err = s.Receive(ctx, time.Now().Add(100*time.Millisecond))
	if err != nil || ev != (Event{}) {
		t.Fatalf("Receive of half a message: %+v, %v; want an empty event at the deadline", ev, err)
	}
	if _, err := server.Write(msg[half:]); err != nil {
		t.Fatal(err)
	}
	ev, err = s.Receive(ctx, time.Now().Add(time.Hour))
	if err != nil {
		t.Fatalf("Receive of the rest: %v", err)
	}
	if ev.Begin == nil || ev.Begin.XID != 42 || ev.Begin.FinalLSN != 0x1080 {
		t.Fatalf("Receive of the rest returned %+v, want BEGIN of xid 42", ev)
	}

	// A deadline already passed returns at once, and a later one works.
	if ev, err := s.Receive(ctx, time.Now().Add(-time.Second)); err != nil || ev != (Event{}) {
		t.Fatalf("Receive with a passed deadline: %+v, %v", ev, err)
	}
	if _, err := server.Write(benchXLogData(nil, 0x2000, beginAt(0x2080, 43, time.Now()))); err != nil {
		t.Fatal(err)
	}
	if ev, err := s.Receive(ctx, time.Now().Add(time.Hour)); err != nil || ev.Begin == nil || ev.Begin.XID != 43 {
		t.Fatalf("Receive after a passed deadline: %+v, %v; want BEGIN of xid 43", ev, err)
	}
}

// TestReceiveStopsWhenTheContextEnds: a Receive blocked with a deadline an
// hour away returns the context's error soon after the context ends, and
// so does every later Receive with that context.
func TestReceiveStopsWhenTheContextEnds(t *testing.T) {
	s, _ := fakeWalsender(t)
	ctx, cancel := context.WithCancel(context.Background())
	// The cancel may come before or while Receive blocks: both must end it.
	stop := time.AfterFunc(20*time.Millisecond, cancel)
	defer stop.Stop()
	start := time.Now()
	_, err := s.Receive(ctx, start.Add(time.Hour))
	if !errors.Is(err, ErrReceive) || !errors.Is(err, context.Canceled) {
		t.Fatalf("Receive after cancel: %v, want ErrReceive and context.Canceled", err)
	}
	if took := time.Since(start); took > 30*time.Second {
		t.Fatalf("Receive took %v to notice the cancel", took)
	}
	if _, err := s.Receive(ctx, time.Now().Add(time.Hour)); !errors.Is(err, context.Canceled) {
		t.Fatalf("second Receive with the ended context: %v", err)
	}
}

// beginAt is benchBegin with the commit time given.
func beginAt(final uint64, xid uint32, commit time.Time) []byte {
	m := benchBegin(final, xid)
	binary.BigEndian.PutUint64(m[1+8:], uint64(commit.Sub(postgresEpoch)/time.Microsecond))
	return m
}

// TestCatchUpReadingNeverHoldsAMessage: behind (transactions committed a
// minute ago), reads wait for 32 KiB (SO_RCVLOWAT) to spare wake-ups; a
// small message that arrives then must still come out within the short
// catch-up wait, not at the caller's deadline an hour away. Once a
// transaction committed just now arrives, reads wake for every message
// again.
func TestCatchUpReadingNeverHoldsAMessage(t *testing.T) {
	s, server := fakeWalsender(t)
	ctx := context.Background()
	if _, err := server.Write(benchXLogData(nil, 0x1000, beginAt(0x1080, 7, time.Now().Add(-time.Minute)))); err != nil {
		t.Fatal(err)
	}
	ev, err := s.Receive(ctx, time.Now().Add(time.Hour))
	if err != nil || ev.Begin == nil {
		t.Fatalf("first Receive: %+v, %v", ev, err)
	}
	// A Receive whose deadline has passed switches catch-up reading on
	// and returns at once.
	if ev, err := s.Receive(ctx, time.Now().Add(-time.Millisecond)); err != nil || ev != (Event{}) {
		t.Fatalf("Receive with a passed deadline: %+v, %v", ev, err)
	}
	if runtime.GOOS == "linux" {
		if !s.catchingUp {
			t.Fatal("a minute behind, catch-up reading is off")
		}
		if got := recvLowWater(t, s.conn.Conn()); got != catchUpLowWater {
			t.Fatalf("SO_RCVLOWAT = %d while catching up, want %d", got, catchUpLowWater)
		}
	}
	// The small message may arrive before or while Receive waits.
	write := time.AfterFunc(20*time.Millisecond, func() {
		_, _ = server.Write(benchXLogData(nil, 0x1080, benchCommit(0x1080, 0x10a0)))
	})
	defer write.Stop()
	start := time.Now()
	for {
		ev, err := s.Receive(ctx, start.Add(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if ev.Commit != nil {
			break
		}
		if time.Since(start) > 30*time.Second {
			t.Fatal("the small message did not come out in 30 s")
		}
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("the small message came out after %v", took)
	}

	// Caught up: a transaction committed just now.
	if _, err := server.Write(benchXLogData(nil, 0x2000, beginAt(0x2080, 8, time.Now()))); err != nil {
		t.Fatal(err)
	}
	if ev, err := s.Receive(ctx, time.Now().Add(time.Hour)); err != nil || ev.Begin == nil {
		t.Fatalf("Receive of the new transaction: %+v, %v", ev, err)
	}
	if ev, err := s.Receive(ctx, time.Now().Add(-time.Millisecond)); err != nil || ev != (Event{}) {
		t.Fatalf("Receive with a passed deadline: %+v, %v", ev, err)
	}
	if s.catchingUp {
		t.Fatal("caught up, catch-up reading is still on")
	}
	if runtime.GOOS == "linux" {
		if got := recvLowWater(t, s.conn.Conn()); got != 1 {
			t.Fatalf("SO_RCVLOWAT = %d after catching up, want 1", got)
		}
	}
}

func recvLowWater(t *testing.T, c net.Conn) int {
	t.Helper()
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var v int
	var gerr error
	if err := raw.Control(func(fd uintptr) { v, gerr = getRecvLowWater(fd) }); err != nil {
		t.Fatal(err)
	}
	if gerr != nil {
		t.Fatal(gerr)
	}
	return v
}
