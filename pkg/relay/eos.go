package relay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/pgoutbox/pgoutbox/checkpoint"
	"github.com/pgoutbox/pgoutbox/pkg/kafka"
	"github.com/pgoutbox/pgoutbox/replication"
	"github.com/pgoutbox/pgoutbox/router"
)

// Exactly-once mode (kafka.exactly.once): the session's records go in Kafka
// transactions, each holding whole PostgreSQL transactions and, written by
// the producer with them, one record to the offsets topic with the commit
// end of the last PostgreSQL transaction inside. eosSession is that part of
// a session; in at-least-once mode a session has none (nil), and every
// method below is a no-op on nil, so session.go calls them unconditionally
// and its at-least-once path stays what it was.
//
// What it adds to the loop:
//   - at start, the position Kafka committed (read after fencing every
//     earlier producer of the transactional id): transactions whose commit
//     ends at or below it are skipped, as they are in Kafka already;
//   - at each transaction boundary, whether to end the Kafka transaction
//     (transaction.interval, transaction.max.records; never while a
//     commit runs, a record waits for its topic's check, or a failure
//     waits to be handled, so that no PostgreSQL transaction is split);
//   - the slot is confirmed no further than the last position whose Kafka
//     transaction committed (on top of the tracker and the catalog cap);
//   - positions without records (idle keepalives, transactions without
//     events) are committed too, at most every idleCommitEvery, so that the
//     slot is never confirmed past what the offsets topic holds: a stored
//     position behind the slot then always means someone else moved it.
//
// Commits run on the producer's transaction goroutine; their outcomes
// arrive on a channel the loop reads like acks.
type eosSession struct {
	s    *session
	prod txnProducer
	cfg  kafka.Config

	// stored is the position the offsets topic held at start (or the
	// slot's, with none); committed the last position Kafka committed
	// since. Nothing past committed is confirmed.
	stored, committed checkpoint.LSN
	// storedAt is the time the stored position was written with (zero:
	// not known): every transaction before it had committed by then.
	storedAt time.Time
	// read is how far the stream has been read past the slot's position,
	// every transaction skipped on the way checked (skipTxn): until it
	// reaches stored, nothing past it is confirmed, or a transaction that
	// skipTxn refuses would be skipped by PostgreSQL itself at the next
	// start.
	read checkpoint.LSN
	// skipOpen: the open transaction ends at or below the stored position.
	skipOpen bool
	// abandoned: the session ends inside a transaction none of whose
	// records were sent, so what was read before it may be committed.
	abandoned bool
	// lastEnd is the commit end of the last transaction read (or the idle
	// position), requested the last position asked to be committed.
	lastEnd, requested checkpoint.LSN
	// lastEndAt is a time of the server's clock by which everything up to
	// lastEnd had committed: the latest commit time read, or a keepalive's
	// (written with the position; see skipTxn).
	lastEndAt time.Time
	// The group: records sent since the last commit request, and when the
	// first of them was sent.
	groupRecords int
	groupStart   time.Time
	outstanding  int
	lastCommitAt time.Time
	// busy: the in-flight caps stopped reading WAL during this group (a
	// backlog, Kafka slower than PostgreSQL); lastTook is how long the last
	// commit took.
	busy     bool
	lastTook time.Duration
	// broken: a PostgreSQL transaction is partly sent and will not be
	// finished (the session ends): nothing more may be committed.
	broken bool
	// last is the last transaction (or non-transactional message) read,
	// skipped or sent, which the offsets record names beside the position
	// (see skipTxn); opening is the open transaction's until its commit.
	last, opening kafka.TxnMark
	// marked: the stored position's record names the last transaction
	// read below it, so each transaction skipped is checked against it:
	// meet is that transaction when the slot sends it again (it commits at
	// or after the slot's position; zero when it commits before, and the
	// record then says no transaction lies between the slot's position and
	// the stored one), and met says it was read.
	marked, met bool
	meet        kafka.TxnMark
}

// idleCommitEvery bounds how often a position without records (an idle
// keepalive's WAL end) is committed to the offsets topic: every status
// interval, and at most every idleCommitEvery.
const idleCommitEvery = 5 * time.Second

// txnProducer is the producer of exactly-once mode: *kafka.TxnProducer.
type txnProducer interface {
	producer
	// Commit ends the Kafka transaction holding every record sent so far,
	// with the offsets record saying lsn. It never blocks; its outcome
	// arrives on Commits, in order. at is a time of the server's clock by
	// which every transaction before lsn had committed, last the last
	// transaction read at or below lsn.
	Commit(lsn uint64, at time.Time, last kafka.TxnMark)
	Commits() <-chan kafka.CommitResult
	// Stored is what the offsets topic held for the slot at start.
	Stored() (lsn uint64, ok bool)
	// StoredTimeline is the server's timeline that position was written
	// on (0: not known).
	StoredTimeline() int32
	// StoredAt is the time that position was written with (zero: not
	// known).
	StoredAt() time.Time
	// StoredLast is the last transaction read at or below that position
	// (zero: not known).
	StoredLast() kafka.TxnMark
	// Fenced is the error with which Kafka refused the producer's epoch,
	// if it met one; final once Close returned.
	Fenced() error
}

