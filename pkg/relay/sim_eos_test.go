package relay

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/checkpoint"
	"github.com/pgoutbox/pgoutbox/pkg/kafka"
	"github.com/pgoutbox/pgoutbox/router"
)

// The deterministic harness in exactly-once mode: the same scripted
// walsender, checks and clock, and a model of Kafka transactions instead of
// the plain producer. Records sent since the last Commit form the open Kafka
// transaction; a commit can be answered once every record before it is
// (sarama's CommitTxn waits for them), with an outcome the seed picks in the
// faulty run: committed, aborted (an abortable error), or committed with the
// answer lost (the relay sees an error; the next session's stored position
// says it committed). A record that fails makes every later commit of its
// producer fail. Only a committed transaction's records are visible (to a
// read_committed reader), and only a commit moves the stored position that
// the next session starts from. Fencing needs a second instance and is left
// to the real-Kafka zombie test (TestExactlyOnceFaults/zombie).
//
// Invariants, besides those of the at-least-once harness (1 to 6, with
// "delivered" meaning visible to read_committed):
//
//	E1. No event is visible twice: a commit never holds a record of a
//	    transaction already visible.
//	E2. The stored position is never ahead of what committed: after each
//	    commit, every event of a transaction ending at or below it is
//	    visible.
//	E3. No status update confirms past the position Kafka committed.
//	E4. Records unacknowledged stay within twice relay.max.inflight.records
//	    (the loop reads on while a commit drains what was sent before it;
//	    AckBuffer holds that much).
//	E5. The time written with the stored position, when one is, is no
//	    earlier than the commit time of any transaction before it (a start
//	    that finds a
//	    transaction to skip committed later takes the database for put
//	    back to an earlier point, and stops).
//	E6. The transaction the stored record names is the last one (or the
//	    last non-transactional message) at or below the stored position
//	    in the script's WAL, by its commit position, xid and commit time
//	    (a start skipping what Kafka holds must meet it).
//
// And at the end, per key, the visible records are exactly the committed
// events in commit order, each once (invariant 5 without sarama's
// exception: a failed record aborts its transaction instead of leaving a
// gap).

var simEOSSeeds = flag.Int("sim.eos.seeds", 1000, "number of seeds the deterministic relay harness runs in exactly-once mode")

// simSlotStart is where every seed's slot starts.
const simSlotStart = checkpoint.LSN(0x1000000)

func TestSimulatedExactlyOnceKeepsItsInvariants(t *testing.T) {
	seeds := []uint64{*simSeed}
	if *simSeed == 0 {
		seeds = nil
		for i := 0; i < *simEOSSeeds; i++ {
			seeds = append(seeds, *simFirst+uint64(i))
		}
	}
	runSimSeeds(t, seeds, runSimEOS)
}

// runSimEOS is runSim in exactly-once mode.
func runSimEOS(seed uint64, verbose bool, logf func(string, ...any)) error {
	w := newSimWorld(seed)
	w.eos = true
	w.visible = map[string]bool{}
	w.cfg.Kafka.ExactlyOnce = true
	// Longer than any frozen broker of the script: a transaction too long
	// for the timeout is a test of its own.
	w.cfg.Kafka.TransactionTimeout = 15 * time.Minute
	w.cfg.Kafka.TransactionInterval = []time.Duration{-time.Millisecond, 5 * time.Millisecond, 200 * time.Millisecond}[w.rng.IntN(3)]
	w.cfg.Kafka.TransactionMaxRecords = 1 + w.rng.IntN(60)
	w.log, w.verbose = logf, verbose
	return w.play()
}

// simTxnProducer is Kafka with transactions.
type simTxnProducer struct {
	*simProducer
	commits    chan kafka.CommitResult
	cur        []simMsg    // the open transaction's records
	waiting    []simCommit // commits requested, not answered
	stored     checkpoint.LSN
	storedAt   time.Time
	storedLast kafka.TxnMark
	found      bool
}

type simCommit struct {
	lsn  checkpoint.LSN
	at   time.Time
	last kafka.TxnMark
	recs []simMsg
}

func (p *simTxnProducer) Send(rec *router.Record, m kafka.Meta) {
	p.simProducer.Send(rec, m)
	if limit := 2 * p.w.cfg.Relay.MaxInFlightRecords; len(p.unacked) > limit {
		p.w.fail("E4: %d records unacknowledged, more than twice relay.max.inflight.records (%d)", len(p.unacked), limit)
	}
	q := p.queue[string(rec.Key)]
	p.cur = append(p.cur, q[len(q)-1])
}

