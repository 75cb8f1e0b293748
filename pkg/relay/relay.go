package relay

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"

	"github.com/pgoutbox/pgoutbox/checkpoint"
	"github.com/pgoutbox/pgoutbox/pkg/kafka"
	"github.com/pgoutbox/pgoutbox/replication"
	"github.com/pgoutbox/pgoutbox/router"
)

// Relay streams outbox rows from one replication slot to Kafka.
//
// Concurrency: Run owns everything it starts. Within a session one goroutine
// (Run's) owns the replication connection and the checkpoint tracker; the
// Kafka producer owns one more goroutine that drains acknowledgements into a
// channel Run reads. Nothing else runs.
type Relay struct {
	cfg    Config
	log    *zap.Logger
	router *router.Set
	tables map[string]bool
	obs    Observer

	// Owned by Run's goroutine, across sessions: whether the slot was seen,
	// and the furthest position this process sent as confirmed. A slot
	// found ahead of it was moved by someone else.
	slotSeen      bool
	lastConfirmed checkpoint.LSN
}

// Observer receives what the relay does, for metrics, health and tests.
// Every method is called from Run's goroutine and must return quickly.
// Embed NopObserver to implement only some methods.
type Observer interface {
	// SessionStarted: streaming started at the slot's confirmed position.
	SessionStarted(start checkpoint.LSN)
	// SessionEnded: the session ended; cause is nil for a clean stop.
	SessionEnded(cause error)
	// Routed: an outbox row or message became a record for topic.
	Routed(table, topic string)
	// Dropped: a change on an outbox table produced no record (a DELETE,
	// an UPDATE per table.op.invalid.behavior).
	Dropped(table, reason string)
	// Acked: Kafka acknowledged a record; commitToAck is measured from the
	// transaction's commit time on the server, sendToAck from the send.
	Acked(topic string, bytes int, commitToAck, sendToAck time.Duration)
	// Failed: Kafka rejected a record after its retries.
	Failed(topic string, err error)
	// DeadLettered: a poison row or record went to the dead-letter topic.
	DeadLettered(topic string)
	// Progress: the positions and in-flight amounts, after every status
	// update (at least once per postgres.status.update.interval).
	Progress(p Progress)
}

// Progress is a snapshot of a session's positions.
type Progress struct {
	Received        checkpoint.LSN // highest WAL position received
	Confirmed       checkpoint.LSN // what the slot was last told (flush)
	ServerWALEnd    checkpoint.LSN // the server's WAL end from its last keepalive
	InFlightRecords int
	InFlightBytes   int64
	PendingTxns     int
	// Idle: no transaction open and nothing in flight, so Confirmed is as
	// far as the relay has been told the WAL goes.
	Idle bool
}

// NopObserver implements Observer with methods that do nothing.
type NopObserver struct{}

func (NopObserver) SessionStarted(checkpoint.LSN)                   {}
func (NopObserver) SessionEnded(error)                              {}
func (NopObserver) Routed(string, string)                           {}
func (NopObserver) Dropped(string, string)                          {}
func (NopObserver) Acked(string, int, time.Duration, time.Duration) {}
func (NopObserver) Failed(string, error)                            {}
func (NopObserver) DeadLettered(string)                             {}
func (NopObserver) Progress(Progress)                               {}

// Option configures a Relay.
type Option func(*Relay)

// WithObserver installs an observer.
func WithObserver(o Observer) Option { return func(r *Relay) { r.obs = o } }

// New validates cfg and builds a relay. log must not be nil.
func New(cfg Config, log *zap.Logger, opts ...Option) (*Relay, error) {
	if err := cfg.Validate(); err != nil {
		return nil, &ConfigError{Err: err}
	}
	rt, err := cfg.RouterSet()
	if err != nil {
		return nil, &ConfigError{Err: err}
	}
	r := &Relay{cfg: cfg, log: log, router: rt, tables: map[string]bool{}, obs: NopObserver{}}
	for _, t := range cfg.Postgres.QualifiedTables() {
		r.tables[t] = true
	}
	for _, o := range opts {
		o(r)
	}
	return r, nil
}