func newEOSSession(s *session, p txnProducer, start checkpoint.LSN) *eosSession {
	return &eosSession{s: s, prod: p, cfg: s.r.cfg.Kafka, stored: start, committed: start, lastEnd: start, requested: start, lastCommitAt: s.clock.Now()}
}

// results is the channel of commit outcomes (nil, never ready, in
// at-least-once mode).
func (e *eosSession) results() <-chan kafka.CommitResult {
	if e == nil {
		return nil
	}
	return e.prod.Commits()
}

// cap bounds what may be confirmed by what Kafka committed, and by how far
// the transactions to skip were read: not past the slot's position while
// the transaction the stored record names is still to be met.
func (e *eosSession) cap(c checkpoint.LSN) checkpoint.LSN {
	if e == nil {
		return c
	}
	if e.waiting() {
		return min(c, e.s.start.Slot.ConfirmedFlushLSN)
	}
	if e.read < e.stored {
		c = min(c, e.read)
	}
	return min(c, e.committed)
}

// readTo notes that the stream was read up to pos: every transaction
// committing before it was sent.
func (e *eosSession) readTo(pos checkpoint.LSN) {
	if e != nil {
		e.read = max(e.read, pos)
	}
}

// skip says whether the transaction or non-transactional message ending
// at or after final is in Kafka already: its commit record begins before
// the stored position (equivalently, since positions stored are commit
// ends or idle WAL ends, it ends at or below it).
func (e *eosSession) skip(final checkpoint.LSN) bool {
	return e != nil && final < e.stored
}

// sent counts a record sent in the current group.
func (e *eosSession) sent() {
	if e == nil {
		return
	}
	if e.groupRecords == 0 {
		e.groupStart = e.s.clock.Now()
	}
	e.groupRecords++
}

// closed notes that the open transaction's commit was read, skipped or
// sent: it is the last one read.
func (e *eosSession) closed() { e.last, e.opening = e.opening, kafka.TxnMark{} }

// ended notes the commit end of a transaction (or non-transactional
// message) whose records have all been sent: the one reading named.
func (e *eosSession) ended(end checkpoint.LSN) {
	if e == nil {
		return
	}
	e.closed()
	e.lastEnd = max(e.lastEnd, end)
	if e.s.lastCommit.After(e.lastEndAt) {
		e.lastEndAt = e.s.lastCommit
	}
}

// idle notes a position the tracker adopted from a keepalive.
func (e *eosSession) idle(pos checkpoint.LSN, serverTime time.Time) {
	if e == nil || e.s.tr.Open() {
		return
	}
	if pos > e.lastEnd && serverTime.After(e.lastEndAt) {
		// Sent once the walsender had sent everything up to its WAL end.
		e.lastEndAt = serverTime
	}
	e.lastEnd = max(e.lastEnd, pos)
}

// pending says a clean stop must still wait: something read is not
// committed, or a commit is outstanding.
func (e *eosSession) pending() bool {
	return e != nil && !e.broken && (e.outstanding > 0 || e.lastEnd > e.committed)
}

// ready says whether a commit may be requested now, time apart.
func (e *eosSession) ready() bool {
	s := e.s
	return !e.broken && e.outstanding == 0 && (!s.tr.Open() || e.abandoned) && e.lastEnd > e.requested && !e.waiting() &&
		len(s.failures) == 0 && len(s.topics.parked) == 0 && !s.tr.Failed()
}

// due returns when the next commit is due, if one could be requested then.
func (e *eosSession) due() (time.Time, bool) {
	if e == nil || !e.ready() {
		return time.Time{}, false
	}
	if e.groupRecords == 0 {
		return e.lastCommitAt.Add(min(idleCommitEvery, e.s.r.cfg.Postgres.StatusInterval)), true
	}
	if e.groupRecords >= e.cfg.TransactionMaxRecords {
		return e.groupStart, true
	}
	interval := e.cfg.TransactionInterval
	if e.extended() {
		// Throughput-bound: records of the next transaction wait while a
		// commit runs (sarama refuses them until it ends), so commit less
		// often, about a tenth of the time at most; latency is bound by
		// the backlog then, not by the interval.
		interval = max(interval, min(busyCommitFactor*e.lastTook, e.cfg.TransactionTimeout/10))
	}
	if interval < 0 {
		return e.groupStart, true
	}
	return e.groupStart.Add(interval), true
}

// extended says whether the group stays open longer than
// transaction.interval: while reading a backlog (the in-flight caps
// stopped reading WAL during the group, or the transactions read committed
// catchUpBehind ago or more) and records are still in flight. Once the last
// is acknowledged the backlog is read, and the group is committed at once.
func (e *eosSession) extended() bool {
	s := e.s
	return s.tr.InFlight() > 0 && (e.busy || !s.lastCommit.IsZero() && s.clock.Now().Sub(s.lastCommit) >= catchUpBehind)
}

// catchUpBehind: transactions that committed this long ago are a backlog.
const catchUpBehind = 500 * time.Millisecond

