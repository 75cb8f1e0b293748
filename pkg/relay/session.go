package relay

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/pgoutbox/pgoutbox/checkpoint"
	"github.com/pgoutbox/pgoutbox/pkg/kafka"
	"github.com/pgoutbox/pgoutbox/replication"
	"github.com/pgoutbox/pgoutbox/router"
)

// recordOverhead is what one record in flight costs beyond its bytes: our
// message, sarama's message and its share of a request buffer. It is
// counted against relay.max.inflight.bytes with the bytes themselves.
const recordOverhead = 512

// relationWait bounds how long the loop waits for the catalog to say what a
// relation it has not seen before is (a partition attached while streaming).
const relationWait = 30 * time.Second

// stopReserve is the part of relay.shutdown.timeout kept for the final
// status update and closing, after waiting for the open transaction and
// for acknowledgements.
func stopReserve(timeout time.Duration) time.Duration { return min(2*time.Second, timeout/5) }

// session is one replication session.
//
// Concurrency: everything in it is owned by Run's goroutine. The producer,
// the topic checker and the catalog watcher post into channels that the
// loop reads between WAL messages and while it waits.
type session struct {
	r     *Relay
	log   *zap.Logger
	clock clock
	ctx   context.Context // Run's: ends at the first stop request
	// recvCtx is Receive's: it ends only with a stop at once.
	recvCtx context.Context
	st      stream
	prod    producer
	tr      *checkpoint.Tracker
	start   replication.Start

	topics  *topicGate
	watcher catalogWatcher
	rec     router.Record
	rels    map[*replication.Relation]relClass
	// relByID is the relation of each ID in rels: pgoutput announces a
	// table again after every invalidation of its cached catalog entry
	// (autovacuum's statistics, any DDL), and the class of the one it
	// replaced goes (every change that used it was handled before the new
	// one came), or rels grew for the whole session.
	relByID map[uint32]*replication.Relation
	// xid is the open transaction's (BEGIN's).
	xid uint32
	// othersLogged: the other tables classified already named in the log.
	othersLogged map[string]bool
	// sent counts the records handed to this session's producer.
	sent int64
	// prefixesLogged: the prefixes of other messages named in the log;
	// eventPrefixes: those of messages that look like events and no relay
	// records, said at Error (eventPrefixLogged: when, past a thousand).
	prefixesLogged    map[string]bool
	eventPrefixes     map[string]bool
	eventPrefixLogged time.Time
	// otherPrefixes: the messages.prefix other slots relay with, as last
	// read (the start's, then the catalog checks'); unsure and prefixAsk:
	// see holdUnsure.
	otherPrefixes map[string]string
	unsure        map[string]*unsurePrefix
	prefixAsk     uint64
	// debeziumSeen: the prefixes of messages judged by debeziumMessage.
	debeziumSeen map[string]bool

	cur    checkpoint.TxnID
	commit checkpoint.LSN // FinalLSN of the open transaction, for messages
	// commitTime is the open transaction's commit time (Unix ns), stamped
	// on its records to measure commit-to-ack latency.
	commitTime int64
	// hasRecords says the open transaction produced a record;
	// eventCommit is the commit end of the last one that did.
	hasRecords  bool
	eventCommit checkpoint.LSN
	lastCommit  time.Time
	// dbzLastCommit is the end of the last transaction decoded, or the
	// last non-transactional message, in this session (0: none yet): the
	// first element of the sequence in Debezium's message records.
	dbzLastCommit checkpoint.LSN
	// debeziumWrites caches, per prefix, whether Debezium's filters let a
	// message through (writesDebeziumRecord).
	debeziumWrites map[string]bool
	received       checkpoint.LSN
	// commits holds the commit LSN of transactions commitsBase,
	// commitsBase+1, ... that may still be pending, for error messages.
	// TxnIDs are sequential, so a slice trimmed from the front is enough.
	commits     []checkpoint.LSN
	commitsBase checkpoint.TxnID

	// inflightBytes counts the bytes records in flight hold of their own
	// (outside WAL chunks) plus recordOverhead each; pinned counts the
	// WAL chunks they point into, whole.
	inflightBytes int64
	pinned        int64
	sentConfirmed checkpoint.LSN
	lastStatus    time.Time
	nextStatus    time.Time
	walEnd        checkpoint.LSN

	// verified is the WAL position of the last catalog check that passed:
	// nothing past it is confirmed (a DDL after it may have taken a table
	// out of the stream), not even when the server shuts down (see
	// errServerStopping).
	verified      checkpoint.LSN
	lastCheckAsk  time.Time
	catalogFailed int

	// fence is how far the state row says this session may confirm
	// (stopped_lsn): nothing past it is confirmed until the watcher has
	// raised it, so that after a crash a slot found past the row was moved
	// by someone else. fenceOn: there is a state table that keeps it.
	fence        checkpoint.LSN
	fenceOn      bool
	lastFenceAsk time.Time
	// tailRaised: the fence was raised once for the WAL without events
	// that followed the last raise; the tail that raise wrote itself is
	// left until more comes.
	tailRaised bool

	// latest is the catalog of the last check that passed.
	latest replication.Catalog
	// warnedXmin is the publication row's xmin last warned of (the
	// session start's at first).
	warnedXmin uint32

	// pendingRel is a relation the loop waits for the catalog to classify,
	// with a check made at or after pendingAt. pendingCls is its class
	// when only its column types were unknown.
	pendingRel *replication.Relation
	// latestSaw is the transaction the latest check was made to see
	// (See): the pending relation's, s.xid (no WAL is read while one is
	// pending), before it may classify it.
	latestSaw  uint32
	pendingCls *relClass
	pendingAt  checkpoint.LSN
	pendingBy  time.Time

	// failures are acks the loop made itself (a topic that does not exist,
	// a record too large for its topic), handled like Kafka's.
	failures []kafka.Ack

	// ackWaitSince is when the records in flight began to wait for Kafka
	// with no ack arriving (zero: none in flight); unackedWarned is when
	// warnUnacked last said so.
	ackWaitSince  time.Time
	unackedWarned time.Time

	stopping bool
	stopBy   time.Time // the end of the whole stop's budget
	// stopSeen: a wait returned for the stop request.
	stopSeen bool
	// ending: the final status is sent; the helpers' results no longer
	// wake the stream (a Wake would cut EndStream's wait for the server).
	ending atomic.Bool

	// eos is exactly-once mode's part of the session (eos.go): Kafka
	// transactions, the position Kafka committed. Nil in at-least-once
	// mode, where each of its methods does nothing.
	eos *eosSession
	// localFailure: the failure being handled is one the loop made (it
	// never reached Kafka).
	localFailure bool

	// Catch-up progress: the server's WAL position at the last catalog
	// check, and the position and time of the last progress report.
	serverWAL    checkpoint.LSN
	progressAt   time.Time
	progressFrom checkpoint.LSN
	rate         float64
	behind       bool
}

// relClass is what a relation of the stream is to the relay.
type relClass struct {
	table string // the configured outbox table it is, or is a partition of
	// types and mods are the columns' types and type modifiers its rows
	// are routed by: the relation's, with domains resolved to their base
	// types (nil: the relation's own).
	types []uint32
	mods  []int32
	other bool // another table of a FOR ALL TABLES publication: skipped
	// gone lists the event columns the relation lacks (renamed, dropped
	// or made generated since the session's start-up check): its inserts
	// stop the relay.
	gone []string
	// unexpected explains a relation that is neither: its changes are
	// poison.
	unexpected string
}

func newSession(r *Relay, ctx context.Context, start replication.Start, st stream, prod producer) *session {
	s := &session{
		r:             r,
		log:           r.log,
		clock:         r.clock,
		ctx:           ctx,
		st:            st,
		prod:          prod,
		tr:            checkpoint.New(start.Slot.ConfirmedFlushLSN),
		start:         start,
		rels:          map[*replication.Relation]relClass{},
		relByID:       map[uint32]*replication.Relation{},
		sentConfirmed: start.Slot.ConfirmedFlushLSN,
		walEnd:        start.Slot.ConfirmedFlushLSN,
		verified:      max(start.Catalog.CheckedAt, start.Slot.ConfirmedFlushLSN),
		serverWAL:     start.Catalog.CheckedAt,
		fence:         start.Slot.ConfirmedFlushLSN,
		fenceOn:       r.cfg.Postgres.StateTable != "",
		warnedXmin:    start.Catalog.PublicationXmin,
		otherPrefixes: start.OtherPrefixes,
	}
	s.topics = newTopicGate(s, r.be.StartTopicChecker(r.cfg.Kafka, s.wake))
	s.watcher = r.be.StartCatalogWatcher(r.cfg.Postgres, r.instance, &start.Catalog, s.wake)
	return s
}