// ConfigError is a configuration the relay cannot run with.
type ConfigError struct{ Err error }

func (e *ConfigError) Error() string { return "configuration: " + e.Err.Error() }
func (e *ConfigError) Unwrap() error { return e.Err }

// StartupError is a failure before the first session streamed: a server that
// cannot be reached or refuses us. Later failures are retried instead.
type StartupError struct{ Err error }

func (e *StartupError) Error() string { return "start-up: " + e.Err.Error() }
func (e *StartupError) Unwrap() error { return e.Err }

// FatalError is a failure that a restart would only repeat: a row the router
// cannot map, a slot whose WAL is lost, an UPDATE with
// table.op.invalid.behavior=fatal. Nothing past it was confirmed.
type FatalError struct{ Err error }

func (e *FatalError) Error() string { return e.Err.Error() }
func (e *FatalError) Unwrap() error { return e.Err }

// ProduceError is a record Kafka did not accept after its retries. The
// session stops; nothing after it is confirmed; the next session resends from
// the slot's confirmed position.
type ProduceError struct {
	EventID string
	Topic   string
	LSN     checkpoint.LSN // commit LSN of the record's transaction, if known
	Err     error
}

func (e *ProduceError) Error() string {
	return fmt.Sprintf("produce event %s to topic %q: %v", e.EventID, e.Topic, e.Err)
}
func (e *ProduceError) Unwrap() error { return e.Err }

// standbyPoll is how often a standby instance tries to take the slot over.
const standbyPoll = 2 * time.Second

// confirmEvery is the shortest time between two status updates sent because
// the confirmed position moved.
const confirmEvery = 100 * time.Millisecond

// errStopped ends a session that stopped because Run's context was cancelled.
var errStopped = errors.New("relay: stopped")