func (p *simTxnProducer) Commit(lsn uint64, at time.Time, last kafka.TxnMark) {
	p.waiting = append(p.waiting, simCommit{lsn: checkpoint.LSN(lsn), at: at, last: last, recs: p.cur})
	p.cur = nil
}

func (p *simTxnProducer) Commits() <-chan kafka.CommitResult { return p.commits }
func (p *simTxnProducer) Stored() (uint64, bool)             { return uint64(p.stored), p.found }
func (p *simTxnProducer) StoredTimeline() int32              { return 0 }
func (p *simTxnProducer) StoredAt() time.Time                { return p.storedAt }
func (p *simTxnProducer) StoredLast() kafka.TxnMark          { return p.storedLast }
func (p *simTxnProducer) Fenced() error                      { return nil }

// answer answers the oldest commit once its records are all answered.
func (p *simTxnProducer) answer() bool {
	w := p.w
	if p.closed || len(p.waiting) == 0 || len(p.commits) == cap(p.commits) {
		return false
	}
	c := p.waiting[0]
	for _, m := range c.recs {
		if p.unacked[m.seq] {
			return false
		}
	}
	p.waiting = p.waiting[1:]
	res := kafka.CommitResult{LSN: uint64(c.lsn), Began: w.now}
	switch {
	case p.failed:
		res.Err = errors.New("sim: a record of the transaction failed; aborted")
	case w.faulty && w.rng.IntN(15) == 0:
		res.Err = errors.New("sim: abortable error; aborted")
	case w.faulty && w.rng.IntN(25) == 0:
		w.commitTxn(c)
		res.Err = errors.New("sim: EndTxn sent, answer lost")
	default:
		w.commitTxn(c)
	}
	p.failed = p.failed || res.Err != nil
	w.logf("commit %s: err=%v", c.lsn, res.Err)
	p.commits <- res
	return true
}

// commitTxn makes a transaction's records visible and stores its position
// (invariants E1 and E2).
func (w *simWorld) commitTxn(c simCommit) {
	for _, m := range c.recs {
		id := string(m.rec.EventID)
		if w.visible[id] {
			w.fail("invariant E1: event %s is visible twice (the commit at %s holds it again)", id, c.lsn)
		}
		w.visible[id], w.delivered[id] = true, true
		key := m.rec.Topic + "|" + string(m.rec.Key)
		w.log2[key] = append(w.log2[key], id)
	}
	if c.lsn > w.stored {
		w.stored, w.storedAt, w.storedLast, w.storedSet = c.lsn, c.at, c.last, true
	}
	var want kafka.TxnMark
	for _, e := range w.wal {
		if e.commitEnd > w.stored {
			break
		}
		switch e.kind {
		case 't':
			want = kafka.TxnMark{LSN: uint64(e.commitStart), XID: uint32(e.commitStart), Time: w.commitTimes[e.commitStart]}
		case 'm':
			ev := e.events[0]
			want = kafka.MessageMark(uint64(e.commitEnd), cmp.Or(ev.prefix, "outbox"), messageContent(ev))
		}
	}
	if want.IsZero() && !w.storedLast.IsZero() && checkpoint.LSN(w.storedLast.LSN) < simSlotStart {
		want = w.storedLast // named by the test, before the script's WAL
	}
	if !w.storedLast.Is(want) {
		w.fail("invariant E6: the stored position %s names %+v as the last transaction read below it; the WAL's last is %+v", w.stored, w.storedLast, want)
	}
	for _, e := range w.wal {
		if e.commitEnd > w.stored {
			break
		}
		if t, ok := w.commitTimes[e.commitStart]; ok && e.kind == 't' && !w.storedAt.IsZero() && t.After(w.storedAt) {
			w.fail("invariant E5: the stored position %s says everything before it had committed at %s, but the transaction ending at %s committed at %s",
				w.stored, w.storedAt, e.commitEnd, t)
			return
		}
		for _, ev := range e.events {
			if ev.emits() && !w.visible[ev.id] {
				w.fail("invariant E2: the stored position %s is ahead of what committed: event %s of the %c record ending at %s is not visible",
					w.stored, ev.id, e.kind, e.commitEnd)
				return
			}
		}
	}
}

// checkNoDuplicates is the end check of exactly-once mode.
func (w *simWorld) checkNoDuplicates() error {
	for key, ids := range w.log2 {
		seen := map[string]bool{}
		for _, id := range ids {
			if seen[id] {
				return fmt.Errorf("invariant E1: key %s holds %s twice", key, id)
			}
			seen[id] = true
		}
	}
	return nil
}