// wake wakes the stream for a helper's result, unless the session ends.
func (s *session) wake() {
	if !s.ending.Load() {
		s.st.Wake()
	}
}

// loop reads WAL and acks until the context is cancelled (at a transaction
// boundary: errStopped) or something fails.
func (s *session) loop() error {
	lim := s.r.cfg.Relay
	interval := s.r.cfg.Postgres.StatusInterval
	// A stop request wakes a Receive that waits for data, so that an idle
	// relay stops at once. The context Receive is given is made once: the
	// stream watches each new one (a context.AfterFunc), which per message
	// would cost allocations on the hot path.
	defer context.AfterFunc(s.ctx, s.st.Wake)()
	s.recvCtx = s.forceCtx()
	s.nextStatus = s.clock.Now().Add(interval)
	for {
		if !s.stopping && s.ctx.Err() != nil {
			s.stopping = true
			s.stopBy = s.clock.Now().Add(lim.ShutdownTimeout)
			s.log.Info("stopping at the next transaction boundary", zap.Duration("budget", lim.ShutdownTimeout))
		}
		if s.forced() {
			return errForced
		}
		if err := s.drain(); err != nil {
			return err
		}
		if err := s.eos.checkAge(); err != nil {
			return err
		}
		s.eos.step()
		if s.stopping {
			if !s.tr.Open() {
				return errStopped
			}
			if !s.clock.Now().Before(s.drainBy()) {
				return fmt.Errorf("relay: transaction still open %s after the stop request (relay.shutdown.timeout %s, less the time kept for confirming and closing); stopping without confirming it",
					s.clock.Now().Sub(s.stopBy.Add(-lim.ShutdownTimeout)).Round(time.Millisecond), lim.ShutdownTimeout)
			}
		}
		// singleUntil is where a commit record begins; the tracker confirms
		// where one ends. Only past it was that transaction resent: the
		// confirmed position may begin there already (the transaction
		// before ends there, or an idle keepalive put it there).
		if s.r.singleUntil > 0 && s.tr.Confirmed() > s.r.singleUntil && !s.tr.Open() && s.tr.InFlight() == 0 {
			s.r.singleUntil = 0
			return errNewProducer
		}
		if s.sent >= s.r.maxProducerRecords && !s.tr.Open() && s.tr.InFlight() == 0 {
			s.log.Info("handing over to a new producer: this one's sequence numbers near their limit", zap.Int64("records", s.sent))
			return errNewProducer
		}
		now := s.clock.Now()
		// Confirm promptly when the position moved (so a crash repeats
		// little), but at most every confirmEvery; otherwise on the interval.
		if !now.Before(s.nextStatus) || (s.confirmable() != s.sentConfirmed && now.Sub(s.lastStatus) >= confirmEvery) {
			if err := s.status(false); err != nil {
				return err
			}
		}
		if s.pendingRel != nil {
			// Stop reading WAL until the catalog says what the relation is.
			if !now.Before(s.pendingBy) {
				return s.unclassified()
			}
			until := s.nextStatus
			if s.pendingBy.Before(until) {
				until = s.pendingBy
			}
			if err := s.wait(until); err != nil {
				return err
			}
			continue
		}
		if h := s.eos.headroom(); s.tr.InFlight() >= h*lim.MaxInFlightRecords || s.inflightBytes+s.pinned >= int64(h)*lim.MaxInFlightBytes ||
			(s.tr.Pending() >= s.r.maxPending || s.sent >= s.r.maxProducerRecords) && !s.tr.Open() {
			// Back-pressure: stop reading WAL, keep sending status updates.
			s.eos.pressed()
			if err := s.wait(s.waitDeadline()); err != nil {
				return err
			}
			continue
		}
		ev, err := s.st.Receive(s.recvCtx, s.waitDeadline())
		if err != nil {
			if s.forced() {
				return errForced
			}
			if de := (*replication.DecodeError)(nil); errors.As(err, &de) {
				// The same bytes come again after every restart: said
				// once, loudly, not retried at Warn for ever.
				return &FatalError{Err: fmt.Errorf("relay: the stream carries a message pgoutbox cannot read, after %s (the last position confirmed: %s); every restart would stop on it again, and nothing past it is relayed or confirmed: %w",
					s.received, s.confirmable(), err)}
			}
			if tl := (*replication.MessageTooLargeError)(nil); errors.As(err, &tl) {
				return s.messageTooLarge(tl)
			}
			return err
		}
		if ev.WALStart > s.received {
			s.received = ev.WALStart
		}
		if err := s.handle(ev); err != nil {
			return err
		}
	}
}

// messageTooLarge is the stop on a message from the walsender longer than
// the stream reads (postgres.receive.max.message.bytes): read, it could
// get the process OOM-killed, and the standby after it, in a loop that
// names nothing; every new session would meet it again. Nothing at or
// after it was confirmed.
func (s *session) messageTooLarge(tl *replication.MessageTooLargeError) error {
	where := "outside any transaction (a non-transactional logical decoding message)"
	if s.tr.Open() {
		where = fmt.Sprintf("in transaction %d, committed at %s", s.xid, s.commit)
	}
	return &FatalError{Err: fmt.Errorf("relay: a row or logical decoding message of %d bytes %s, more than the %d bytes pgoutbox reads in one message (a cap set by %s): %s: %w",
		tl.Size, where, tl.Cap.Bytes, tl.Cap.How, tooLargeAdvice(tl.Size, fmt.Sprintf("nothing at or after it was relayed or confirmed (the last position confirmed: %s)", s.confirmable())), tl)}
}

// tooLargeAdvice is what each stop on a row or message longer than the
// receive cap (WAL stream, poll claim, initial snapshot) says after naming
// it: why it stops, what happened meanwhile, and the way on, the memory
// limit that carries a message of size bytes.
func tooLargeAdvice(size int, happened string) string {
	return fmt.Sprintf("it is read whole, and a process short of the memory for it is OOM-killed; %s, and every start stops on it again: give pgoutbox a memory limit of at least %d MiB (the chart's streams[].resources) or set postgres.receive.max.message.bytes",
		happened, replication.LimitFor(size))
}

// errForced ends a session stopped at once by a second signal.
var errForced = errors.New("relay: stopped at once by a second signal")

// forced reports whether a stop at once was requested.
func (s *session) forced() bool {
	if s.r.force == nil {
		return false
	}
	select {
	case <-s.r.force:
		return true
	default:
		return false
	}
}

// forceCtx is done when a stop at once is requested; it interrupts a
// Receive that waits.
func (s *session) forceCtx() context.Context {
	if s.r.force == nil {
		return context.WithoutCancel(s.ctx)
	}
	return forceContext{s.ctx, s.r.force}
}

// drainBy is when waiting for the open transaction and the acknowledgements
// must end, so that the rest of the stop fits in its budget.
func (s *session) drainBy() time.Time {
	return s.stopBy.Add(-stopReserve(s.r.cfg.Relay.ShutdownTimeout))
}

// waitDeadline is when the next wait or Receive must end: the next status
// update, or the end of the stop's budget.
func (s *session) waitDeadline() time.Time {
	d := s.nextStatus
	if s.stopping && s.drainBy().Before(d) {
		d = s.drainBy()
	}
	if t, ok := s.eos.due(); ok && t.Before(d) {
		d = t
	}
	if t, ok := s.eos.recheck(); ok && t.Before(d) {
		d = t
	}
	return d
}

// wait blocks until something arrives for the loop (an ack, a topic check,
// a catalog check), the deadline passes, or a stop is requested.
func (s *session) wait(deadline time.Time) error {
	t := s.clock.NewTimer(deadline.Sub(s.clock.Now()))
	defer t.Stop()
	var stop <-chan struct{}
	if !s.stopping && !s.stopSeen {
		stop = s.ctx.Done()
	}
	select {
	case a, ok := <-s.prod.Acks():
		if !ok {
			return errors.New("relay: producer closed its acknowledgement channel")
		}
		return s.ack(a)
	case res := <-s.eos.results():
		return s.eos.result(res)
	case res := <-s.topics.checker.Results():
		s.topics.result(res)
	case res := <-s.watcher.Results():
		return s.catalog(res)
	case <-t.C():
	case <-stop:
		// Once: the loop's top turns it into stopping, and finish's drain,
		// which has no top, would otherwise wake here at once every time.
		s.stopSeen = true
	case <-s.r.force:
	}
	return nil
}

