package relay

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/checkpoint"
	"github.com/pgoutbox/pgoutbox/pkg/kafka"
)

// TestSimulatedExactlyOnceRefusesToSkipATransactionCommittedAfterTheStoredPosition:
// exactly-once skips the transactions before the position the offsets topic
// holds, as Kafka has them. A database put back to an earlier point (a
// restore from a disk snapshot, which starts no new timeline) and written
// past that position again before pgoutbox starts holds new transactions
// there: the end of its WAL no longer tells. Their commit times do: they
// committed after the position was written. The start stops, naming the
// transaction; a transaction that committed before (a crash between
// Kafka's commit and the slot's confirmation) is skipped as before. The
// harness, not a real server: the offsets record's time and the commit
// times are set by the script.
func TestSimulatedExactlyOnceRefusesToSkipATransactionCommittedAfterTheStoredPosition(t *testing.T) {
	written := time.Unix(1_700_000_000, 0).Add(-time.Hour)
	for _, c := range []struct {
		name      string
		committed time.Duration // after the position was written
		refused   bool
	}{
		{"committed before the position was written", -time.Minute, false},
		{"committed with it, within the clock's skew", 500 * time.Millisecond, false},
		{"committed after: the database was put back", time.Minute, true},
	} {
		t.Run(strings.ReplaceAll(c.name, " ", "_"), func(t *testing.T) {
			for seed := uint64(1); seed <= 20; seed++ {
				w, old, next := putBackWorld(t, seed)
				after := simEntry{kind: 't', commitStart: next.commitEnd + 32, commitEnd: next.commitEnd + 64,
					events: []simEvent{{id: "e0002", key: "k2", topic: "outbox.event.Order", seq: 2}}}
				w.wal = []simEntry{old, next, after}
				// Kafka holds the position past next, and old's event (and
				// next's, unless next is new); the slot is behind.
				w.stored, w.storedSet, w.storedAt = next.commitEnd, true, written
				w.visible["e0000"], w.delivered["e0000"] = true, true
				if !c.refused {
					w.visible["e0001"], w.delivered["e0001"] = true, true
				}
				w.commitTimes = map[checkpoint.LSN]time.Time{
					old.commitStart:   written.Add(-time.Hour),
					next.commitStart:  written.Add(c.committed),
					after.commitStart: written.Add(2 * time.Hour),
				}
				err := w.run()
				if w.err != nil {
					t.Fatalf("seed %d: %v", seed, w.err)
				}
				var fe *FatalError
				if c.refused {
					if !errors.As(err, &fe) || !errors.Is(err, ErrTimelineForked) || !strings.Contains(err.Error(), "transaction 16777536") {
						t.Fatalf("seed %d: Run returned %v; want a fatal ErrTimelineForked naming the transaction", seed, err)
					}
					if w.visible["e0001"] || w.visible["e0002"] {
						t.Fatalf("seed %d: events were committed past the refusal: %v", seed, w.visible)
					}
					// Confirmed at next's commit, PostgreSQL would skip it.
					if w.confirmed > next.commitStart {
						t.Fatalf("seed %d: the slot was confirmed at %s, past %s, where the new transaction commits", seed, w.confirmed, next.commitStart)
					}
					continue
				}
				if err != nil {
					t.Fatalf("seed %d: Run returned %v", seed, err)
				}
				// Invariant E1 fails a run that commits e0000 or e0001 again.
				if !w.visible["e0002"] || len(w.log2) != 1 {
					t.Fatalf("seed %d: committed %v; want only e0002 (the others are Kafka's already)", seed, w.log2)
				}
			}
		})
	}
}

// TestSimulatedExactlyOnceRefusesToSkipWhenTheServersClockWentBack: a
// database put back together with its clock (a virtual machine reverted
// with its memory) commits new transactions at times before the stored
// position was written, so skipTxn's commit-time check passed them and
// they were skipped, the slot confirmed past them: lost without a word (an
// exactly-once review showed it in this harness). The start now refuses
// when the server's clock is more than a minute behind the stored
// position's time; a clock a little behind (a time service's correction)
// is no sign of it.
func TestSimulatedExactlyOnceRefusesToSkipWhenTheServersClockWentBack(t *testing.T) {
	written := time.Unix(1_700_000_000, 0).Add(-time.Hour)
	for _, c := range []struct {
		name    string
		clock   time.Duration // the server's clock at start, after the position was written
		refused bool
	}{
		{"the clock went back with the database", -10 * time.Minute, true},
		{"the clock a few seconds behind", -5 * time.Second, false},
	} {
		t.Run(strings.ReplaceAll(c.name, " ", "_"), func(t *testing.T) {
			for seed := uint64(1); seed <= 10; seed++ {
				w, old, next := putBackWorld(t, seed)
				w.now = written.Add(c.clock)
				w.wal = []simEntry{old, next}
				// Kafka holds the position past next and old's event; next
				// is new, committed by the put-back database at a time its
				// clock, gone back, puts before the position's.
				w.stored, w.storedSet, w.storedAt = next.commitEnd, true, written
				w.visible["e0000"], w.delivered["e0000"] = true, true
				if !c.refused {
					w.visible["e0001"], w.delivered["e0001"] = true, true
				}
				w.commitTimes = map[checkpoint.LSN]time.Time{
					old.commitStart:  written.Add(-time.Hour),
					next.commitStart: written.Add(-time.Minute),
				}
				err := w.run()
				if w.err != nil {
					t.Fatalf("seed %d: %v", seed, w.err)
				}
				var fe *FatalError
				if c.refused {
					if !errors.As(err, &fe) || !errors.Is(err, ErrTimelineForked) || !strings.Contains(err.Error(), "the server's clock says") {
						t.Fatalf("seed %d: Run returned %v; want a fatal ErrTimelineForked naming the server's clock", seed, err)
					}
					if w.visible["e0001"] || w.confirmed > next.commitStart {
						t.Fatalf("seed %d: e0001 visible %v, the slot confirmed at %s (its commit at %s)", seed, w.visible["e0001"], w.confirmed, next.commitStart)
					}
					continue
				}
				if err != nil {
					t.Fatalf("seed %d: Run returned %v", seed, err)
				}
			}
		})
	}
}

