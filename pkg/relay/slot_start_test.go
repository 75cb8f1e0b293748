package relay

import (
	"errors"
	"testing"

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