// drain handles, without waiting, everything that arrived for the loop.
func (s *session) drain() error {
	for {
		select {
		case a, ok := <-s.prod.Acks():
			if !ok {
				return errors.New("relay: producer closed its acknowledgement channel")
			}
			if err := s.ack(a); err != nil {
				return err
			}
			continue
		case res := <-s.eos.results():
			if err := s.eos.result(res); err != nil {
				return err
			}
			continue
		case res := <-s.topics.checker.Results():
			s.topics.result(res)
			continue
		case res := <-s.watcher.Results():
			if err := s.catalog(res); err != nil {
				return err
			}
			continue
		default:
		}
		if len(s.failures) == 0 {
			return nil
		}
		a := s.failures[0]
		s.failures = s.failures[1:]
		s.localFailure = true
		err := s.ack(a)
		s.localFailure = false
		if err != nil {
			return err
		}
	}
}

// confirmable is the position the slot may be told: the tracker's, but not
// past the last catalog check that passed (nor, in exactly-once mode, past
// what Kafka committed).
func (s *session) confirmable() checkpoint.LSN {
	c := s.eos.cap(s.tr.Confirmed())
	limit := s.verified
	if s.fenceOn {
		limit = min(limit, s.fence)
	}
	if c > limit {
		c = max(limit, s.sentConfirmed)
	}
	return c
}

// unfenced is confirmable without the fence: how far a raise should take it.
func (s *session) unfenced() checkpoint.LSN {
	c := s.eos.cap(s.tr.Confirmed())
	if c > s.verified {
		c = max(s.verified, s.sentConfirmed)
	}
	return c
}

// Raising the fence writes WAL, which moves the end again: raised on every
// keepalive, an idle relay would write the state row forever. So it is
// raised for events past it, for fenceSlack of other WAL, and once for the
// tail of other WAL when fenceTailAfter has passed since the last raise.
// What that raise wrote itself (a row update: a few hundred bytes, 8 KB
// with a full-page image), and other WAL after it short of fenceSlack, stay
// unconfirmed until more comes: one raise never writes enough to call for
// the next.
const (
	fenceSlack     = 64 << 10
	fenceTailAfter = time.Second
)

// fenceDue says the fence holds back a confirmation worth raising it for:
// events (the stop waits for these), fenceSlack of other WAL, or (tail) a
// tail of other WAL not raised for yet, which requestCheck raises only
// fenceTailAfter after the last raise. It reads no clock: it runs on every
// acknowledgement.
func (s *session) fenceDue() (due, tail bool) {
	if !s.fenceOn || s.tr.Confirmed() <= s.fence {
		return false, false
	}
	c := s.unfenced()
	switch {
	case c <= s.fence:
		return false, false
	case s.eventCommit > s.fence || c-s.fence >= fenceSlack:
		return true, false
	}
	return !s.tailRaised, !s.tailRaised
}

// fenceHolds says the fence holds back events the stop should wait for.
func (s *session) fenceHolds() bool {
	due, tail := s.fenceDue()
	return due && !tail && s.eventCommit > s.fence
}

// catalog handles a catalog check.
func (s *session) catalog(res catalogResult) error {
	cfg := s.r.cfg.Postgres
	if res.Err != nil {
		if res.ShuttingDown {
			// (The check's error by its text: wrapped, a PgError would make
			// the replication connection, which is fine, look broken.)
			return fmt.Errorf("relay: %w (%v): the stream ends at %s, the last position a catalog check covers, and what follows it is read and sent again once the server is back",
				errServerStopping, res.Err, s.confirmable())
		}
		s.catalogFailed++
		if s.catalogFailed == 3 || s.catalogFailed%60 == 0 {
			s.log.Warn("cannot check the publication and the outbox tables; the slot is not confirmed past the last check until a check passes",
				zap.Stringer("verified_lsn", s.verified), zap.Int("failed_checks", s.catalogFailed), zap.Error(res.Err))
		}
		return nil
	}
	if s.catalogFailed >= 3 {
		s.log.Info("the publication check passes again", zap.Int("failed_checks", s.catalogFailed))
	}
	s.catalogFailed = 0
	if changes := append(s.start.Catalog.Changes(&res.Catalog, cfg), res.Attached...); len(changes) > 0 {
		return &FatalError{Err: &replication.CatalogError{Publication: cfg.Publication, Problems: changes, Err: replication.ErrCatalogChanged}}
	}
	if res.Catalog.Publication == s.start.Catalog.Publication && res.Catalog.PublicationXmin != s.warnedXmin {
		if w := res.Catalog.Altered(s.start.Catalog.PublicationXmin, "the session started", cfg); w != "" {
			s.r.publicationAltered(w, cfg.Publication)
		}
		s.warnedXmin = res.Catalog.PublicationXmin
	}
	s.verified = max(s.verified, res.Catalog.CheckedAt)
	s.serverWAL = max(s.serverWAL, res.Catalog.CheckedAt)
	s.fence = max(s.fence, res.Fence)
	if res.FenceOff {
		s.fenceOn = false
	}
	s.latest, s.latestSaw = res.Catalog, res.Saw
	s.prefixesRead(res)
	if s.pendingRel != nil {
		s.classifyPending()
	}
	return nil
}

// errServerStopping ends a session when a catalog check is refused with
// 57P03: the server is shutting down. PostgreSQL's shutdown waits for each
// walsender's client to confirm the end of WAL, but nothing past the last
// check that passed may be confirmed: a DDL just before the shutdown (a
// table taken out of the publication, its rows then unpublished) would be
// passed unseen, and a smart shutdown lets sessions go on committing. So
// the session ends: the walsender exits, the shutdown goes on, and what
// follows the confirmed position is read, and sent again, once the server
// is back. (Ending loses nothing: the next session starts at the slot.)
var errServerStopping = errors.New("PostgreSQL is shutting down")

// replyAsked handles a keepalive that asks for a reply with the WAL end
// end. The walsender of a server that shuts down asks over and over while
// it waits for end to be confirmed (otherwise it asks only after half of
// wal_sender_timeout without a reply). When the session cannot confirm
// end, it asks for a catalog check, which a server that shuts down refuses
// (errServerStopping): so it does not hold a shutdown up even when nothing
// else would ask for one (Kafka not answering).
func (s *session) replyAsked(end checkpoint.LSN) {
	if s.confirmable() >= end {
		return
	}
	if now := s.clock.Now(); now.Sub(s.lastCheckAsk) >= confirmEvery {
		s.lastCheckAsk = now
		s.watcher.Check()
	}
}

// requestCheck asks the watcher for a check when the confirmable position
// lags behind what the tracker could confirm, or for a raise of the fence
// when fenceDue (each at most every confirmEvery). The clock is read only
// when one is due.
func (s *session) requestCheck() {
	due, tail := s.fenceDue()
	check := s.tr.Confirmed() > s.verified
	if !due && !check {
		return
	}
	now := s.clock.Now()
	if due {
		gap := confirmEvery
		if tail {
			gap = fenceTailAfter
		}
		if now.Sub(s.lastFenceAsk) >= gap {
			// A raise is a check too: it reads the catalog in the same
			// round trip.
			s.lastFenceAsk, s.lastCheckAsk, s.tailRaised = now, now, tail
			s.watcher.RaiseFence(s.unfenced())
			return
		}
	}
	if check && now.Sub(s.lastCheckAsk) >= confirmEvery {
		s.lastCheckAsk = now
		s.watcher.Check()
	}
}

func (s *session) ack(a kafka.Ack) error {
	s.inflightBytes -= int64(a.Held)
	if c, ok := a.Hold.(*replication.Chunk); ok && c.Unpin() {
		s.pinned -= int64(c.Size())
	}
	id := checkpoint.TxnID(a.Ref)
	if a.Err != nil {
		return s.failed(id, a)
	}
	if err := s.tr.Ack(id); err != nil {
		return fmt.Errorf("relay: ack for transaction %d: %w", id, err)
	}
	now := s.clock.Now()
	s.ackWaitSince = now
	if s.tr.InFlight() == 0 {
		s.ackWaitSince = time.Time{}
	}
	s.r.obs.Acked(a.Topic, a.Bytes, now.Sub(time.Unix(0, a.Stamp)), now.Sub(a.Sent))
	if due, tail := s.fenceDue(); due && !tail {
		s.requestCheck()
	}
	return nil
}

