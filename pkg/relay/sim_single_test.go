package relay

import (
	"errors"
	"testing"

	"github.com/pgoutbox/pgoutbox/checkpoint"
)

// A record Kafka refuses even alone, in the last transaction read, whose
// commit record begins exactly where the slot's confirmed position lies:
// where the transaction before ends (two commits back to back), or where an
// idle keepalive put it. The batch it was in is refused, the relay resends
// one record per request until past that transaction, and the record alone
// is poison. The harness, not a real broker: a broker refuses a whole batch
// for one record only for what that record is, and the order of commits
// and keepalives has to be exact.
//
// Single-record mode once ended as soon as the confirmed position reached
// the refused transaction's commit record's start, before resending it:
// the next session batched it again, and the relay restarted for ever
// without naming the record.
func TestSimulatedSingleRecordModeReachesARecordRefusedAlone(t *testing.T) {
	for _, policy := range []string{"fail", "dead-letter"} {
		for _, gap := range []checkpoint.LSN{0, 8} {
			for seed := uint64(1); seed <= 40; seed++ {
				w := newSimWorld(seed)
				w.failAfter, w.tooLarge, w.missing, w.catChange, w.faulty = false, false, "", 0, false
				w.cfg.Relay.PoisonPolicy = policy
				a := simSlotStart + 0x100
				first := simEntry{kind: 't', commitStart: a, commitEnd: a + 32,
					events: []simEvent{{id: "e0000", key: "k1", topic: "outbox.event.Order", seq: 0}}}
				refused := simEntry{kind: 't', commitStart: a + 32 + gap, commitEnd: a + 64 + gap,
					events: []simEvent{{id: "e0001", key: "k2", topic: "outbox.event.Order", seq: 1}}}
				w.wal = []simEntry{first, refused}
				w.refuse = "e0001"
				w.verbose, w.log = *simLog, t.Logf
				err := w.run()
				if w.err != nil {
					t.Fatalf("%s, gap %d, seed %d: %v", policy, gap, seed, w.err)
				}
				var fe *FatalError
				var pe *ProduceError
				switch policy {
				case "fail":
					if !errors.As(err, &fe) || !errors.As(err, &pe) || pe.EventID != "e0001" {
						t.Fatalf("%s, gap %d, seed %d: Run returned %v, want a fatal error naming event e0001", policy, gap, seed, err)
					}
				case "dead-letter":
					if err != nil || !w.dlq["e0001"] || !w.delivered["e0000"] {
						t.Fatalf("%s, gap %d, seed %d: Run returned %v, dead-lettered %v, delivered %v; want e0001 dead-lettered and e0000 delivered",
							policy, gap, seed, err, w.dlq, w.delivered)
					}
				}
			}
		}
	}
}