// recheck says when to look again whether a commit is due: the acks that
// end an extended group do not end a Receive, so while a group is extended
// the loop looks every busyRecheck.
func (e *eosSession) recheck() (time.Time, bool) {
	if e == nil || e.groupRecords == 0 || !e.extended() {
		return time.Time{}, false
	}
	return e.s.clock.Now().Add(busyRecheck), true
}

// busyRecheck is how often recheck looks.
const busyRecheck = 20 * time.Millisecond

// busyCommitFactor: while throughput-bound, a Kafka transaction stays open
// this many times as long as the last commit took.
const busyCommitFactor = 10

// headroom is how many times the in-flight caps the loop may fill: twice
// while a commit runs. sarama's commit first waits for every record sent
// before it; with the caps full then, the loop would stop reading WAL for
// that whole drain, and decoding and producing would take turns instead of
// overlapping (exactly-once catch-up at about half at-least-once's rate).
// The records read meanwhile wait in the producer's queue for the next
// transaction. So in this mode the caps bound memory at twice their value
// while a commit runs.
func (e *eosSession) headroom() int {
	if e != nil && e.outstanding > 0 {
		return eosHeadroom(true)
	}
	return 1
}

// eosHeadroom is the most headroom a session may take: what the producer's
// buffers must hold (AckBuffer).
func eosHeadroom(exactlyOnce bool) int {
	if exactlyOnce {
		return 2
	}
	return 1
}

// pressed notes that the in-flight caps stopped reading WAL.
func (e *eosSession) pressed() {
	if e != nil {
		e.busy = true
	}
}

// step requests a commit when one is due (at once when stopping).
func (e *eosSession) step() {
	at, ok := e.due()
	if !ok {
		return
	}
	s := e.s
	if now := s.clock.Now(); now.Before(at) && !s.stopping {
		return
	}
	e.prod.Commit(uint64(e.lastEnd), e.lastEndAt, e.last)
	e.requested = e.lastEnd
	e.outstanding++
	e.groupRecords = 0
	e.busy = false
}

// result handles a commit's outcome.
func (e *eosSession) result(res kafka.CommitResult) error {
	e.outstanding--
	s := e.s
	if res.Err != nil {
		e.broken = true
		if kafka.IsFenced(res.Err) {
			return e.fenced(res.Err, res.Began)
		}
		if err := e.failedAcks(); err != nil {
			return err
		}
		return &ProduceError{Topic: e.cfg.OffsetsTopic, LSN: checkpoint.LSN(res.LSN),
			Err: fmt.Errorf("%w; restarting from the position the offsets topic holds", res.Err)}
	}
	e.committed = max(e.committed, checkpoint.LSN(res.LSN))
	s.r.eosCommitted = true
	e.lastCommitAt = s.clock.Now()
	e.lastTook = res.Took
	if ce := s.log.Check(zap.DebugLevel, "kafka transaction committed"); ce != nil {
		ce.Write(zap.Stringer("lsn", checkpoint.LSN(res.LSN)), zap.Duration("commit", res.Took), zap.Duration("open", res.Took+s.clock.Now().Sub(res.Began)-res.Took))
	}
	return nil
}

// failedAcks handles the acknowledgements that wait, for a commit that
// failed: a record Kafka refused fails its transaction's commit too, and
// the producer puts the record's acknowledgement on Acks before the
// commit's failure on Commits (as far as sarama has passed it on: sarama
// marks the transaction failed a moment before it returns the record's
// error, and a commit that sees the mark in that moment comes first; the
// record is then known one session later). Ending the session on the
// commit's error alone would leave the record unknown for what it is, and
// a poison record would be sent again by every session after.
func (e *eosSession) failedAcks() error {
	s := e.s
	for {
		select {
		case a, ok := <-s.prod.Acks():
			if !ok {
				return nil
			}
			// Records sent after the failed commit are refused with
			// ErrTxnFailed, which says nothing of the record.
			if err := s.ack(a); err != nil && !errors.Is(a.Err, kafka.ErrTxnFailed) {
				return err
			}
		default:
			return nil
		}
	}
}

// fenced is the error of a producer that Kafka refused for its epoch:
// another instance with the same transactional id started (it fenced this
// one, and aborted its open transaction), or the coordinator aborted the
// transaction for its timeout.
func (e *eosSession) fenced(err error, began time.Time) error {
	if !began.IsZero() && e.s.clock.Now().Sub(began) >= e.cfg.TransactionTimeout {
		return fmt.Errorf("relay: the Kafka transaction begun at %s was open longer than kafka.transaction.timeout (%s) and the coordinator aborted it; restarting from the position the offsets topic holds: %w",
			began.Format(time.RFC3339), e.cfg.TransactionTimeout, err)
	}
	return &FatalError{Err: fmt.Errorf("relay: Kafka fenced this instance: another producer with transactional id %q started, and its first act aborted this one's open transaction; exiting without confirming anything more. That is another instance of this slot taking over, or, if it keeps happening, a relay of another slot (or database) configured with the same kafka.transactional.id: each slot needs an id of its own (leave kafka.transactional.id unset, and pgoutbox derives one from the slot): %w",
		e.cfg.TransactionalID, err)}
}