// failed handles a record Kafka did not accept.
func (s *session) failed(id checkpoint.TxnID, a kafka.Ack) error {
	s.r.obs.Failed(a.Topic, a.Err)
	lsn := s.commitLSN(id)
	lim := s.r.cfg.Relay
	if kafka.IsUnknownTopic(a.Err) {
		// Deleted, most likely: its next records wait for the topic
		// checker, and are poison once it has been missing for
		// kafka.topic.missing.timeout.
		s.r.topics.forget(a.Topic, a.Sent, s.clock.Now())
	}
	if !s.localFailure {
		if handled, err := s.eos.failedAck(a, lsn); handled {
			s.tr.Fail(id)
			return err
		}
	}
	if kafka.MayBeStaleMetadata(a.Err) && !s.r.staleRetried[lsn] {
		s.tr.Fail(id)
		s.r.staleRetried[lsn] = true
		s.log.Warn("Kafka refused a record for a partition or topic the producer's metadata lacks, which may be out of date (a partition added since, a leader moving): restarting with fresh metadata; refused again, the record is poison",
			zap.String("topic", a.Topic), zap.ByteString("event_id", a.EventID), zap.Stringer("commit_lsn", lsn), zap.Error(a.Err))
		return &ProduceError{EventID: string(a.EventID), Topic: a.Topic, LSN: lsn, Err: a.Err}
	}
	if kafka.IsBatchRefused(a.Err) && s.r.singleUntil == 0 {
		// The broker refused a whole batch; its other records may be
		// good. Resend from the slot, one record per request, until past
		// the last transaction sent so far.
		s.tr.Fail(id)
		s.r.singleUntil = max(s.lastSent(), lsn)
		s.log.Warn("Kafka refused a whole batch for one of its records (too large for the topic, a timestamp out of its range, ...); resending them one at a time, so that only that record is poison",
			zap.String("topic", a.Topic), zap.ByteString("event_id", a.EventID), zap.Stringer("commit_lsn", lsn), zap.Error(a.Err))
		return &ProduceError{EventID: string(a.EventID), Topic: a.Topic, LSN: lsn, Err: a.Err}
	}
	// Refused again after a restart with fresh metadata: a topic deleted
	// says so (refusedAgain).
	a.Err = refusedAgain(a)
	if kafka.IsPoison(a.Err) {
		if lim.PoisonPolicy == "dead-letter" && a.Topic != lim.DeadLetterTopic {
			// The dead-letter record takes the failed one's place in its
			// transaction's count.
			s.log.Warn("dead-lettering a record Kafka cannot accept", zap.ByteString("event_id", a.EventID),
				zap.String("topic", a.Topic), zap.Stringer("commit_lsn", lsn), zap.Error(a.Err))
			s.deadLetter(id, a.Key, a.Value, a.EventID, a.Err.Error(), "", a.Topic, lsn, a.Stamp, a.Hold)
			return nil
		}
		s.tr.Fail(id)
		return &FatalError{Err: &ProduceError{EventID: string(a.EventID), Topic: a.Topic, LSN: lsn,
			Err: fmt.Errorf("%w (poison.policy=%s: stopping; nothing at or after transaction %s was confirmed)", a.Err, lim.PoisonPolicy, lsn)}}
	}
	s.tr.Fail(id)
	s.log.Error("Kafka did not accept a record; no later position will be confirmed",
		zap.ByteString("event_id", a.EventID), zap.String("topic", a.Topic), zap.Stringer("commit_lsn", lsn), zap.Error(a.Err))
	return &ProduceError{EventID: string(a.EventID), Topic: a.Topic, LSN: lsn, Err: a.Err}
}

// lastSent is the commit LSN of the newest transaction that records were
// sent for.
func (s *session) lastSent() checkpoint.LSN {
	if len(s.commits) == 0 {
		return 0
	}
	return s.commits[len(s.commits)-1]
}

// status sends a standby status update with the confirmable position. When
// the relay is idle it asks the server to reply, so that the keepalive that
// comes back carries a WAL end the tracker can adopt.
func (s *session) status(force bool) error {
	confirmed := s.confirmable()
	idle := !s.tr.Open() && s.tr.InFlight() == 0 && !s.tr.Failed()
	// Recorded before sending: if the send fails half-way the server may
	// still have taken it.
	s.r.history.lastConfirmed = max(s.r.history.lastConfirmed, confirmed)
	ctx, cancel := s.statusContext()
	err := s.st.SendStatus(ctx, confirmed, idle && !force)
	cancel()
	if err != nil {
		return err
	}
	s.lastStatus = s.clock.Now()
	s.nextStatus = s.lastStatus.Add(s.r.cfg.Postgres.StatusInterval)
	s.sentConfirmed = confirmed
	s.watcher.Confirmed(confirmed, min(s.eventCommit, confirmed))
	s.reportProgress()
	s.warnUnacked()
	s.progress()
	return nil
}

// unackedWarnAfter is how long records may wait for Kafka with no ack
// arriving before the log says so, and how often it says so again while
// they wait: sarama retries quietly (for minutes, through an outage), and
// only /readyz would tell otherwise.
const unackedWarnAfter = 30 * time.Second

// warnUnacked warns, every unackedWarnAfter, of records in flight for which
// no ack has arrived for that long.
func (s *session) warnUnacked() {
	n := s.tr.InFlight()
	if n == 0 {
		return
	}
	now := s.clock.Now()
	waited := now.Sub(s.ackWaitSince)
	if waited < unackedWarnAfter || now.Sub(s.unackedWarned) < unackedWarnAfter {
		return
	}
	s.unackedWarned = now
	s.log.Warn("records wait for Kafka with no acknowledgement: the producer still retries them (a broker down or not answering, a partition without a leader, a topic deleted: see kafka.metadata.timeout); nothing past them is confirmed meanwhile",
		zap.Int("records", n), zap.Duration("waiting", waited.Round(time.Second)), zap.Stringer("confirmed_lsn", s.sentConfirmed))
}

// statusContext bounds one status update's write: a server that does not
// read gets the status interval, never more.
func (s *session) statusContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(s.ctx), s.r.cfg.Postgres.StatusInterval)
}

func (s *session) progress() {
	s.r.obs.Progress(Progress{
		Received:        s.received,
		Confirmed:       s.sentConfirmed,
		ServerWALEnd:    s.walEnd,
		InFlightRecords: s.tr.InFlight(),
		InFlightBytes:   s.inflightBytes + s.pinned,
		PendingTxns:     s.tr.Pending(),
		Idle:            !s.tr.Open() && s.tr.InFlight() == 0,
		Verified:        s.verified,
		LastCommitTime:  s.lastCommit,
		ServerWAL:       s.serverWAL,
		Behind:          s.behindBytes(),
		CatchUpRate:     s.rate,
	})
}

// behindBytes is how much WAL the relay has yet to read to reach the
// server's position at the last catalog check (0 when idle: the server
// sends nothing for transactions that touch no published table).
func (s *session) behindBytes() int64 {
	pos := max(s.received, s.sentConfirmed)
	if s.serverWAL <= pos || s.tr.Confirmed() >= s.serverWAL || (!s.tr.Open() && s.tr.InFlight() == 0 && s.walEnd >= s.serverWAL) {
		return 0
	}
	return int64(s.serverWAL - pos)
}

// catchUpThreshold: behind by more than this, or reading transactions
// committed longer ago than catchUpAge, the relay reports its progress.
const (
	catchUpThreshold = 1 << 20
	catchUpAge       = 10 * time.Second
)

// reportProgress logs, every relay.progress.interval while the relay is
// behind, how far behind it is, how fast it catches up and when it expects
// to be done; and once when it has caught up.
func (s *session) reportProgress() {
	now := s.clock.Now()
	if s.progressAt.IsZero() {
		s.progressAt, s.progressFrom = now, s.received
		return
	}
	elapsed := now.Sub(s.progressAt)
	if elapsed < s.r.cfg.Relay.ProgressInterval {
		return
	}
	s.rate = float64(s.received-min(s.progressFrom, s.received)) / elapsed.Seconds()
	s.progressAt, s.progressFrom = now, s.received
	behind := s.behindBytes()
	age := time.Duration(0)
	if !s.lastCommit.IsZero() {
		age = now.Sub(s.lastCommit)
	}
	if behind < catchUpThreshold && (age < catchUpAge || behind == 0) {
		if s.behind {
			s.behind = false
			s.log.Info("caught up", zap.Stringer("received_lsn", s.received), zap.Stringer("confirmed_lsn", s.sentConfirmed))
		}
		s.rate = 0
		return
	}
	s.behind = true
	fields := []zap.Field{zap.Int64("behind_bytes", behind), zap.Duration("last_commit_age", age.Round(time.Millisecond)),
		zap.Float64("rate_bytes_per_second", s.rate), zap.Stringer("received_lsn", s.received), zap.Stringer("server_lsn", s.serverWAL),
		zap.Stringer("confirmed_lsn", s.sentConfirmed)}
	if s.rate > 0 {
		fields = append(fields, zap.Duration("estimated_time_left", time.Duration(float64(behind)/s.rate*float64(time.Second)).Round(time.Second)))
	}
	s.log.Info("catching up", fields...)
}

