package relay

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/checkpoint"
	"github.com/pgoutbox/pgoutbox/replication"
)

// TestSlotAdvancedWhileStartingIsFatal: a session judges the slot as
// Prepare read it, then builds its producer (which can wait long on a
// broker that does not answer) and starts the stream, which begins at the
// slot's position then. Someone who advanced the slot in between skipped
// the events in between: the session reads the slot again once its stream
// holds it. Without a state table (no fence to judge by) it stops (fatal)
// without sending or confirming anything.
//
// The simulated harness stands in for the servers: a real one cannot be
// made to advance the slot at exactly that moment on demand.
func TestSlotAdvancedWhileStartingIsFatal(t *testing.T) {
	for seed := range uint64(20) {
		w := newSimWorld(seed)
		w.log = t.Logf
		w.cfg.Postgres.StateTable = ""
		w.advanceAtOpen = true
		from := w.confirmed
		err := w.run()
		var fe *FatalError
		if !errors.Is(err, replication.ErrSlotAdvanced) || !errors.As(err, &fe) {
			t.Fatalf("seed %d: Run returned %v; want a fatal ErrSlotAdvanced", seed, err)
		}
		if w.err != nil {
			t.Fatalf("seed %d: %v", seed, w.err)
		}
		if len(w.delivered) != 0 {
			t.Fatalf("seed %d: %d events sent after the slot was found moved", seed, len(w.delivered))
		}
		if mid := w.wal[len(w.wal)/2].commitEnd; w.confirmed != mid || from == w.confirmed {
			t.Fatalf("seed %d: slot at %s (was %s, advanced to %s)", seed, w.confirmed, from, mid)
		}
	}
}

// skewedServer is a backend whose server clock is an hour ahead of the
// relay host's, and that keeps the sessions recorded.
type skewedServer struct {
	backend
	recorded []replication.State
}

const serverSkew = time.Hour

func (b *skewedServer) ReadSlot(ctx context.Context, cfg replication.Config) (replication.SlotState, time.Time, error) {
	st, now, err := b.backend.ReadSlot(ctx, cfg)
	return st, now.Add(serverSkew), err
}

func (b *skewedServer) RecordSession(ctx context.Context, cfg replication.Config, st replication.State) error {
	b.recorded = append(b.recorded, st)
	return b.backend.RecordSession(ctx, cfg, st)
}

// TestSessionStartIsRecordedByTheServersClock: the next start tells a
// server restart since the last session (which may have moved the slot to
// its shutdown checkpoint) from someone moving the slot by comparing the
// server's start time with the recorded session start: both must be the
// server's clock. With the relay host's clock an hour behind the server's,
// a restart an hour after the session would have looked earlier than it.
// (Simulated servers: a real one's clock cannot be set apart on demand.)
func TestSessionStartIsRecordedByTheServersClock(t *testing.T) {
	w := newSimWorld(3)
	w.log = t.Logf
	var sk *skewedServer
	w.wrap = func(b backend) backend { sk = &skewedServer{backend: b}; return sk }
	w.faulty = false
	relayNow := w.now
	if err := w.run(); err != nil || w.err != nil {
		t.Fatalf("run: %v %v", err, w.err)
	}
	if len(sk.recorded) == 0 {
		t.Fatal("no session recorded")
	}
	got := sk.recorded[0].SessionStartedAt
	if got.Sub(relayNow) < serverSkew-time.Minute || got.Sub(relayNow) > serverSkew+time.Minute {
		t.Fatalf("session recorded as started at %s; the relay's clock said %s, the server's %s", got, relayNow, relayNow.Add(serverSkew))
	}
}

// fenceJudge stands in for the state row's fence in the simulated
// harness (which has none): it records whether each start judges the fence,
// and its verdict on the second start is that the slot is past it.
type fenceJudge struct {
	backend
	judged []bool
}

func (b *fenceJudge) Prepare(ctx context.Context, cfg replication.Config) (replication.Start, error) {
	b.judged = append(b.judged, cfg.HoldOnFencePassed)
	if len(b.judged) == 2 && cfg.HoldOnFencePassed {
		return replication.Start{}, fmt.Errorf("%w: past the fence (the harness's verdict)", replication.ErrSlotAdvanced)
	}
	return b.backend.Prepare(ctx, cfg)
}

// TestSlotMovedUnderAStartIsJudgedByTheFence: with a state table, the slot
// found moved once the stream holds it may have been moved by another
// pgoutbox instance that streamed in between (it raises the fence before
// it confirms): the session ends without sending anything, and the next
// start judges the slot by the state row's fence, as after any other
// holder; a slot past the fence then stops the relay (on a real server:
// TestSlotAdvancedByAnotherHolderIsFatal).
func TestSlotMovedUnderAStartIsJudgedByTheFence(t *testing.T) {
	w := newSimWorld(5)
	w.log = t.Logf
	w.faulty = false
	w.advanceAtOpen = true
	if w.cfg.Postgres.StateTable == "" {
		t.Fatal("the default configuration has no state table")
	}
	var j *fenceJudge
	w.wrap = func(b backend) backend { j = &fenceJudge{backend: b}; return j }
	err := w.run()
	if !errors.Is(err, replication.ErrSlotAdvanced) {
		t.Fatalf("Run: %v; want the fence's verdict, ErrSlotAdvanced", err)
	}
	if len(j.judged) != 2 || !j.judged[0] || !j.judged[1] {
		t.Fatalf("starts that judged the fence: %v; want the first and the one after the moved slot", j.judged)
	}
	if len(w.delivered) != 0 {
		t.Fatalf("%d events sent from the moved slot", len(w.delivered))
	}
}

// undecodable is a backend whose streams, after a few messages, return
// what the walsender's next message decodes to: a DecodeError (a message
// type protocol version 1 does not have, say).
type undecodable struct {
	backend
	opens int
}