// failedAck handles, in exactly-once mode, a record Kafka refused: its
// transaction cannot commit. It returns handled false for the cases the
// at-least-once path handles the same way.
func (e *eosSession) failedAck(a kafka.Ack, lsn checkpoint.LSN) (handled bool, err error) {
	if e == nil {
		return false, nil
	}
	e.broken = true
	s := e.s
	switch {
	case errors.Is(a.Err, kafka.ErrTxnFailed):
		// A record sent after a failed commit, refused for that: the
		// commit's outcome, on Commits, says why; the producer knows
		// whether Kafka fenced it.
		if f := e.prod.Fenced(); f != nil {
			return true, e.fenced(f, e.openSince())
		}
		return true, fmt.Errorf("relay: %w; restarting from the position the offsets topic holds", a.Err)
	case kafka.IsFenced(a.Err):
		// The coordinator's abort for the transaction's timeout bumps the
		// epoch as a new instance's start does: the group's age tells.
		return true, e.fenced(a.Err, e.openSince())
	case kafka.MayBeStaleMetadata(a.Err) && !s.r.staleRetried[lsn]:
		// The at-least-once path restarts once with fresh metadata.
		return false, nil
	case kafka.IsBatchRefused(a.Err) && s.r.singleUntil == 0:
		// The at-least-once path resends one record per request; a record
		// refused alone then is poison, below.
		return false, nil
	case kafka.IsPoison(a.Err) && s.r.cfg.Relay.PoisonPolicy == "dead-letter" && a.Topic != s.r.cfg.Relay.DeadLetterTopic:
		// The record was in a Kafka transaction that must now abort: the
		// next session, from the stored position, sends it to the
		// dead-letter topic instead, in its transaction's place. Its
		// reason says so if its topic was deleted (refusedAgain), as the
		// at-least-once path's does.
		err := refusedAgain(a)
		s.r.poisoned[poisonKey{lsn: lsn, topic: a.Topic, id: string(a.EventID)}] = err.Error()
		s.log.Warn("Kafka refused a record: aborting its Kafka transaction; it goes to the dead-letter topic from the restart on",
			zap.ByteString("event_id", a.EventID), zap.String("topic", a.Topic), zap.Stringer("commit_lsn", lsn), zap.Error(err))
		return true, &ProduceError{EventID: string(a.EventID), Topic: a.Topic, LSN: lsn, Err: err}
	}
	return false, nil
}

// poisonKey names a record Kafka refused in exactly-once mode.
type poisonKey struct {
	lsn       checkpoint.LSN
	topic, id string
}

// knownPoison reports a record that an earlier session found Kafka
// refuses, with the reason.
func (e *eosSession) knownPoison(rec *router.Record) (string, bool) {
	if e == nil || len(e.s.r.poisoned) == 0 {
		return "", false
	}
	why, ok := e.s.r.poisoned[poisonKey{lsn: e.s.commit, topic: rec.Topic, id: string(rec.EventID)}]
	return why, ok
}

// end is called when the loop ends with cause: a PostgreSQL transaction
// left partly sent may not be committed.
func (e *eosSession) end(cause error) {
	if e == nil {
		return
	}
	if e.s.tr.Open() && !errors.Is(cause, errStopped) {
		if e.s.hasRecords {
			e.broken = true
		} else {
			// The open transaction will not be read to its end (a fatal
			// error inside it, before any of its records): what was read
			// before it may still be committed.
			e.abandoned = true
		}
	}
}

// checkAge stops the session when the open Kafka transaction has been open
// for most of kafka.transaction.timeout while a PostgreSQL transaction is
// still being read: its records must all be in one Kafka transaction, and
// the coordinator would abort it at the timeout. A transaction that does
// not fit twice is fatal.
func (e *eosSession) checkAge() error {
	if e == nil || e.groupRecords == 0 || !e.s.tr.Open() {
		return nil
	}
	s := e.s
	limit := e.cfg.TransactionTimeout * 4 / 5
	if s.clock.Now().Sub(e.groupStart) < limit {
		return nil
	}
	e.broken = true
	err := fmt.Errorf("relay: the PostgreSQL transaction committing at %s has been read for %s (%d records so far) and its records must all be in one Kafka transaction, which the coordinator aborts after kafka.transaction.timeout (%s): raise kafka.transaction.timeout (up to the brokers' transaction.max.timeout.ms, 15 minutes by default), or relay it with kafka.exactly.once off",
		s.commit, limit, e.groupRecords, e.cfg.TransactionTimeout)
	if s.r.tooLong == s.commit {
		return &FatalError{Err: err}
	}
	s.r.tooLong = s.commit
	return err
}