func (s *session) handle(ev replication.Event) error {
	if s.eos.skipping() {
		return s.skipped(ev)
	}
	switch {
	case ev.Begin != nil:
		s.xid = ev.Begin.XID
		if s.eos.skip(ev.Begin.FinalLSN) {
			return s.eos.skipTxn(ev.Begin)
		}
		// Every transaction before it, the ones to skip, was read.
		if err := s.eos.reading(ev.Begin); err != nil {
			return err
		}
		id, err := s.tr.Begin()
		if err != nil {
			return fmt.Errorf("relay: BEGIN of xid %d at %s: %w", ev.Begin.XID, ev.Begin.FinalLSN, err)
		}
		s.cur = id
		s.commit = ev.Begin.FinalLSN
		s.commitTime = ev.Begin.CommitTime.UnixNano()
		s.lastCommit = ev.Begin.CommitTime
		s.hasRecords = false
		s.rememberCommit(id, ev.Begin.FinalLSN)
	case ev.Change != nil:
		return s.change(ev.Change)
	case ev.Commit != nil:
		if err := s.tr.Commit(ev.Commit.EndLSN); err != nil {
			return fmt.Errorf("relay: COMMIT at %s: %w", ev.Commit.EndLSN, err)
		}
		s.dbzLastCommit = ev.Commit.EndLSN
		if s.hasRecords {
			s.eventCommit = ev.Commit.EndLSN
		}
		s.eos.ended(ev.Commit.EndLSN)
		s.requestCheck()
	case ev.Keepalive != nil:
		k := ev.Keepalive
		if !s.tr.Open() {
			if err := s.eos.keepalive(k.WALEnd); err != nil {
				return err
			}
		}
		if k.WALEnd > s.walEnd {
			s.walEnd = k.WALEnd
		}
		// Adopting the WAL end is safe only with nothing open or in flight;
		// the tracker checks that. It keeps an idle outbox from pinning WAL.
		s.tr.Idle(k.WALEnd)
		if !s.tr.Open() {
			// Between transactions the walsender has sent every commit
			// before its WAL end.
			s.eos.readTo(k.WALEnd)
		}
		s.eos.idle(s.tr.Confirmed(), k.ServerTime)
		s.requestCheck()
		if k.ReplyRequested {
			s.replyAsked(k.WALEnd)
			return s.status(true)
		}
	case ev.Relation != nil:
		s.relation(ev.Relation)
	case ev.Message != nil:
		return s.message(ev.Message)
	case ev.StreamAbort != nil:
		// PostgreSQL 18 sends these on protocol v1 for transactions that
		// aborted before they were decoded; none of their changes was sent.
		s.log.Debug("skipping a stream abort of a transaction that was never sent",
			zap.Uint32("xid", ev.StreamAbort.XID), zap.Uint32("subxid", ev.StreamAbort.SubXID), zap.Stringer("wal", ev.WALStart))
	case ev.Truncate != nil:
		// A TRUNCATE carries no events (Debezium's router skips them too).
	}
	return nil
}

// message routes a table-less outbox event. A transactional message belongs
// to the open transaction; a non-transactional one (when accepted) is
// tracked as a transaction of its own ending at the message's LSN: that is
// the end of its WAL record, and PostgreSQL skips on restart exactly the
// non-transactional messages and the commits that begin before the slot's
// confirmed position, so confirming it skips this message and nothing else
// (a commit record may begin right where the message ends).
func (s *session) message(m *replication.Message) error {
	cfg := s.r.cfg.Messages
	if !m.Transactional {
		defer func() { s.dbzLastCommit = m.LSN }()
	}
	if cfg.Prefix == "" || m.Prefix != cfg.Prefix {
		if s.writesDebeziumRecord(m) {
			// Written where Debezium writes it: not skipped.
			return s.inTransaction(m, func() error { return s.writeDebeziumRecord(m) })
		}
		if cfg.Debezium != nil {
			s.debeziumMessage(m)
		}
		s.otherMessage(m)
		return nil
	}
	if cfg.Debezium != nil {
		s.debeziumMessage(m)
	}
	if !m.Transactional && cfg.NonTransactional != "accept" {
		return &FatalError{Err: fmt.Errorf("relay: non-transactional logical decoding message with prefix %q at %s: its event is not tied to a transaction's outcome; write it with pg_logical_emit_message(true, ...), or set messages.nontransactional=accept", m.Prefix, m.LSN)}
	}
	return s.inTransaction(m, func() error { return s.emitMessage(m) })
}

// inTransaction runs emit, which sends message m's records: in the open
// transaction when m is transactional; when it is not, in a transaction of
// its own ending at m's LSN (see message).
func (s *session) inTransaction(m *replication.Message, emit func() error) error {
	if m.Transactional {
		if !s.tr.Open() {
			return fmt.Errorf("relay: transactional message at %s outside a transaction", m.LSN)
		}
		return emit()
	}
	if s.tr.Open() {
		return fmt.Errorf("relay: non-transactional message at %s inside a transaction", m.LSN)
	}
	// Read up to it, whether skipped or not: every commit before it was
	// sent.
	s.eos.readTo(m.LSN)
	if skip, err := s.eos.skipMessage(m); skip || err != nil {
		return err
	}
	id, err := s.tr.Begin()
	if err != nil {
		return err
	}
	s.cur, s.commit, s.hasRecords = id, m.LSN, false
	s.rememberCommit(id, m.LSN)
	if err := emit(); err != nil {
		return err
	}
	if err := s.tr.Commit(m.LSN); err != nil {
		return fmt.Errorf("relay: message at %s: %w", m.LSN, err)
	}
	if s.hasRecords {
		s.eventCommit = m.LSN
	}
	s.eos.ended(m.LSN)
	return nil
}

func (s *session) emitMessage(m *replication.Message) error {
	var row router.Row
	var err error
	if s.r.cfg.Messages.Format == MessagesDebezium {
		row, err = s.debeziumMessageRow(m)
	} else {
		row, err = messageRow(m.Prefix, s.r.cfg.Router.EventPayloadField, m.Content)
	}
	if err == nil {
		// A field left out is no column NULL: as a table without the
		// column is refused, a message without the key would go keyless
		// (its order per key lost) without a word.
		if missing := s.r.eventColumnProblems(row.Table, func(col string) (bool, string) {
			if s.r.cfg.Messages.Format == MessagesDebezium {
				return slices.Contains(row.Names, col), "is not a field of the message, or is null or an empty array, which Debezium's DecodeLogicalDecodingMessageContent leaves out (its EventRouter then stops)"
			}
			return slices.Contains(row.Names, col), "is not a field of the message (a field that is null is)"
		}); len(missing) > 0 {
			err = errors.New(strings.Join(missing, "; "))
		}
	}
	if err != nil {
		err = fmt.Errorf("logical decoding message with prefix %q at %s in the transaction committing at %s: %w", m.Prefix, m.LSN, s.commit, err)
		// The message's bytes as they are, so that the dead-letter
		// record shows what was written.
		return s.poisonRow("message "+m.Prefix, "message:"+m.Prefix, nil, m.Content, nil, m.Chunk, err)
	}
	return s.route(&row, "message "+m.Prefix, m.Chunk)
}

// relation classifies a relation the stream announced.
func (s *session) relation(rel *replication.Relation) {
	c, ok := s.classify(rel, &s.start.Catalog, false)
	if ok && c.table != "" && !c.resolve(rel, &s.start.Catalog, false) && !c.resolve(rel, &s.latest, false) {
		// A column of a type added since the session started (a domain
		// would be read as the wrong type): as below.
		s.pendingCls = &c
		ok = false
	}
	if ok {
		s.classified(rel, c)
		return
	}
	// Perhaps a partition attached since the session started: ask the
	// catalog, and read no more WAL until a check made after this
	// transaction's commit answers (an older one may not know the
	// partition yet).
	s.pendingRel, s.pendingAt, s.pendingBy = rel, s.commit, s.clock.Now().Add(relationWait)
	// Its commit is in WAL (the stream carries the transaction) but may
	// not be visible yet to a check that read a WAL position past it.
	s.watcher.See(s.xid)
	s.watcher.Check()
}

