package relay

import (
	"fmt"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/checkpoint"
)

// TestSimulatedTransactionsWithoutRecordsAreCapped: while Kafka holds back
// the oldest record's acknowledgement (sarama retries for minutes),
// transactions without records (updates of the outbox here; other tables'
// in a FOR ALL TABLES publication) were read on without bound, each taking
// a place in the tracker and the session's list of commits: the in-flight
// caps count records and bytes only. The relay now stops reading WAL at a
// cap of pending transactions, and reads on once the oldest is confirmed;
// nothing is lost. The harness stands in for a broker that holds one
// acknowledgement back for ten minutes.
func TestSimulatedTransactionsWithoutRecordsAreCapped(t *testing.T) {
	const limit = 50
	for seed := uint64(1); seed <= 10; seed++ {
		w := newSimWorld(seed)
		w.failAfter, w.tooLarge, w.missing, w.catChange, w.faulty = false, false, "", 0, false
		w.log, w.verbose = t.Logf, *simLog
		w.maxPending = limit
		lsn := simSlotStart + 0x100
		w.wal = nil
		for i := 0; i < 300; i++ {
			ev := simEvent{id: fmt.Sprintf("e%04d", i), key: "k1", topic: "outbox.event.Order", seq: i, update: i > 0 && i < 299}
			w.wal = append(w.wal, simEntry{kind: 't', commitStart: lsn, commitEnd: lsn + 32, events: []simEvent{ev}})
			lsn += 40
		}
		w.holdAck, w.holdUntil = "e0000", w.now.Add(10*time.Minute)
		if err := w.run(); err != nil || w.err != nil {
			t.Fatalf("seed %d: run: %v %v", seed, err, w.err)
		}
		if w.sentWhileHeld > limit+2 {
			t.Fatalf("seed %d: %d transactions read while the oldest record waited for Kafka; the cap is %d", seed, w.sentWhileHeld, limit)
		}
		if !w.delivered["e0000"] || !w.delivered["e0299"] || w.confirmed < checkpoint.LSN(lsn-8) {
			t.Fatalf("seed %d: delivered %v, confirmed %s; want both events and the slot at the end", seed, w.delivered, w.confirmed)
		}
	}
}