// TestSimulatedExactlyOnceMeetsTheTransactionTheStoredRecordNames: the
// offsets record names the last transaction read at or below its position
// (commit position, xid, commit time), and a start that skips what Kafka
// holds must meet it on the way. A database put back with its clock, whose
// clock has caught up again by the start, commits new transactions at
// times before the stored position's: neither the start's clock check nor
// skipTxn's commit times tell, and before this check the new transaction
// was skipped, the slot confirmed past it (an exactly-once review's
// proposal). Now the start stops, having confirmed nothing past the slot's
// position (or past the transaction it met), whether the new history has another transaction where Kafka's
// last was (same xid, as a put-back database assigns the same ones again),
// one before it and none there, a transaction where Kafka got none, or
// nothing at all (only keepalives past it). The same history is skipped as
// before. The harness, not a real server: the record and the commit times
// are set by the script.
func TestSimulatedExactlyOnceMeetsTheTransactionTheStoredRecordNames(t *testing.T) {
	written := time.Unix(1_700_000_000, 0).Add(-time.Hour)
	for _, c := range []struct {
		name string
		// what the new history holds: old, then next (unless nextGone),
		// next committed at nextAt after the position was written.
		nextAt   time.Duration
		nextGone bool
		// last is what the stored record names, by the entry it stands
		// for and the commit time Kafka's history gave it.
		last    func(old, next simEntry) kafka.TxnMark
		refused string
	}{
		{name: "the same history", nextAt: -time.Minute,
			last: func(old, next simEntry) kafka.TxnMark { return simMark(next, written.Add(-time.Minute)) }},
		{name: "another transaction where Kafka's last committed", nextAt: -30 * time.Minute,
			last:    func(old, next simEntry) kafka.TxnMark { return simMark(next, written.Add(-time.Minute)) },
			refused: "and the stream reached transaction 16777536"},
		{name: "none where Kafka's last committed", nextAt: -30 * time.Minute, nextGone: true,
			last: func(old, next simEntry) kafka.TxnMark {
				return simMark(simEntry{kind: 't', commitStart: next.commitStart + 8}, written.Add(-time.Minute))
			},
			refused: "the last transaction Kafka got below it was transaction 16777544"},
		{name: "a transaction where Kafka got none", nextAt: -30 * time.Minute,
			last: func(old, next simEntry) kafka.TxnMark {
				return simMark(simEntry{kind: 't', commitStart: simSlotStart - 0x100}, written.Add(-2*time.Hour))
			},
			refused: "Kafka got no transaction between the slot's position"},
		{name: "a transaction after the one Kafka got last", nextAt: -30 * time.Minute,
			last:    func(old, next simEntry) kafka.TxnMark { return simMark(old, written.Add(-time.Hour)) },
			refused: "read again, and transaction 16777536"},
	} {
		t.Run(strings.ReplaceAll(c.name, " ", "_"), func(t *testing.T) {
			for seed := uint64(1); seed <= 20; seed++ {
				w, old, next := putBackWorld(t, seed)
				// The server's clock at start has caught up with the time
				// the position was written.
				w.now = written.Add(time.Hour)
				after := simEntry{kind: 't', commitStart: next.commitEnd + 32, commitEnd: next.commitEnd + 64,
					events: []simEvent{{id: "e0002", key: "k2", topic: "outbox.event.Order", seq: 2}}}
				w.wal = []simEntry{old, next, after}
				if c.nextGone {
					w.wal = []simEntry{old, after}
				}
				w.stored, w.storedSet, w.storedAt = next.commitEnd, true, written
				w.storedLast = c.last(old, next)
				w.visible["e0000"], w.delivered["e0000"] = true, true
				if c.refused == "" {
					w.visible["e0001"], w.delivered["e0001"] = true, true
				}
				w.commitTimes = map[checkpoint.LSN]time.Time{
					old.commitStart:   written.Add(-time.Hour),
					next.commitStart:  written.Add(c.nextAt),
					after.commitStart: written.Add(2 * time.Hour),
				}
				err := w.run()
				if c.refused == "" {
					if err != nil || w.err != nil {
						t.Fatalf("seed %d: Run returned %v (harness: %v)", seed, err, w.err)
					}
					if !w.visible["e0002"] || len(w.log2) != 1 {
						t.Fatalf("seed %d: committed %v; want only e0002 (the others are Kafka's already)", seed, w.log2)
					}
					continue
				}
				var fe *FatalError
				if !errors.As(err, &fe) || !errors.Is(err, ErrTimelineForked) || !strings.Contains(err.Error(), c.refused) {
					t.Fatalf("seed %d: Run returned %v; want a fatal ErrTimelineForked saying %q", seed, err, c.refused)
				}
				// Confirmed at next's commit, PostgreSQL would skip it; old
				// is confirmed only once it was met.
				if w.visible["e0001"] || w.visible["e0002"] || w.confirmed > next.commitStart || w.confirmed > simSlotStart && !strings.Contains(err.Error(), "read again") {
					t.Fatalf("seed %d: visible %v, the slot confirmed at %s (its position was %s)", seed, w.visible, w.confirmed, simSlotStart)
				}
			}
		})
	}
}