// startEOS makes s an exactly-once session whose Kafka truth is stored
// (the slot's position when the offsets topic held none): the tracker
// starts there, as everything up to it is in Kafka.
func (s *session) startEOS(p txnProducer, stored checkpoint.LSN, storedAt time.Time) {
	slot := s.start.Slot.ConfirmedFlushLSN
	pos := max(stored, slot)
	s.tr = checkpoint.New(pos)
	s.eos = newEOSSession(s, p, pos)
	// A slot past the stored position is refused (startTransactional):
	// everything before pos had committed by storedAt.
	s.eos.storedAt, s.eos.lastEndAt = storedAt, storedAt
	s.eos.read = slot
	e := s.eos
	e.last = p.StoredLast()
	if stored > slot && !e.last.IsZero() {
		e.marked = true
		// PostgreSQL sends again the commits that begin at or after the
		// slot's position, and the non-transactional messages that end
		// after it.
		if e.last.LSN > uint64(slot) || !e.last.Message() && e.last.LSN == uint64(slot) {
			e.meet = e.last
		}
	}
}

// waiting says the transaction the stored record names is still to be
// met: every transaction skipped so far is only presumed to be Kafka's.
func (e *eosSession) waiting() bool { return e != nil && !e.meet.IsZero() && !e.met }

// checkSkip checks u, a transaction (or non-transactional message) before
// the stored position about to be skipped as Kafka's, against the last
// transaction the stored record names. Before it, u is presumed Kafka's
// until that one is met (nothing past the slot's position is confirmed or
// committed meanwhile). At its position, u must be it: same xid, same
// commit time. Past it, or with nothing to meet, u is a transaction Kafka
// never got below the stored position: the database was put back to an
// earlier point (with its clock, or the clock caught up since, so that
// skipTxn's commit times could not tell) or moved to another history.
func (e *eosSession) checkSkip(u kafka.TxnMark) error {
	switch {
	case !e.marked:
		return nil
	case e.waiting() && before(u, e.meet):
		return nil
	case e.waiting() && e.meet.Is(u):
		e.met = true
		e.s.log.Info("exactly-once: read again the last transaction Kafka holds below the stored position; the ones before it were skipped as Kafka's",
			zap.Uint32("xid", u.XID), zap.Stringer("commit_lsn", checkpoint.LSN(u.LSN)), zap.Stringer("stored_lsn", e.stored))
		return nil
	}
	return e.notKafkas(u)
}

// passed checks a transaction (or message) at or past the stored position,
// or a keepalive's WAL end outside transactions, at pos: while the one the
// stored record names is still to be met, the stream is past it without
// it.
func (e *eosSession) passed(pos checkpoint.LSN, u kafka.TxnMark) error {
	// A commit record beginning at the keepalive's WAL end is not read yet;
	// a message ending there is.
	if !e.waiting() || uint64(pos) < e.meet.LSN || uint64(pos) == e.meet.LSN && !e.meet.Message() {
		return nil
	}
	return e.notKafkas(u)
}

// notKafkas is the error of a stream whose history before the stored
// position is not the one Kafka got.
func (e *eosSession) notKafkas(u kafka.TxnMark) error {
	slot := e.s.start.Slot.ConfirmedFlushLSN
	what := "the stream reached " + u.String()
	if u.IsZero() {
		what = "the stream went past it"
	}
	var want string
	switch {
	case !e.meet.IsZero():
		want = fmt.Sprintf("the last transaction Kafka got below it was %s, and %s", e.meet, what)
		if e.met {
			want = fmt.Sprintf("the last transaction Kafka got below it was %s, read again, and %s after it", e.meet, u)
		}
	default:
		want = fmt.Sprintf("Kafka got no transaction between the slot's position %s and it (the last it got was %s), and %s", slot, e.last, what)
	}
	return &FatalError{Err: fmt.Errorf("%w: the offsets topic %q holds %s for slot %q, and %s: this database's history before that position is not the one Kafka got (it was put back to an earlier point, by a restore from a snapshot or a backup, possibly with its clock, or a promotion forked it), and the transactions it commits there are new ones, which exactly-once would skip; or, if nothing of that happened, the publication or its tables changed since that position was written, so that PostgreSQL no longer sends that transaction. Nothing past the slot's position %s was confirmed. To resend from it instead (duplicates of what Kafka holds past it, nothing lost), remove the slot's record (key %q) from the offsets topic",
		ErrTimelineForked, e.cfg.OffsetsTopic, e.stored, e.s.start.Slot.Name, want, slot, e.key())}
}

// before says u comes before m in the WAL: a non-transactional message is
// named by where its record ends, a transaction by where its commit record
// begins, and one may begin where the other ends.
func before(u, m kafka.TxnMark) bool {
	return u.LSN < m.LSN || u.LSN == m.LSN && u.Message() && !m.Message()
}

// txnMark names the transaction b begins.
func txnMark(b *replication.Begin) kafka.TxnMark {
	return kafka.TxnMark{LSN: uint64(b.FinalLSN), XID: b.XID, Time: b.CommitTime}
}

// reading notes the transaction b begins, not skipped: every transaction
// before it, the ones to skip, was read.
func (e *eosSession) reading(b *replication.Begin) error {
	if e == nil {
		return nil
	}
	u := txnMark(b)
	if err := e.passed(b.FinalLSN, u); err != nil {
		return err
	}
	e.opening = u
	e.readTo(b.FinalLSN)
	return nil
}