// otherMessage names in the log, once per prefix and session, a prefix of
// logical decoding messages that are not outbox events: louder when the
// message looks like one (its JSON has the event id and payload fields),
// since a misspelt messages.prefix skips every table-less event.
//
// Every slot decodes every message of the database. A message whose prefix
// another slot relays (its state row says so) is that relay's. One whose
// prefix no relay records, and that looks like an outbox event, is most
// likely an event no one relays (a writer's prefix that is not
// messages.prefix): it is skipped and the slot confirmed past it, so it is
// said at Error, for each such prefix once per session (at most once a
// minute past a thousand prefixes), and counted. Which prefixes other
// slots relay is read again while the session streams (other_prefixes.go):
// a relay added to the database since its start is not taken for a
// misspelt prefix, and one taken away no longer covers its prefix.
func (s *session) otherMessage(m *replication.Message) {
	if slots, ok := s.otherPrefixes[m.Prefix]; ok {
		s.anotherRelays(m.Prefix, slots, m.LSN, 1)
		return
	}
	if !s.eventPrefixes[m.Prefix] && !s.looksLikeEvent(m.Content) {
		s.r.obs.SkippedMessage(SkippedUnclaimed)
		if s.logPrefixOnce(m.Prefix) {
			s.log.Info("skipping logical decoding messages whose prefix is not messages.prefix", zap.String("prefix", m.Prefix),
				zap.String("messages.prefix", s.r.cfg.Messages.Prefix), zap.Stringer("lsn", m.LSN))
		}
		return
	}
	if s.eventPrefixes[m.Prefix] {
		s.r.obs.SkippedMessage(SkippedUnclaimedEvent)
		return
	}
	s.holdUnsure(m)
}

// anotherRelays counts n messages of a prefix another slot relays, and
// names it once.
func (s *session) anotherRelays(prefix, slots string, lsn checkpoint.LSN, n int) {
	for range n {
		s.r.obs.SkippedMessage(SkippedAnotherRelays)
	}
	if s.logPrefixOnce(prefix) {
		s.log.Info("skipping logical decoding messages of a prefix another slot relays", zap.String("prefix", prefix),
			zap.String("relayed_by_slots", slots), zap.String("messages.prefix", s.r.cfg.Messages.Prefix), zap.Stringer("lsn", lsn))
	}
}

// unclaimedEvent counts n messages that look like events, of a prefix no
// relay records, and says so at Error.
func (s *session) unclaimedEvent(prefix string, lsn checkpoint.LSN, transactional bool, n int) {
	for range n {
		s.r.obs.SkippedMessage(SkippedUnclaimedEvent)
	}
	if s.eventPrefixes[prefix] {
		return
	}
	if len(s.eventPrefixes) >= 1000 {
		now := s.clock.Now()
		if now.Sub(s.eventPrefixLogged) < time.Minute {
			return
		}
		s.eventPrefixLogged = now
	} else {
		if s.eventPrefixes == nil {
			s.eventPrefixes = map[string]bool{}
		}
		s.eventPrefixes[prefix] = true
	}
	s.log.Error("skipping a logical decoding message that looks like an outbox event, whose prefix is not messages.prefix and is relayed by no other slot (no state row records it): if it is an event, it is lost; set messages.prefix (or the writer's prefix) so that they match. Every message of this prefix is skipped and counted in pgoutbox_skipped_messages_total{reason=\"unclaimed_event\"}",
		zap.String("prefix", prefix), zap.String("messages.prefix", s.r.cfg.Messages.Prefix), zap.Stringer("lsn", lsn),
		zap.Bool("transactional", transactional))
}

// logPrefixOnce says whether to name prefix in the log: once per session,
// for at most 100 prefixes.
func (s *session) logPrefixOnce(prefix string) bool {
	if s.prefixesLogged[prefix] || len(s.prefixesLogged) >= 100 {
		return false
	}
	if s.prefixesLogged == nil {
		s.prefixesLogged = map[string]bool{}
	}
	s.prefixesLogged[prefix] = true
	return true
}