func (b *undecodable) Open(ctx context.Context, cfg replication.Config, start checkpoint.LSN) (stream, error) {
	st, err := b.backend.Open(ctx, cfg, start)
	b.opens++
	return &undecodableStream{stream: st}, err
}

type undecodableStream struct {
	stream
	n int
}

func (s *undecodableStream) Receive(ctx context.Context, deadline time.Time) (replication.Event, error) {
	if s.n++; s.n > 5 {
		return replication.Event{}, fmt.Errorf("at WAL 0/1: %w", &replication.DecodeError{Type: 'b', Field: "type", Err: errors.New("unknown message type")})
	}
	return s.stream.Receive(ctx, deadline)
}

// TestUndecodableMessageIsFatal: a message the decoder cannot read comes
// again after every restart (the walsender sends the same bytes from the
// slot's position), so the relay stops at once with a fatal error naming
// it, rather than restarting for ever with a warning each time; nothing
// past it is confirmed. (Simulated: a real walsender sends no malformed
// message on demand.)
func TestUndecodableMessageIsFatal(t *testing.T) {
	w := newSimWorld(5)
	w.log = t.Logf
	w.faulty = false
	var u *undecodable
	w.wrap = func(b backend) backend { u = &undecodable{backend: b}; return u }
	err := w.run()
	var fe *FatalError
	var de *replication.DecodeError
	if !errors.As(err, &fe) || !errors.As(err, &de) || !strings.Contains(err.Error(), "cannot read") {
		t.Fatalf("Run returned %v; want a fatal error wrapping the DecodeError", err)
	}
	if w.err != nil {
		t.Fatal(w.err)
	}
	if u.opens != 1 {
		t.Fatalf("the stream was opened %d times: the relay restarted on an undecodable message", u.opens)
	}
}

// failoverServer ends the first stream once the slot is confirmed past the
// first transaction, then moves the slot back for the second start (a
// failover to a standby whose slot lagged) and fails its stream, then
// advances the slot, for the third, to a position between the two (someone
// else moving it while this process is between sessions).
type failoverServer struct {
	backend
	w                  *simWorld
	prepares, opens    int
	firstMax, advanced checkpoint.LSN
}

func (b *failoverServer) Prepare(ctx context.Context, cfg replication.Config) (replication.Start, error) {
	b.prepares++
	w := b.w
	switch b.prepares {
	case 2:
		b.firstMax = w.confirmed
		w.confirmed = simSlotStart
		w.logf("failover: the slot is back at %s (was %s)", w.confirmed, b.firstMax)
	case 3:
		b.advanced = w.wal[0].commitEnd
		w.confirmed = b.advanced
		w.logf("someone advanced the slot to %s", w.confirmed)
	}
	return b.backend.Prepare(ctx, cfg)
}

func (b *failoverServer) Open(ctx context.Context, cfg replication.Config, start checkpoint.LSN) (stream, error) {
	b.opens++
	switch b.opens {
	case 1:
		st, err := b.backend.Open(ctx, cfg, start)
		return &endOnceConfirmed{stream: st, w: b.w, past: b.w.wal[1].commitEnd}, err
	case 2:
		return nil, errors.New("sim: the new primary refused the connection")
	}
	return b.backend.Open(ctx, cfg, start)
}

// endOnceConfirmed is a stream whose connection drops once the slot is
// confirmed at past or beyond.
type endOnceConfirmed struct {
	stream
	w    *simWorld
	past checkpoint.LSN
}

func (s *endOnceConfirmed) Receive(ctx context.Context, deadline time.Time) (replication.Event, error) {
	if s.w.confirmed >= s.past {
		return replication.Event{}, errors.New("sim: connection reset")
	}
	return s.stream.Receive(ctx, deadline)
}

// TestSlotAdvancedAfterAFailoverWithinOneProcessIsFatal: within one
// process, a slot found ahead of the furthest position the process
// confirmed was moved by someone else. After a failover brought the slot
// back, that furthest position is from the old history: kept, it passed a
// slot someone then advanced to below it, and the events in between were
// skipped without a word (and it was written as the fence at stop). The
// third start must stop (fatal) before sending anything. Simulated servers:
// a real failover cannot be timed between two sessions on demand.
func TestSlotAdvancedAfterAFailoverWithinOneProcessIsFatal(t *testing.T) {
	played := 0
	defer func() {
		if played < 10 {
			t.Errorf("the script played out in %d of 20 seeds; want 10 at least", played)
		}
	}()
	for seed := range uint64(20) {
		w := newSimWorld(seed)
		w.log, w.verbose = t.Logf, *simLog
		w.faulty, w.catChange = false, 0
		if len(w.wal) < 3 || w.wal[0].commitEnd >= w.wal[1].commitEnd {
			continue
		}
		var fs *failoverServer
		w.wrap = func(b backend) backend { fs = &failoverServer{backend: b, w: w}; return fs }
		err := w.run()
		if w.err != nil {
			t.Fatalf("seed %d: %v", seed, w.err)
		}
		if err == nil && fs.prepares == 1 {
			// The first session ended (its stop requested) before a
			// receive after the confirmation: nothing to play.
			continue
		}
		played++
		var fe *FatalError
		if !errors.As(err, &fe) || !strings.Contains(err.Error(), "advanced") {
			t.Fatalf("seed %d: Run returned %v after %d starts; want a fatal error saying the slot was advanced", seed, err, fs.prepares)
		}
		if fs.prepares != 3 || fs.firstMax <= fs.advanced {
			t.Fatalf("seed %d: %d starts, first session confirmed %s, slot advanced to %s: the script did not play out", seed, fs.prepares, fs.firstMax, fs.advanced)
		}
	}
}