// keepalive checks a keepalive's WAL end read outside transactions: the
// walsender has sent every commit before it.
func (e *eosSession) keepalive(walEnd checkpoint.LSN) error {
	if e == nil {
		return nil
	}
	return e.passed(walEnd, kafka.TxnMark{})
}

// skipping says the open transaction is one Kafka has already.
func (e *eosSession) skipping() bool { return e != nil && e.skipOpen }

// skipTxn skips the transaction b begins, as one Kafka has already, unless
// it committed after the stored position was written: then it is not the
// transaction Kafka got, but one a database put back to an earlier point
// (a restore from a disk snapshot or a crash-consistent copy, which starts
// no new timeline) committed there since. The end of the server's WAL
// (storedOnThisHistory) tells only while the database has not yet written
// past the stored position again.
//
// The offsets record names the last transaction read at or below its
// position (checkSkip): a transaction skipped must lie on the way to it,
// be it, or the start stops; that holds whatever the clocks did.
func (e *eosSession) skipTxn(b *replication.Begin) error {
	u := txnMark(b)
	if err := e.checkSkip(u); err != nil {
		return err
	}
	e.opening = u
	if !e.storedAt.IsZero() && b.CommitTime.After(e.storedAt.Add(commitTimeSkew)) {
		return &FatalError{Err: fmt.Errorf("%w: transaction %d committed at %s, at %s, before %s, the position the offsets topic holds for slot %q, but after %s, when that position was written: the database was put back to an earlier point (a restore from a snapshot or a backup) after Kafka got the transactions there, and this one is new; exactly-once would skip it. To resend from the slot's position %s instead (duplicates of what Kafka holds past it, nothing lost), remove the slot's record (key %q) from the offsets topic %q",
			ErrTimelineForked, b.XID, b.CommitTime.UTC().Format(time.RFC3339Nano), b.FinalLSN, e.stored, e.s.start.Slot.Name,
			e.storedAt.UTC().Format(time.RFC3339Nano), e.s.start.Slot.ConfirmedFlushLSN, e.key(), e.cfg.OffsetsTopic)}
	}
	e.skipOpen = true
	return nil
}

// key is the slot's record's key in the offsets topic.
func (e *eosSession) key() []byte { return slotIdentity(e.s.start).Key() }

// slotIdentity names the slot start streams from as the offsets topic
// does.
func slotIdentity(start replication.Start) kafka.SlotIdentity {
	return kafka.SlotIdentity{SystemIdentifier: start.Identity.SystemIdentifier, Database: start.Identity.Database, Slot: start.Slot.Name,
		Timeline: start.Identity.Timeline}
}

// commitTimeSkew is how much later than the stored position's time a
// transaction committed before that position may say it committed:
// commit times are taken before the commit record is written, so two
// commits may carry them in the other order (by microseconds), and the
// server's clock may be stepped back a little.
const commitTimeSkew = time.Second

// serverClockBehind is how far the server's clock at start may be behind
// the time the stored position was written before exactly-once refuses
// to skip by commit times (startTransactional): a clock stepped back a
// little by its time service is no sign of a database put back.
const serverClockBehind = time.Minute

// skipMessage says whether the non-transactional message m, whose record
// ends at its LSN, is in Kafka already (checked as skipTxn checks a
// transaction, by its position and a hash of its bytes).
func (e *eosSession) skipMessage(m *replication.Message) (bool, error) {
	if e == nil {
		return false, nil
	}
	end := m.LSN
	u := kafka.MessageMark(uint64(end), m.Prefix, m.Content)
	if end > e.stored {
		e.opening = u
		return false, e.passed(end, u)
	}
	if err := e.checkSkip(u); err != nil {
		return false, err
	}
	e.last = u
	return true, nil
}

// skipped handles a message of a transaction Kafka has already: nothing of
// it is routed, nor does a keepalive in its middle move the tracker (its
// WAL end may be past later commits); relations are still learnt.
func (s *session) skipped(ev replication.Event) error {
	switch {
	case ev.Commit != nil:
		s.eos.skipOpen = false
		s.eos.closed()
		s.eos.readTo(ev.Commit.EndLSN)
	case ev.Relation != nil:
		s.relation(ev.Relation)
	case ev.Keepalive != nil:
		// In the middle of a transaction skipped: its WAL end says nothing
		// of the commits after it.
		s.walEnd = max(s.walEnd, ev.Keepalive.WALEnd)
		if ev.Keepalive.ReplyRequested {
			return s.status(true)
		}
	}
	return nil
}

// ErrTimelineForked is wrapped by the error of an exactly-once start whose
// stored position lies past the point where the server's timeline left
// the one the last session read: the transactions committed there since
// are not the ones in Kafka.
var ErrTimelineForked = errors.New("relay: the server's timeline forked before the position Kafka holds")