// TestSimulatedExactlyOnceMeetsTheMessageTheStoredRecordNames: a record
// whose last unit is a non-transactional message names it by its end and
// a hash of its prefix and content, so that a put-back database's new
// message ending at that very position is not taken for it (the diff
// reader: with the position alone, it was, and every new transaction
// before it was skipped). The same message is met; another is refused.
// The harness: the record is set by the script.
func TestSimulatedExactlyOnceMeetsTheMessageTheStoredRecordNames(t *testing.T) {
	written := time.Unix(1_700_000_000, 0).Add(-time.Hour)
	for _, same := range []bool{true, false} {
		for seed := uint64(1); seed <= 10; seed++ {
			w, old, _ := putBackWorld(t, seed)
			w.now = written.Add(time.Hour)
			ev := simEvent{id: "m001", key: "k1", topic: "outbox.event.Order", message: true, seq: 1}
			msg := simEntry{kind: 'm', commitStart: old.commitEnd + 8, commitEnd: old.commitEnd + 48, events: []simEvent{ev}}
			w.wal = []simEntry{old, msg}
			w.stored, w.storedSet, w.storedAt = msg.commitEnd, true, written
			w.storedLast = kafka.MessageMark(uint64(msg.commitEnd), "outbox", messageContent(ev))
			if !same {
				other := ev
				other.id = "m999"
				w.storedLast = kafka.MessageMark(uint64(msg.commitEnd), "outbox", messageContent(other))
			}
			w.visible["e0000"], w.delivered["e0000"] = true, true
			w.visible["m001"], w.delivered["m001"] = true, true
			w.commitTimes = map[checkpoint.LSN]time.Time{old.commitStart: written.Add(-time.Hour)}
			err := w.run()
			if same {
				if err != nil || w.err != nil {
					t.Fatalf("seed %d, the same message: Run returned %v (harness: %v)", seed, err, w.err)
				}
				continue
			}
			var fe *FatalError
			if !errors.As(err, &fe) || !errors.Is(err, ErrTimelineForked) || !strings.Contains(err.Error(), "the stream reached the non-transactional message") {
				t.Fatalf("seed %d, another message: Run returned %v; want a fatal ErrTimelineForked naming the message", seed, err)
			}
			if w.confirmed > old.commitStart {
				t.Fatalf("seed %d: the slot was confirmed at %s, past %s, before the message was met", seed, w.confirmed, old.commitStart)
			}
		}
	}
}

// simMark is the mark of the harness's transaction e committed at at (its
// xid is its commit position, as the harness's walsender sends it).
func simMark(e simEntry, at time.Time) kafka.TxnMark {
	return kafka.TxnMark{LSN: uint64(e.commitStart), XID: uint32(e.commitStart), Time: at}
}

// putBackWorld is an exactly-once world of a database put back to an
// earlier point: its WAL holds old and next, two transactions of key k1
// (events e0000 and e0001) past the slot; the test sets what Kafka holds,
// the stored position and the commit times.
func putBackWorld(t *testing.T, seed uint64) (w *simWorld, old, next simEntry) {
	w = newSimWorld(seed)
	w.eos = true
	w.visible = map[string]bool{}
	w.cfg.Kafka.ExactlyOnce = true
	w.cfg.Kafka.TransactionTimeout = 15 * time.Minute
	w.failAfter, w.tooLarge, w.missing, w.catChange, w.faulty = false, false, "", 0, false
	w.verbose, w.log = *simLog, t.Logf
	a := simSlotStart + 0x100
	old = simEntry{kind: 't', commitStart: a, commitEnd: a + 32,
		events: []simEvent{{id: "e0000", key: "k1", topic: "outbox.event.Order", seq: 0}}}
	next = simEntry{kind: 't', commitStart: a + 64, commitEnd: a + 96,
		events: []simEvent{{id: "e0001", key: "k1", topic: "outbox.event.Order", seq: 1}}}
	return w, old, next
}
