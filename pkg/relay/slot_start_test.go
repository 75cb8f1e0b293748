package relay

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/replication"
)

// TestSlotAdvancedWhileStartingIsFatal: a session judges the slot as
// Prepare read it, then builds its producer (which can wait long on a
// broker that does not answer) and starts the stream, which begins at the
// slot's position then. Someone who advanced the slot in between skipped
// the events in between: the session reads the slot again once its stream
// holds it, and stops (fatal) without sending or confirming anything.
//
// The simulated harness stands in for the servers: a real one cannot be
// made to advance the slot at exactly that moment on demand.
func TestSlotAdvancedWhileStartingIsFatal(t *testing.T) {
	for seed := range uint64(20) {
		w := newSimWorld(seed)
		w.log = t.Logf
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
		if w.confirmed != w.end() || from == w.confirmed {
			t.Fatalf("seed %d: slot at %s (was %s, advanced to %s)", seed, w.confirmed, from, w.end())
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