// startTransactional starts the session's transactional producer: it makes
// sure the offsets topic exists (once per process), derives the
// transactional id from the slot when none is configured, fences every
// earlier producer of that id and reads the position Kafka committed for
// the slot. A stored position behind the slot's confirmed one means the
// slot moved past what Kafka holds (pgoutbox ran without exactly-once,
// another consumer, a slot recreated): the events in between cannot be
// told to be in Kafka once, so that is a loud exit.
func (r *Relay) startTransactional(ctx context.Context, kcfg *kafka.Config, start replication.Start, serverNow time.Time) (txnProducer, error) {
	id := slotIdentity(start)
	if kcfg.TransactionalID == "" {
		kcfg.TransactionalID = id.TransactionalID()
	}
	if !r.offsetsReady {
		if err := r.be.EnsureOffsetsTopic(ctx, *kcfg); err != nil {
			if errors.Is(err, context.Canceled) {
				return nil, err
			}
			return nil, &FatalError{Err: err}
		}
		r.offsetsReady = true
	}
	p, err := r.be.NewTxnProducer(ctx, *kcfg, id)
	if err != nil {
		if errors.Is(err, kafka.ErrOffsetsTopicMissing) {
			r.offsetsReady = false
		}
		return nil, err
	}
	slot := start.Slot.ConfirmedFlushLSN
	stored, ok := p.Stored()
	if ok && checkpoint.LSN(stored) < slot {
		r.closeProducer(context.WithoutCancel(ctx), p, r.clock.Now().Add(r.cfg.Relay.ShutdownTimeout))
		return nil, &FatalError{Err: fmt.Errorf("relay: slot %q is confirmed at %s, past %s, the position the offsets topic %q holds for it (transactional id %q): the slot was moved on without Kafka (pgoutbox ran without kafka.exactly.once, another consumer used the slot, or it was dropped and recreated), so the events in between may be missing from Kafka or in it twice; investigate, then remove the slot's record (key %q) from the offsets topic to start exactly-once from the slot's position",
			start.Slot.Name, slot, checkpoint.LSN(stored), kcfg.OffsetsTopic, kcfg.TransactionalID, id.Key())}
	}
	if ok && checkpoint.LSN(stored) > slot && start.TimelineChanged() && (!start.ForkKnown || checkpoint.LSN(stored) > start.Fork) {
		// Exactly-once skips every transaction that commits before the
		// stored position, as one Kafka has. Across a fork below it, the
		// transactions this timeline commits there are new ones.
		r.closeProducer(context.WithoutCancel(ctx), p, r.clock.Now().Add(r.cfg.Relay.ShutdownTimeout))
		fork := "a point not in the server's history"
		if start.ForkKnown {
			fork = start.Fork.String()
		}
		return nil, &FatalError{Err: fmt.Errorf("%w: PostgreSQL moved from timeline %d to %d (a promotion or a restore), leaving the old one at %s, before %s, the position the offsets topic %q holds for slot %q: the transactions the new timeline commits in between are not the ones in Kafka, and exactly-once would skip them; to resend from the slot's position %s instead (duplicates of what Kafka holds past it, nothing lost), remove the slot's record (key %q) from the offsets topic",
			ErrTimelineForked, start.State.Timeline, start.Identity.Timeline, fork, checkpoint.LSN(stored), kcfg.OffsetsTopic, start.Slot.Name, slot, id.Key())}
	}
	if ok && checkpoint.LSN(stored) > slot {
		if at := p.StoredAt(); !serverNow.IsZero() && !at.IsZero() && serverNow.Before(at.Add(-serverClockBehind)) {
			// skipTxn tells a put-back database's new transactions by their
			// commit times, later than the stored position's. A server whose
			// clock went back with the database (a VM reverted with its
			// memory, a restore onto a host whose clock is behind) gives its
			// new transactions earlier times, and they would be skipped.
			r.closeProducer(context.WithoutCancel(ctx), p, r.clock.Now().Add(r.cfg.Relay.ShutdownTimeout))
			return nil, &FatalError{Err: fmt.Errorf("%w: the server's clock says %s, %s before %s, when the position the offsets topic %q holds for slot %q (%s) was written by that clock: it went back (a database put back together with its clock, a virtual machine reverted with its memory, or the clock stepped back), and exactly-once, which tells the transactions a put-back database commits anew by their later commit times, would skip them as ones Kafka holds. Set the server's clock right and start again; or, to resend from the slot's position %s instead (duplicates of what Kafka holds past it, nothing lost), remove the slot's record (key %q) from the offsets topic",
				ErrTimelineForked, serverNow.UTC().Format(time.RFC3339), at.Sub(serverNow).Round(time.Second), at.UTC().Format(time.RFC3339), kcfg.OffsetsTopic, start.Slot.Name, checkpoint.LSN(stored), slot, id.Key())}
		}
		if err := r.storedOnThisHistory(ctx, start, checkpoint.LSN(stored), p.StoredTimeline(), kcfg.OffsetsTopic, id); err != nil {
			r.closeProducer(context.WithoutCancel(ctx), p, r.clock.Now().Add(r.cfg.Relay.ShutdownTimeout))
			return nil, err
		}
	}
	if ok {
		r.log.Info("exactly-once: Kafka holds the slot's transactions up to the stored position; those at or below it are skipped",
			zap.Stringer("stored_lsn", checkpoint.LSN(stored)), zap.Stringer("slot_confirmed_lsn", slot), zap.String("transactional_id", kcfg.TransactionalID))
	} else if (start.HadState && start.State.Instance != "" && !r.eosStarted) || r.eosCommitted {
		// A session streamed from the slot before (a row with no instance
		// is migrate's or a first start's, which streamed nothing): if
		// that was with exactly-once, its record is gone (the offsets
		// topic deleted and recreated, renamed, or its retention not
		// compaction), and what Kafka holds past the slot is sent again.
		// So it is, certainly, when a session of this process committed
		// one (the offsets topic deleted while the relay ran).
		r.log.Warn("exactly-once: the offsets topic holds no position for the slot, though pgoutbox streamed from it before: if that was with exactly-once, the record is gone (the topic deleted, renamed or not compacted), and the transactions between the slot's position and the lost one are sent again, visible twice to read_committed consumers; starting at the slot's",
			zap.Stringer("slot_confirmed_lsn", slot), zap.String("transactional_id", kcfg.TransactionalID), zap.String("offsets_topic", kcfg.OffsetsTopic),
			zap.String("last_instance", start.State.Instance), zap.Time("last_session_started_at", start.State.SessionStartedAt))
	} else {
		r.log.Info("exactly-once: the offsets topic holds no position for the slot yet; starting at the slot's",
			zap.Stringer("slot_confirmed_lsn", slot), zap.String("transactional_id", kcfg.TransactionalID))
	}
	r.eosStarted = true
	return p, nil
}