// looksLikeEvent says whether a message's content is a JSON object with
// the router's event id and payload fields.
func (s *session) looksLikeEvent(content []byte) bool {
	o := s.r.cfg.Router
	if o.EventIDField == "" || o.EventPayloadField == "" {
		return false
	}
	// Most messages of other consumers lack the field names: no parse.
	if !bytes.Contains(content, []byte(o.EventIDField)) || !bytes.Contains(content, []byte(o.EventPayloadField)) {
		return false
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(content, &fields) != nil {
		return false
	}
	_, id := fields[o.EventIDField]
	_, payload := fields[o.EventPayloadField]
	return id && payload
}

// classified records rel's class; a table that is not an outbox table (of
// a FOR ALL TABLES publication) is named in the log once per session, so
// that an outbox table left out of postgres.table.include.list is seen.
func (s *session) classified(rel *replication.Relation, c relClass) {
	if c.table != "" {
		c.gone = s.r.eventColumnProblems(c.table, func(col string) (bool, string) {
			if slices.Contains(rel.Columns, col) {
				return true, ""
			}
			return false, fmt.Sprintf("is not among the columns the stream carries for %s (OID %d) from the transaction committing at %s on (renamed, dropped, or made a generated column)",
				rel.Table, rel.ID, s.commit)
		})
	}
	if was, ok := s.relByID[rel.ID]; ok && was != rel {
		delete(s.rels, was)
	}
	s.relByID[rel.ID] = rel
	s.rels[rel] = c
	if c.other && !s.othersLogged[rel.Table] && rel.Table != s.r.cfg.Postgres.StateTable {
		if s.othersLogged == nil {
			s.othersLogged = map[string]bool{}
		}
		s.othersLogged[rel.Table] = true
		// A table with the event columns is most likely an outbox table
		// left out of the list: its events are skipped, so say so louder.
		o := s.r.cfg.Router
		looksLikeOutbox := true
		for _, col := range []string{o.EventIDField, o.EventPayloadField, o.RouteByField} {
			looksLikeOutbox = looksLikeOutbox && col != "" && slices.Contains(rel.Columns, col)
		}
		log := s.log.Info
		if looksLikeOutbox {
			log = s.log.Warn
		}
		log("skipping the changes of a table that is not an outbox table (the publication is FOR ALL TABLES); if it is one, add it to postgres.table.include.list",
			zap.String("table", rel.Table), zap.Uint32("oid", rel.ID), zap.Bool("has_the_event_columns", looksLikeOutbox))
	}
}

// resolve sets c's router types from cat, and says whether cat knew every
// user type of rel's columns; final says cat is the last word (a column of
// a type it does not know is then refused, as router.NotReproducedType).
func (c *relClass) resolve(rel *replication.Relation, cat *replication.Catalog, final bool) bool {
	types, mods, known := cat.RouterTypes(rel.Types, rel.Modifiers)
	if !known && !final {
		return false
	}
	c.types, c.mods = types, mods
	return true
}

// classify says what rel is, by its OID, from cat. final says cat is the
// last word (a check made after the relation's rows were written): an OID
// it does not know is then another table.
func (s *session) classify(rel *replication.Relation, cat *replication.Catalog, final bool) (relClass, bool) {
	if t, ok := cat.Root(rel.ID); ok {
		return relClass{table: t}, true
	}
	// An outbox table that was dropped and created again while its rows
	// were still to be read: its old OID, recorded when the new one was
	// accepted (migrate --accept-catalog).
	if t, ok := s.start.State.RetiredOIDs[rel.ID]; ok {
		return relClass{table: t}, true
	}
	// A partition of an outbox table under its own name although the
	// publication reports partitions under their table's: written before
	// publish_via_partition_root was turned on (PostgreSQL decodes each
	// change with the catalog of its moment), or a table detached since and
	// published on its own. A check after this transaction tells: still a
	// partition, it is the outbox's; else the relay stops (never skips it).
	if t, ok := cat.PartitionOf(rel.ID); ok && cat.ViaRoot {
		if !final {
			return relClass{}, false
		}
		return relClass{table: t}, true
	}
	if t, ok := s.start.Catalog.PartitionOf(rel.ID); ok && final {
		return relClass{unexpected: fmt.Sprintf("table %s (OID %d), a partition of outbox table %s when the session started, arrives under its own name and is not one any more: it was detached since (and the publication carries it on its own), or its rows were written before publish_via_partition_root was turned on and it was detached since; its rows are not relayed: relay what is missing yourself, and start again",
			rel.Table, rel.ID, t)}, true
	}
	// An outbox table's name with an OID the session does not know: the
	// table was dropped and created again (or another renamed to its name)
	// since the catalog was read. In a stream of every table its rows would
	// read as another table's until a check stops the relay, and
	// exactly-once mode would store a position past them: ask the catalog
	// first (a check after this transaction's commit reports the change).
	// If that check knows the name under the session's OID again, a table
	// had the name for a while: its rows are not skipped as another
	// table's, but refused by name.
	if _, outbox := s.start.Catalog.Table(rel.Table); outbox {
		if !final {
			return relClass{}, false
		}
		return relClass{unexpected: fmt.Sprintf("table %s (OID %d) has the name of an outbox table but is not the table pgoutbox streams: it had the name for a while (renamed or created, then renamed or dropped) since pgoutbox read the catalog; its rows are not relayed",
			rel.Table, rel.ID)}, true
	}
	partitions := s.start.Catalog.Partitioned() && !s.start.Catalog.ViaRoot
	if s.start.Catalog.AllTables {
		// Every table of the database is published: only a partition of
		// an outbox table (when partitions report under their own names)
		// needs a look at the catalog.
		if !partitions || final {
			return relClass{other: true}, true
		}
		return relClass{}, false
	}
	if !partitions || final {
		why := fmt.Sprintf("table %s (OID %d) is in publication %q but is not an outbox table in postgres.table.include.list (nor a partition of one): add it there, or remove it from the publication (ALTER PUBLICATION ... DROP TABLE)",
			rel.Table, rel.ID, s.r.cfg.Postgres.Publication)
		if partitions {
			why += "; if it was a partition of an outbox table, dropped since its rows were written, turn publish_via_partition_root on so that partitions report under their table's name"
		}
		return relClass{unexpected: why}, true
	}
	return relClass{}, false
}

// classifyPending classifies the pending relation with the latest catalog,
// if that check was made after the relation's transaction committed;
// otherwise it asks for another.
func (s *session) classifyPending() {
	if s.latest.CheckedAt < s.pendingAt || s.latestSaw != s.xid {
		s.watcher.Check()
		return
	}
	var c relClass
	if s.pendingCls != nil {
		c = *s.pendingCls
	} else {
		c, _ = s.classify(s.pendingRel, &s.latest, true)
	}
	if c.table != "" {
		c.resolve(s.pendingRel, &s.latest, true)
	}
	s.classified(s.pendingRel, c)
	s.pendingRel, s.pendingCls = nil, nil
	s.watcher.See(0)
}

// unclassified ends the wait for a relation the catalog did not classify:
// a session restart when the catalog could not be read, else fatal.
func (s *session) unclassified() error {
	rel := s.pendingRel
	what := "whether it is a partition of an outbox table"
	if s.pendingCls != nil {
		what = "what the types of its columns are (a domain is routed as its base type)"
	}
	err := fmt.Errorf("relay: the stream carries table %s (OID %d), and no catalog check within %s said %s; nothing at or after it was confirmed",
		rel.Table, rel.ID, relationWait, what)
	if s.catalogFailed > 0 {
		return err
	}
	return &FatalError{Err: err}
}

func (s *session) change(c *replication.Change) error {
	if !s.tr.Open() {
		return fmt.Errorf("relay: %s on %s outside a transaction", c.Op, c.Rel.Table)
	}
	cls, ok := s.rels[c.Rel]
	switch {
	case !ok:
		return fmt.Errorf("relay: %s on %s before its relation was classified", c.Op, c.Rel.Table)
	case cls.other:
		s.r.obs.OtherTable(c.Rel.Table)
		return nil
	case len(cls.gone) > 0 && c.Op == replication.OpInsert:
		// Routed, its rows would go without a key (or be poison): stop
		// before the first, which is not confirmed.
		return &FatalError{Err: &replication.CatalogError{Publication: s.r.cfg.Postgres.Publication,
			Problems: append(slices.Clone(cls.gone), "set the option to the column's new name (or put the column back) and start again; nothing at or after this transaction was confirmed"),
			Err:      replication.ErrCatalogUnusable}}
	case cls.unexpected != "":
		values := c.Values
		if c.Op == replication.OpDelete {
			values = c.Old
		}
		row := router.Row{Table: c.Rel.Table, Names: c.Rel.Columns, Types: c.Rel.Types, Mods: c.Rel.Modifiers, Values: values}
		return s.poisonRow(c.Op.String(), c.Rel.Table, &row, nil, nil, c.Chunk, errors.New(cls.unexpected))
	}
	row := router.Row{Table: cls.table, Op: c.Op, Names: c.Rel.Columns, Types: c.Rel.Types, Mods: c.Rel.Modifiers, Values: c.Values}
	if cls.types != nil {
		row.Types, row.Mods = cls.types, cls.mods
	}
	if c.Op == replication.OpDelete {
		row.Values = c.Old
	}
	return s.route(&row, c.Op.String(), c.Chunk)
}

// route maps one row (of a table or a message) and sends its record.
func (s *session) route(row *router.Row, what string, chunk *replication.Chunk) error {
	act, err := s.r.router.Route(row, s.clock.Now(), &s.rec)
	if err != nil {
		return s.poisonRow(what, row.Table, row, nil, s.rec.EventID, chunk,
			fmt.Errorf("%s in %s of the transaction committing at %s: %w", what, row.Table, s.commit, err))
	}
	switch act {
	case router.Emit:
	case router.EmitWarn:
		s.log.Warn("routed a record with a warning", zap.String("table", row.Table), zap.String("topic", s.rec.Topic),
			zap.ByteString("event_id", s.rec.EventID), zap.String("reason", s.rec.Reason), zap.Stringer("commit_lsn", s.commit))
	case router.DropWarn:
		s.log.Warn("dropped a change on the outbox table", zap.String("table", row.Table), zap.String("op", what),
			zap.ByteString("event_id", s.rec.EventID), zap.String("reason", s.rec.Reason), zap.Stringer("commit_lsn", s.commit))
		s.r.obs.Dropped(row.Table, s.rec.Reason)
		return nil
	case router.DropError:
		s.log.Error("dropped a change on the outbox table", zap.String("table", row.Table), zap.String("op", what),
			zap.ByteString("event_id", s.rec.EventID), zap.String("reason", s.rec.Reason), zap.Stringer("commit_lsn", s.commit))
		s.r.obs.Dropped(row.Table, s.rec.Reason)
		return nil
	default:
		s.r.obs.Dropped(row.Table, "delete")
		return nil
	}
	if err := s.tr.Add(1); err != nil {
		return fmt.Errorf("relay: track record: %w", err)
	}
	s.hasRecords = true
	s.r.obs.Routed(row.Table, s.rec.Topic)
	if why, ok := s.eos.knownPoison(&s.rec); ok {
		s.log.Warn("dead-lettering a record Kafka refused in an earlier session", zap.ByteString("event_id", s.rec.EventID),
			zap.String("topic", s.rec.Topic), zap.Stringer("commit_lsn", s.commit), zap.String("reason", why))
		s.deadLetter(s.cur, s.rec.Key, s.rec.Value, s.rec.EventID, why, row.Table, s.rec.Topic, s.commit, s.commitTime, chunk)
		return nil
	}
	s.send(&s.rec, s.meta(&s.rec, chunk, s.cur, s.commitTime))
	return nil
}

// meta accounts for a record about to be sent and returns what its ack will
// bring back: the bytes it holds outside the WAL chunk, and the chunk it
// pins when it points into it.
func (s *session) meta(rec *router.Record, chunk *replication.Chunk, id checkpoint.TxnID, stamp int64) kafka.Meta {
	held, inChunk := recordOverhead, false
	count := func(b []byte) {
		if chunk.Contains(b) {
			inChunk = true
		} else {
			held += len(b)
		}
	}
	count(rec.Key)
	count(rec.Value)
	for _, h := range rec.Headers {
		held += len(h.Key)
		count(h.Value)
	}
	m := kafka.Meta{Ref: uint64(id), Stamp: stamp, Held: held}
	s.inflightBytes += int64(held)
	if s.ackWaitSince.IsZero() {
		s.ackWaitSince = s.clock.Now()
	}
	if inChunk {
		m.Hold = chunk
		if chunk.Pin() {
			s.pinned += int64(chunk.Size())
		}
	}
	return m
}

// send sends rec once its topic is known to exist (see topicGate).
func (s *session) send(rec *router.Record, m kafka.Meta) {
	s.eos.sent()
	s.topics.send(rec, m)
}

// poisonRow handles a change or message that cannot become a record: it
// is dead-lettered (its columns as a JSON object, or value as it is) or
// it stops the relay, per relay.poison.policy.
func (s *session) poisonRow(what, table string, row *router.Row, value, eventID []byte, chunk *replication.Chunk, cause error) error {
	if s.r.cfg.Relay.PoisonPolicy != "dead-letter" {
		return &FatalError{Err: fmt.Errorf("relay: %w (poison.policy=fail: nothing at or after it was confirmed)", cause)}
	}
	var key []byte
	if row != nil {
		value = rowJSON(row)
		key = s.r.cfg.keyOf(row)
	}
	s.log.Warn("dead-lettering a row that cannot be relayed", zap.String("table", table), zap.String("op", what),
		zap.ByteString("event_id", eventID), zap.Stringer("commit_lsn", s.commit), zap.Error(cause))
	if err := s.tr.Add(1); err != nil {
		return fmt.Errorf("relay: track record: %w", err)
	}
	s.hasRecords = true
	s.deadLetter(s.cur, key, value, eventID, cause.Error(), table, "", s.commit, s.commitTime, chunk)
	return nil
}

// rememberCommit records transaction id's commit LSN and forgets those that
// are no longer pending (amortised O(1) per transaction).
func (s *session) rememberCommit(id checkpoint.TxnID, lsn checkpoint.LSN) {
	if len(s.commits) == 0 {
		s.commitsBase = id
	}
	s.commits = append(s.commits, lsn)
	// The oldest transaction that can still be pending.
	oldest := id + 1 - checkpoint.TxnID(s.tr.Pending())
	if drop := int(oldest) - int(s.commitsBase); drop > 0 && drop <= len(s.commits) && drop > len(s.commits)/2 {
		s.commits = append(s.commits[:0], s.commits[drop:]...)
		s.commitsBase = oldest
	}
}

// commitLSN is the commit LSN of a pending transaction (0 if unknown).
func (s *session) commitLSN(id checkpoint.TxnID) checkpoint.LSN {
	if id < s.commitsBase || int(id-s.commitsBase) >= len(s.commits) {
		return 0
	}
	return s.commits[id-s.commitsBase]
}

// finish ends a session in the documented order, all within the stop's
// budget: wait for the acks of what is in flight, send a final status with
// the confirmed LSN (after a last catalog check, so that a clean stop
// confirms everything), end the stream, close the producer, stop the
// helpers.
func (s *session) finish(cause error) {
	lim := s.r.cfg.Relay
	if !s.stopping {
		s.stopBy = s.clock.Now().Add(lim.ShutdownTimeout)
	}
	// A clean stop, and a fatal error too (a poison row, a changed catalog:
	// the transactions before it are good), waits for what is in flight so
	// that it can be confirmed; after a changed catalog without waiting for
	// a check that would only fail again.
	var fatal *FatalError
	isFatal := errors.As(cause, &fatal)
	verify := !errors.Is(cause, replication.ErrCatalogChanged)
	s.eos.end(cause)
	if errors.Is(cause, errStopped) || errors.Is(cause, errNewProducer) || isFatal {
		for (s.tr.InFlight() > 0 || (verify && (s.tr.Confirmed() > s.verified || s.fenceHolds())) || s.eos.pending()) && !s.tr.Failed() &&
			s.clock.Now().Before(s.drainBy()) && !s.forced() {
			if s.tr.InFlight() == 0 {
				s.requestCheck()
			}
			s.eos.step()
			err := s.wait(s.waitDeadline())
			if err == nil {
				err = s.drain()
			}
			if err != nil {
				// Either may handle a catalog check the server refused.
				if errors.Is(err, errServerStopping) {
					s.log.Info("the server shuts down: stopping without waiting for a catalog check", zap.Error(err))
				} else {
					s.log.Error("while draining acknowledgements", zap.Error(err))
				}
				break
			}
			if !s.clock.Now().Before(s.nextStatus) {
				if err := s.status(true); err != nil {
					// The connection is gone: nothing more can be confirmed.
					s.log.Warn("status update while draining acknowledgements", zap.Error(err))
					cause = err
					break
				}
			}
		}
	}
	aborted := s.abortProducer()
	if n := s.tr.InFlight(); n > 0 || s.tr.Confirmed() > s.confirmable() {
		log, what := s.log.Warn, "stopping with events not confirmed to PostgreSQL; they will be sent again on restart"
		if n == 0 && min(s.eventCommit, s.tr.Confirmed()) <= s.confirmable() {
			// WAL without events (a tail the fence was not raised for):
			// read again at the next start, nothing sent again.
			log, what = s.log.Debug, "stopping with WAL past the confirmed position that holds no events"
		}
		log(what,
			zap.Int("records_in_flight", n), zap.Int("transactions_pending", s.tr.Pending()),
			zap.Stringer("confirmed_lsn", s.confirmable()), zap.Stringer("acknowledged_lsn", s.tr.Confirmed()),
			zap.Stringer("last_event_commit", s.eventCommit), zap.Bool("forced", errors.Is(cause, errForced) || s.forced()))
	}
	if !replication.IsConnError(cause) {
		ctx, cancel := context.WithDeadline(context.WithoutCancel(s.ctx), s.streamEndBy())
		confirmed := s.confirmable()
		s.r.history.lastConfirmed = max(s.r.history.lastConfirmed, confirmed)
		s.ending.Store(true)
		if err := s.st.SendStatus(ctx, confirmed, false); err != nil {
			s.log.Warn("final status update", zap.Error(err))
		} else {
			s.sentConfirmed = confirmed
			s.watcher.Confirmed(confirmed, min(s.eventCommit, confirmed))
			s.progress()
			// Make sure the server applied it before the connection goes.
			if err := s.st.EndStream(s.streamEndBy().Sub(s.clock.Now())); err != nil {
				s.log.Warn("end of the replication stream", zap.Error(err))
			}
		}
		cancel()
	}
	cctx, cancel := context.WithDeadline(context.WithoutCancel(s.ctx), s.streamEndBy())
	if err := s.st.Close(cctx); err != nil {
		s.log.Debug("close replication connection", zap.Error(err))
	}
	cancel()
	if aborted {
		// Nothing to wait for: what it held fails.
		ended, end := context.WithCancel(context.WithoutCancel(s.ctx))
		end()
		s.r.closeProducer(ended, s.prod, s.clock.Now())
	} else {
		s.r.closeProducer(s.ctx, s.prod, s.stopBy)
	}
	s.topics.checker.Stop()
	wctx, cancel := context.WithDeadline(context.WithoutCancel(s.ctx), s.finalBy(2*time.Second))
	s.watcher.Stop(wctx, s.r.history.lastConfirmed)
	cancel()
	// Messages still held are judged by what is known (loud, if anything),
	// with the readings that arrived while the session ended.
	for more := true; more; {
		select {
		case res := <-s.watcher.Results():
			if res.Err == nil {
				s.prefixesRead(res)
			}
		default:
			more = false
		}
	}
	s.settleUnsure(math.MaxUint64)
	s.log.Info("session ended", zap.Stringer("confirmed_lsn", s.sentConfirmed), zap.NamedError("cause", cause))
}

// aborter is a producer that can be made to deliver nothing more
// (kafka.Producer.Abort).
type aborter interface{ Abort() }

// abortProducer aborts the session's producer when records are still in
// flight as the session ends (its PostgreSQL connection lost, or a drain
// that ran out of time with Kafka away), and reports whether it did. The
// next session sends them again from the slot, which never confirmed
// them: the old producer must deliver none of them afterwards. Closed the
// usual way, sarama kept retrying them and, once Kafka was back, failed
// some of a partition's records (ErrShuttingDown) while delivering later
// ones, so the resends of the failed came after later events of their
// keys (a chaos prober: Kafka stopped, the walsender ended, Kafka
// started). In exactly-once mode the open Kafka transaction is aborted
// instead, which needs the connections: not done there.
func (s *session) abortProducer() bool {
	if s.tr.InFlight() == 0 || s.r.cfg.Kafka.ExactlyOnce {
		return false
	}
	a, ok := s.prod.(aborter)
	if !ok {
		return false
	}
	a.Abort()
	return true
}

// finalBy is now plus at most d, but not past the stop's budget when
// stopping.
func (s *session) finalBy(d time.Duration) time.Time {
	t := s.clock.Now().Add(d)
	if s.stopping && s.stopBy.Before(t) {
		return s.stopBy
	}
	return t
}

// streamEndBy bounds each step that ends the stream (the final status, its
// end, the close): a second from now, and when stopping, not past the
// stop's budget less kafka.CloseGrace, which the producer's close that
// follows may need past its own deadline to close the connections under
// it. With the budget alone, a server that did not answer the end of the
// stream took all of it, and the stop ran CloseGrace past the budget. A
// budget whose reserve (stopReserve) is under twice CloseGrace (a
// relay.shutdown.timeout under 5 s) leaves the stream half of the reserve
// instead: the final status, which confirms what Kafka acknowledged, must
// have its moment after the drain, and the close then runs at most
// CloseGrace less that half past the budget.
func (s *session) streamEndBy() time.Time {
	t := s.finalBy(time.Second)
	grace := min(kafka.CloseGrace, stopReserve(s.r.cfg.Relay.ShutdownTimeout)/2)
	if by := s.stopBy.Add(-grace); s.stopping && by.Before(t) {
		return by
	}
	return t
}

// forceContext is a context that is also done when force is closed.
type forceContext struct {
	context.Context
	force <-chan struct{}
}

func (c forceContext) Done() <-chan struct{} { return c.force }
func (c forceContext) Err() error {
	select {
	case <-c.force:
		return context.Canceled
	default:
		return nil
	}
}