// Run streams until ctx is cancelled or a fatal error occurs. On
// cancellation it stops at a transaction boundary, waits for Kafka to
// acknowledge what is in flight, confirms, and returns nil. A session that
// fails for a reason a retry can cure (a lost connection, a Kafka error) is
// restarted from the slot's confirmed position after a capped, jittered,
// exponential backoff.
func (r *Relay) Run(ctx context.Context) error {
	backoff := r.cfg.Relay.RestartBackoff
	streamed := false
	for {
		started := time.Now()
		ran, err := r.session(ctx)
		streamed = streamed || ran
		if errors.Is(err, errStopped) || (err == nil && ctx.Err() != nil) {
			return nil
		}
		var fe *FatalError
		if errors.As(err, &fe) {
			return err
		}
		if !streamed && !retriableAtStartup(err) {
			return &StartupError{Err: err}
		}
		if ctx.Err() != nil {
			return nil
		}
		if ran && time.Since(started) > 4*r.cfg.Relay.RestartBackoffMax {
			backoff = r.cfg.Relay.RestartBackoff
		}
		wait := backoff/2 + rand.N(backoff/2+1)
		if errors.Is(err, replication.ErrSlotInUse) {
			// Standby: another instance streams from the slot. Poll often
			// enough to take over within a few seconds of its end.
			wait = standbyPoll/2 + rand.N(standbyPoll/2+1)
			r.log.Info("standby: the slot is in use by another instance; waiting to take over", zap.Error(err), zap.Duration("retry_in", wait))
		} else {
			r.log.Warn("stream stopped; restarting from the slot's confirmed position", zap.Error(err), zap.Duration("backoff", wait))
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		backoff = min(2*backoff, r.cfg.Relay.RestartBackoffMax)
	}
}

// retriableAtStartup says which first-session failures are waited out rather
// than reported: a slot held by another instance (this one is its standby).
// Anything else before the first stream started is a start-up error: a
// server that cannot be reached or refuses us is a deployment problem to
// report at once, not to retry silently.
func retriableAtStartup(err error) bool {
	return errors.Is(err, replication.ErrSlotInUse)
}

type session struct {
	r      *Relay
	log    *zap.Logger
	st     *replication.Stream
	prod   *kafka.Producer
	tr     *checkpoint.Tracker
	rec    router.Record
	cur    checkpoint.TxnID
	commit checkpoint.LSN // FinalLSN of the open transaction, for messages
	// commitTime is the open transaction's commit time (Unix ns), stamped
	// on its records to measure commit-to-ack latency.
	commitTime int64
	received   checkpoint.LSN
	// commits holds the commit LSN of transactions commitsBase,
	// commitsBase+1, ... that may still be pending, for error messages.
	// TxnIDs are sequential, so a slice trimmed from the front is enough.
	commits     []checkpoint.LSN
	commitsBase checkpoint.TxnID

	inflightBytes int64
	sentConfirmed checkpoint.LSN
	lastStatus    time.Time
	nextStatus    time.Time
	walEnd        checkpoint.LSN
}

// session runs one replication session. ran reports whether streaming
// started.
func (r *Relay) session(ctx context.Context) (ran bool, err error) {
	pcfg := r.cfg.Postgres
	if r.slotSeen {
		// The slot is created at most once, at the first start. One that
		// vanished since was dropped under the relay: recreating it would
		// silently skip every event written in between.
		pcfg.CreateSlot = false
	}
	slot, err := replication.Prepare(ctx, pcfg, r.log)
	if err != nil {
		if r.slotSeen && errors.Is(err, replication.ErrSlotMissing) {
			return false, &FatalError{Err: fmt.Errorf("relay: slot %q was dropped while pgoutbox was using it (last confirmed %s); events written since may be lost, so pgoutbox will not recreate it: investigate, then recreate the slot deliberately: %w", pcfg.Slot, r.lastConfirmed, err)}
		}
		if errors.Is(err, replication.ErrPublicationMissing) || errors.Is(err, replication.ErrSlotMissing) || errors.Is(err, replication.ErrSlotLost) {
			return false, &FatalError{Err: err}
		}
		return false, err
	}
	if r.slotSeen && slot.ConfirmedFlushLSN > r.lastConfirmed {
		return false, &FatalError{Err: fmt.Errorf("relay: slot %q is at %s, past %s, the furthest pgoutbox confirmed: it was advanced or dropped and recreated by someone else, and the events in between were skipped; investigate before restarting", pcfg.Slot, slot.ConfirmedFlushLSN, r.lastConfirmed)}
	}

	kcfg := r.cfg.Kafka
	kcfg.AckBuffer = r.cfg.Relay.MaxInFlightRecords + 1
	prod, err := kafka.New(kcfg, r.log)
	if err != nil {
		return false, err
	}
	st, err := replication.Open(ctx, r.cfg.Postgres, slot.ConfirmedFlushLSN, r.log)
	if err != nil {
		r.closeProducer(ctx, prod)
		if errors.Is(err, replication.ErrSlotInUse) {
			// Another instance owns the slot and may advance it: when this
			// one takes over, the slot's position is legitimately ahead.
			r.slotSeen, r.lastConfirmed = false, 0
		}
		return false, err
	}
	r.slotSeen = true
	r.lastConfirmed = max(r.lastConfirmed, slot.ConfirmedFlushLSN)
	s := &session{
		r:             r,
		log:           r.log,
		st:            st,
		prod:          prod,
		tr:            checkpoint.New(slot.ConfirmedFlushLSN),
		sentConfirmed: slot.ConfirmedFlushLSN,
		walEnd:        slot.ConfirmedFlushLSN,
	}
	r.obs.SessionStarted(slot.ConfirmedFlushLSN)
	err = s.loop(ctx)
	s.finish(ctx, err)
	if errors.Is(err, errStopped) {
		r.obs.SessionEnded(nil)
	} else {
		r.obs.SessionEnded(err)
	}
	return true, err
}

// loop reads WAL and acks until the context is cancelled (at a transaction
// boundary: errStopped) or something fails.
func (s *session) loop(ctx context.Context) error {
	lim := s.r.cfg.Relay
	interval := s.r.cfg.Postgres.StatusInterval
	// Receives use a context that outlives cancellation so the open
	// transaction can be read to its commit; stopBy bounds that.
	recvCtx := context.WithoutCancel(ctx)
	var stopBy time.Time
	s.nextStatus = time.Now().Add(interval)
	for {
		if stopBy.IsZero() && ctx.Err() != nil {
			stopBy = time.Now().Add(lim.ShutdownTimeout)
			s.log.Info("stopping at the next transaction boundary")
		}
		if err := s.drainAcks(); err != nil {
			return err
		}
		if !stopBy.IsZero() {
			if !s.tr.Open() {
				return errStopped
			}
			if time.Now().After(stopBy) {
				return fmt.Errorf("relay: transaction still open %s after the stop request; stopping without confirming it", lim.ShutdownTimeout)
			}
		}
		now := time.Now()
		// Confirm promptly when the position moved (so a crash repeats
		// little), but at most every confirmEvery; otherwise on the interval.
		if !now.Before(s.nextStatus) || (s.tr.Confirmed() != s.sentConfirmed && now.Sub(s.lastStatus) >= confirmEvery) {
			if err := s.status(recvCtx, false); err != nil {
				return err
			}
		}
		if s.tr.InFlight() >= lim.MaxInFlightRecords || s.inflightBytes >= lim.MaxInFlightBytes {
			// Back-pressure: stop reading WAL, keep sending status updates.
			if err := s.waitAck(ctx, s.nextStatus); err != nil {
				return err
			}
			continue
		}
		ev, err := s.st.Receive(recvCtx, s.nextStatus)
		if err != nil {
			return err
		}
		if ev.WALStart > s.received {
			s.received = ev.WALStart
		}
		if err := s.handle(recvCtx, ev); err != nil {
			return err
		}
	}
}

// waitAck blocks until an ack arrives, the deadline passes or ctx ends.
func (s *session) waitAck(ctx context.Context, deadline time.Time) error {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case a, ok := <-s.prod.Acks():
		if !ok {
			return errors.New("relay: producer closed its acknowledgement channel")
		}
		return s.ack(a)
	case <-t.C:
	case <-ctx.Done():
	}
	return nil
}