// storedOnThisHistory checks that the position Kafka holds, ahead of the
// slot, lies on this server's WAL history, so that the transactions before
// it are the ones in Kafka. The state row's timeline (checked above) says
// nothing after migrate --recreate-slot, which records the new one: the
// stored record's own timeline does. A position past the end of the
// server's WAL was written before the database was put back (a restore
// from a disk snapshot or a crash-consistent copy starts no new timeline):
// the transactions written there since are new ones.
func (r *Relay) storedOnThisHistory(ctx context.Context, start replication.Start, stored checkpoint.LSN, timeline int32, topic string, id kafka.SlotIdentity) error {
	way := fmt.Sprintf("to resend from the slot's position %s instead (duplicates of what Kafka holds past it, nothing lost), remove the slot's record (key %q) from the offsets topic %q", start.Slot.ConfirmedFlushLSN, id.Key(), topic)
	if tl := start.Identity.Timeline; timeline != 0 && timeline != tl {
		fork, known, err := r.be.TimelineFork(ctx, r.cfg.Postgres, timeline, tl)
		if err != nil {
			return fmt.Errorf("relay: exactly-once: where timeline %d of the stored position left the server's timeline %d: %w", timeline, tl, err)
		}
		if !known || stored > fork {
			at := "a point not in the server's history"
			if known {
				at = fork.String()
			}
			return &FatalError{Err: fmt.Errorf("%w: the offsets topic holds %s for slot %q, written on timeline %d, and the server left that timeline at %s, before it (a promotion or a restore; the slot was recreated since, or the state table would have said so): the transactions this server commits in between are not the ones in Kafka, and exactly-once would skip them; %s",
				ErrTimelineForked, stored, start.Slot.Name, timeline, at, way)}
		}
	}
	if end := start.Identity.WALEnd; end != 0 && stored > end {
		// Read in Prepare, before the offsets topic: another instance may
		// have streamed and committed past it since. Read it again.
		var err error
		if end, err = r.be.WALEnd(ctx, r.cfg.Postgres); err != nil {
			return fmt.Errorf("relay: exactly-once: read the end of the server's WAL: %w", err)
		}
		if end == 0 || stored <= end {
			return nil
		}
		return &FatalError{Err: fmt.Errorf("%w: the offsets topic holds %s for slot %q, past %s, the end of this server's WAL: the database was put back to an earlier point (a restore from a snapshot or a backup) after Kafka got those transactions, and the transactions it commits there now are new ones, which exactly-once would skip; %s",
			ErrTimelineForked, stored, start.Slot.Name, end, way)}
	}
	return nil
}

// fencedAfter, called once the session's producer is closed, says whether
// Kafka refused it for its epoch in the end: the session ended for another
// reason first (its PostgreSQL connection ended while another instance took
// over, say), and the refusal came with the abort at close or with the
// acknowledgements left unread.
func (e *eosSession) fencedAfter() error {
	if e == nil {
		return nil
	}
	err := e.prod.Fenced()
	for err == nil {
		select {
		case a, ok := <-e.prod.Acks():
			if !ok {
				return nil
			}
			if a.Err != nil && kafka.IsFenced(a.Err) {
				err = a.Err
			}
			continue
		case res, ok := <-e.prod.Commits():
			if ok && res.Err != nil && kafka.IsFenced(res.Err) {
				err = res.Err
			}
			if ok {
				continue
			}
		default:
		}
		break
	}
	if err == nil {
		return nil
	}
	return e.fenced(err, e.openSince())
}

// openSince is when the Kafka transaction still open, or being committed,
// began (its first record); zero with none (an idle session: a refusal for
// the epoch is then another instance's takeover).
func (e *eosSession) openSince() time.Time {
	if e.groupRecords > 0 || e.outstanding > 0 {
		return e.groupStart
	}
	return time.Time{}
}