func (s *session) drainAcks() error {
	for {
		select {
		case a, ok := <-s.prod.Acks():
			if !ok {
				return errors.New("relay: producer closed its acknowledgement channel")
			}
			if err := s.ack(a); err != nil {
				return err
			}
		default:
			return nil
		}
	}
}

func (s *session) ack(a kafka.Ack) error {
	s.inflightBytes -= int64(a.Bytes)
	id := checkpoint.TxnID(a.Ref)
	if a.Err != nil {
		s.r.obs.Failed(a.Topic, a.Err)
		lsn := s.commitLSN(id)
		lim := s.r.cfg.Relay
		if kafka.IsPoison(a.Err) {
			if lim.PoisonPolicy == "dead-letter" && a.Topic != lim.DeadLetterTopic {
				// The dead-letter record takes the failed one's place in
				// its transaction's count.
				s.log.Warn("dead-lettering a record Kafka cannot accept", zap.ByteString("event_id", a.EventID),
					zap.String("topic", a.Topic), zap.Stringer("commit_lsn", lsn), zap.Error(a.Err))
				s.deadLetter(id, a.Key, a.Value, a.EventID, a.Err.Error(), "", a.Topic, lsn, a.Stamp)
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
	if err := s.tr.Ack(id); err != nil {
		return fmt.Errorf("relay: ack for transaction %d: %w", id, err)
	}
	now := time.Now()
	s.r.obs.Acked(a.Topic, a.Bytes, now.Sub(time.Unix(0, a.Stamp)), now.Sub(a.Sent))
	return nil
}

// status sends a standby status update with the tracker's confirmed LSN. When
// the relay is idle it asks the server to reply, so that the keepalive that
// comes back carries a WAL end the tracker can adopt.
func (s *session) status(ctx context.Context, force bool) error {
	confirmed := s.tr.Confirmed()
	idle := !s.tr.Open() && s.tr.InFlight() == 0 && !s.tr.Failed()
	// Recorded before sending: if the send fails half-way the server may
	// still have taken it.
	s.r.lastConfirmed = max(s.r.lastConfirmed, confirmed)
	if err := s.st.SendStatus(ctx, confirmed, idle && !force); err != nil {
		return err
	}
	s.lastStatus = time.Now()
	s.nextStatus = s.lastStatus.Add(s.r.cfg.Postgres.StatusInterval)
	s.sentConfirmed = confirmed
	s.progress()
	return nil
}

func (s *session) progress() {
	s.r.obs.Progress(Progress{
		Received:        s.received,
		Confirmed:       s.sentConfirmed,
		ServerWALEnd:    s.walEnd,
		InFlightRecords: s.tr.InFlight(),
		InFlightBytes:   s.inflightBytes,
		PendingTxns:     s.tr.Pending(),
		Idle:            !s.tr.Open() && s.tr.InFlight() == 0,
	})
}

func (s *session) handle(ctx context.Context, ev replication.Event) error {
	switch {
	case ev.Begin != nil:
		id, err := s.tr.Begin()
		if err != nil {
			return fmt.Errorf("relay: BEGIN of xid %d at %s: %w", ev.Begin.XID, ev.Begin.FinalLSN, err)
		}
		s.cur = id
		s.commit = ev.Begin.FinalLSN
		s.commitTime = ev.Begin.CommitTime.UnixNano()
		s.rememberCommit(id, ev.Begin.FinalLSN)
	case ev.Change != nil:
		return s.change(ev.Change)
	case ev.Commit != nil:
		if err := s.tr.Commit(ev.Commit.EndLSN); err != nil {
			return fmt.Errorf("relay: COMMIT at %s: %w", ev.Commit.EndLSN, err)
		}
	case ev.Keepalive != nil:
		k := ev.Keepalive
		if k.WALEnd > s.walEnd {
			s.walEnd = k.WALEnd
		}
		// Adopting the WAL end is safe only with nothing open or in flight;
		// the tracker checks that. It keeps an idle outbox from pinning WAL.
		s.tr.Idle(k.WALEnd)
		if k.ReplyRequested {
			return s.status(ctx, true)
		}
	case ev.Message != nil:
		return s.message(ev.Message)
	case ev.StreamAbort != nil:
		// PostgreSQL 18 sends these on protocol v1 for transactions that
		// aborted before they were decoded; none of their changes was sent.
		s.log.Debug("skipping a stream abort of a transaction that was never sent",
			zap.Uint32("xid", ev.StreamAbort.XID), zap.Uint32("subxid", ev.StreamAbort.SubXID), zap.Stringer("wal", ev.WALStart))
	case ev.Truncate != nil, ev.Relation != nil:
		// Relations are cached by the decoder; a TRUNCATE carries no events.
	}
	return nil
}

// message routes a table-less outbox event. A transactional message belongs
// to the open transaction; a non-transactional one (when accepted) is
// tracked as a transaction of its own that ends just after its LSN, which is
// where PostgreSQL resumes decoding past it.
func (s *session) message(m *replication.Message) error {
	cfg := s.r.cfg.Messages
	if cfg.Prefix == "" || m.Prefix != cfg.Prefix {
		return nil
	}
	if !m.Transactional {
		if cfg.NonTransactional != "accept" {
			return &FatalError{Err: fmt.Errorf("relay: non-transactional logical decoding message with prefix %q at %s: its event is not tied to a transaction's outcome; write it with pg_logical_emit_message(true, ...), or set messages.nontransactional=accept", m.Prefix, m.LSN)}
		}
		if s.tr.Open() {
			return fmt.Errorf("relay: non-transactional message at %s inside a transaction", m.LSN)
		}
		id, err := s.tr.Begin()
		if err != nil {
			return err
		}
		s.cur, s.commit = id, m.LSN
		if err := s.emitMessage(m); err != nil {
			return err
		}
		if err := s.tr.Commit(m.LSN + 1); err != nil {
			return fmt.Errorf("relay: message at %s: %w", m.LSN, err)
		}
		return nil
	}
	if !s.tr.Open() {
		return fmt.Errorf("relay: transactional message at %s outside a transaction", m.LSN)
	}
	return s.emitMessage(m)
}

func (s *session) emitMessage(m *replication.Message) error {
	row, err := messageRow(m.Prefix, m.Content)
	if err != nil {
		return &FatalError{Err: fmt.Errorf("relay: logical decoding message with prefix %q at %s in the transaction committing at %s: %w (nothing at or after it was confirmed)", m.Prefix, m.LSN, s.commit, err)}
	}
	return s.route(&row, "message "+m.Prefix)
}

func (s *session) change(c *replication.Change) error {
	if !s.tr.Open() {
		return fmt.Errorf("relay: %s on %s outside a transaction", c.Op, c.Rel.Table)
	}
	if !s.r.tables[c.Rel.Table] {
		return nil
	}
	row := router.Row{Table: c.Rel.Table, Names: c.Rel.Columns, Types: c.Rel.Types}
	switch c.Op {
	case replication.OpInsert:
		row.Op, row.Values = router.OpInsert, c.Values
	case replication.OpUpdate:
		row.Op, row.Values = router.OpUpdate, c.Values
	case replication.OpDelete:
		row.Op, row.Values = router.OpDelete, c.Old
	}
	return s.route(&row, c.Op.String())
}

// route maps one row (of a table or a message) and sends its record.
func (s *session) route(row *router.Row, what string) error {
	act, err := s.r.router.Route(row, time.Now(), &s.rec)
	if err != nil {
		if s.r.cfg.Relay.PoisonPolicy == "dead-letter" {
			s.log.Warn("dead-lettering a row the router cannot map", zap.String("table", row.Table),
				zap.ByteString("event_id", s.rec.EventID), zap.Stringer("commit_lsn", s.commit), zap.Error(err))
			if err := s.tr.Add(1); err != nil {
				return fmt.Errorf("relay: track record: %w", err)
			}
			s.deadLetter(s.cur, nil, rowJSON(row), s.rec.EventID, err.Error(), row.Table, "", s.commit, s.commitTime)
			return nil
		}
		return &FatalError{Err: fmt.Errorf("relay: %s in %s of the transaction committing at %s: %w (poison.policy=fail: nothing at or after it was confirmed)", what, row.Table, s.commit, err)}
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
	s.inflightBytes += int64(recordBytes(&s.rec))
	s.r.obs.Routed(row.Table, s.rec.Topic)
	s.prod.SendStamped(&s.rec, uint64(s.cur), s.commitTime)
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

// deadLetter produces a poison row or record to the dead-letter topic as a
// record of transaction id, with headers saying why and where it came from.
func (s *session) deadLetter(id checkpoint.TxnID, key, value, eventID []byte, reason, table, topic string, lsn checkpoint.LSN, stamp int64) {
	rec := router.Record{
		Topic:     s.r.cfg.Relay.DeadLetterTopic,
		Key:       key,
		Value:     value,
		Partition: -1,
		Timestamp: time.Now(),
		EventID:   eventID,
		Headers: []router.Header{
			{Key: "id", Value: eventID},
			{Key: "pgoutbox.error.reason", Value: []byte(reason)},
			{Key: "pgoutbox.source.table", Value: []byte(table)},
			{Key: "pgoutbox.source.topic", Value: []byte(topic)},
			{Key: "pgoutbox.commit.lsn", Value: []byte(lsn.String())},
		},
	}
	// A record refused for its size would be refused again: keep the head
	// of it, and say so.
	if limit := s.r.cfg.Kafka.MaxMessageBytes / 2; limit > 0 && len(rec.Value) > limit {
		rec.Headers = append(rec.Headers,
			router.Header{Key: "pgoutbox.truncated.from", Value: []byte(strconv.Itoa(len(rec.Value)))})
		rec.Value = rec.Value[:limit]
	}
	s.inflightBytes += int64(recordBytes(&rec))
	s.r.obs.DeadLettered(s.r.cfg.Relay.DeadLetterTopic)
	s.prod.SendStamped(&rec, uint64(id), stamp)
}

func recordBytes(r *router.Record) int {
	n := len(r.Key) + len(r.Value)
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return n
}

// finish ends a session in the documented order: wait (bounded) for the
// acks of what is in flight, send a final status with the confirmed LSN,
// close the replication connection, close the producer.
func (s *session) finish(ctx context.Context, cause error) {
	lim := s.r.cfg.Relay
	fctx := context.WithoutCancel(ctx)
	if errors.Is(cause, errStopped) {
		deadline := time.Now().Add(lim.ShutdownTimeout)
		for s.tr.InFlight() > 0 && !s.tr.Failed() && time.Now().Before(deadline) {
			next := s.nextStatus
			if deadline.Before(next) {
				next = deadline
			}
			if err := s.waitAck(fctx, next); err != nil {
				s.log.Error("while draining acknowledgements", zap.Error(err))
				break
			}
			if !time.Now().Before(s.nextStatus) {
				_ = s.status(fctx, true)
			}
		}
		if n := s.tr.InFlight(); n > 0 {
			s.log.Warn("stopping with records unacknowledged; they will be sent again on restart", zap.Int("records", n))
		}
	}
	if !isConnError(cause) {
		sctx, cancel := context.WithTimeout(fctx, 5*time.Second)
		s.r.lastConfirmed = max(s.r.lastConfirmed, s.tr.Confirmed())
		if err := s.st.SendStatus(sctx, s.tr.Confirmed(), false); err != nil {
			s.log.Warn("final status update", zap.Error(err))
		} else {
			s.sentConfirmed = s.tr.Confirmed()
			s.progress()
			// Make sure the server applied it before the connection goes.
			if err := s.st.EndStream(5 * time.Second); err != nil {
				s.log.Warn("end of the replication stream", zap.Error(err))
			}
		}
		cancel()
	}
	if err := s.st.Close(fctx); err != nil {
		s.log.Debug("close replication connection", zap.Error(err))
	}
	s.r.closeProducer(ctx, s.prod)
	s.log.Info("session ended", zap.Stringer("confirmed_lsn", s.tr.Confirmed()), zap.NamedError("cause", cause))
}

func isConnError(err error) bool {
	if err == nil {
		return false
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return true
	}
	return errors.Is(err, replication.ErrStreamEnded) || errors.Is(err, replication.ErrReceive)
}

func (r *Relay) closeProducer(ctx context.Context, p *kafka.Producer) {
	done := make(chan error, 1)
	go func() { done <- p.Close() }()
	// Between sessions the old producer must be gone before a new one
	// starts: records it still delivers would interleave with the new
	// session's resends and break per-key order. Only when the process is
	// stopping is it abandoned after a timeout (its goroutines end with the
	// process; nothing it acks can confirm anything, the tracker is gone).
	select {
	case err := <-done:
		if err != nil {
			r.log.Debug("close producer", zap.Error(err))
		}
		return
	case <-ctx.Done():
	}
	t := time.NewTimer(r.cfg.Relay.ShutdownTimeout)
	defer t.Stop()
	select {
	case err := <-done:
		if err != nil {
			r.log.Debug("close producer", zap.Error(err))
		}
	case <-t.C:
		r.log.Warn("Kafka producer did not close in time; abandoning it as the process stops", zap.Duration("timeout", r.cfg.Relay.ShutdownTimeout))
	}
}
