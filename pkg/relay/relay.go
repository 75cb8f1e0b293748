package relay

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/pgoutbox/pgoutbox/checkpoint"
	"github.com/pgoutbox/pgoutbox/pkg/kafka"
	"github.com/pgoutbox/pgoutbox/poll"
	"github.com/pgoutbox/pgoutbox/replication"
	"github.com/pgoutbox/pgoutbox/router"
)

// Relay streams outbox rows from one replication slot to Kafka.
//
// Concurrency: Run owns everything it starts. Within a session one goroutine
// (Run's) owns the replication connection, the checkpoint tracker and the
// producer's input; the producer drains acknowledgements on a goroutine of
// its own, and two helpers run beside the loop and post results it reads:
// the topic checker (does a topic exist, before its first record goes out)
// and the catalog watcher (is the publication still what the session started
// with). Nothing on Run's goroutine waits for Kafka. Run waits for all of
// them before it returns.
type Relay struct {
	cfg    Config
	log    *zap.Logger
	router *router.Set
	obs    Observer
	be     backend
	clock  clock
	// force ends a stop at once when closed (a second signal).
	force <-chan struct{}
	// dbzTopicChecked: checkDebeziumMessageTopic has looked.
	dbzTopicChecked bool
	// persistFault, set only by tests (export_test.go), runs before the
	// initial snapshot makes the slot; an error it returns fails that
	// attempt, as a dropped connection would.
	persistFault func() error
	// exportedHook, set only by tests (export_test.go), runs once a new
	// initial snapshot has been exported, before anything reads it.
	exportedHook func()
	// instance names this process in the state table.
	instance string
	// standbyPollEvery, set only by tests (export_test.go), replaces
	// standbyPoll.
	standbyPollEvery time.Duration

	// Owned by Run's goroutine, across sessions.
	history history
	topics  *topicCache
	// singleUntil, when set, is a commit LSN up to which records are sent
	// one per produce request: the broker refused a batch as too large,
	// and only a record refused on its own is poison.
	singleUntil checkpoint.LSN
	// staleRetried holds the commit LSNs of the transactions a record of
	// which Kafka refused for what may be the producer's stale metadata
	// (see kafka.MayBeStaleMetadata): the session ended, and later ones,
	// with a new producer, take the same refusal for poison. Those below
	// the slot's position are dropped at each session's start.
	staleRetried map[checkpoint.LSN]bool
	// maxPending is maxPendingTxns, maxProducerRecords maxProducerRecords
	// (lower in tests).
	maxPending         int
	maxProducerRecords int64
	// eosStarted: a session of this process started exactly-once mode (a
	// state row written since may be its own); eosCommitted: one had a
	// position committed to the offsets topic.
	eosStarted, eosCommitted bool
	// standby is a standby's last check of what a takeover needs.
	standby standbyState
	// members is this instance's membership of the slot's instances, and
	// its destination (membership.go).
	members slotMembers
	// Exactly-once mode: whether the offsets topic is known to exist; the
	// records Kafka refused, which sessions from then on dead-letter; the
	// transaction that did not fit in kafka.transaction.timeout once.
	offsetsReady bool
	poisoned     map[poisonKey]string
	tooLong      checkpoint.LSN
}

// history is what Run remembers between sessions: whether the slot was seen,
// the furthest position this process sent as confirmed (a slot found ahead
// of it was moved by someone else, unless another instance took it over),
// and when this process's last session started.
type history struct {
	slotSeen       bool
	lastConfirmed  checkpoint.LSN
	sessionStarted time.Time
	// othersHeld: another connection held the slot since this process
	// last streamed from it, so its position may have moved on
	// legitimately (the slot stays known: a slot that vanishes later is
	// still not recreated).
	othersHeld bool
}

// slotBusy notes that another connection holds the slot.
func (h *history) slotBusy() {
	h.lastConfirmed = 0
	h.othersHeld = true
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
	// OtherTable: a change on a table of a FOR ALL TABLES publication that
	// is not an outbox table was skipped.
	OtherTable(table string)
	// StandingBy: another instance streams from the slot, and this one
	// waits to take over; err is what its takeover would fail on, from
	// its last check (nil: PostgreSQL and Kafka answer).
	StandingBy(err error)
	// SkippedMessage: a logical decoding message whose prefix is not
	// messages.prefix was skipped; reason is one of the Skipped constants.
	SkippedMessage(reason string)
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

// CatalogObserver is implemented by an Observer that also wants to know
// when the publication's catalog row was found written since the session
// started or pgoutbox last streamed (ALTER PUBLICATION ... SET, OWNER TO,
// RENAME; replication.Catalog.Altered): if it stopped publishing inserts
// for a while, the events committed then were never decoded, and no
// other trace of that remains. The relay logs it at Warn as well.
type CatalogObserver interface {
	PublicationAltered(publication string)
}

// publicationAltered warns of w and tells a CatalogObserver.
func (r *Relay) publicationAltered(w, publication string) {
	r.log.Warn(w, zap.String("publication", publication))
	if co, ok := r.obs.(CatalogObserver); ok {
		co.PublicationAltered(publication)
	}
}

// Progress is a snapshot of a session's positions.
type Progress struct {
	Received        checkpoint.LSN // highest WAL position received
	Confirmed       checkpoint.LSN // what the slot was last told (flush)
	ServerWALEnd    checkpoint.LSN // the server's WAL end from its last keepalive
	InFlightRecords int
	InFlightBytes   int64 // records' own bytes and the WAL chunks they hold
	PendingTxns     int
	// Idle: no transaction open and nothing in flight, so Confirmed is as
	// far as the relay has been told the WAL goes.
	Idle bool
	// Verified is the WAL position of the last catalog check that passed:
	// the slot is not confirmed past it.
	Verified checkpoint.LSN
	// LastCommitTime is the commit time of the last transaction read.
	LastCommitTime time.Time
	// ServerWAL is the server's WAL position at the last catalog check.
	// Behind is how much WAL the relay still has to read to reach it, and
	// CatchUpRate how fast it read WAL over the last progress interval
	// (bytes per second); both 0 when caught up.
	ServerWAL   checkpoint.LSN
	Behind      int64
	CatchUpRate float64
}

// NopObserver implements Observer with methods that do nothing.
type NopObserver struct{}

func (NopObserver) SessionStarted(checkpoint.LSN) {}
func (NopObserver) SessionEnded(error)            {}
func (NopObserver) Routed(string, string)         {}
func (NopObserver) Dropped(string, string)        {}
func (NopObserver) OtherTable(string)             {}
func (NopObserver) SkippedMessage(string)         {}
func (NopObserver) StandingBy(error)              {}

// The reasons of SkippedMessage.
const (
	// SkippedAnotherRelays: another slot's state row records the prefix.
	SkippedAnotherRelays = "another_relay"
	// SkippedUnclaimed: no relay records the prefix, and the message does
	// not look like an outbox event.
	SkippedUnclaimed = "unclaimed"
	// SkippedUnclaimedEvent: no relay records the prefix, and the message
	// looks like an outbox event: most likely one no one relays.
	SkippedUnclaimedEvent = "unclaimed_event"
)

func (NopObserver) Acked(string, int, time.Duration, time.Duration) {}
func (NopObserver) Failed(string, error)                            {}
func (NopObserver) DeadLettered(string)                             {}
func (NopObserver) Progress(Progress)                               {}

// Option configures a Relay.
type Option func(*Relay)

// WithObserver installs an observer.
func WithObserver(o Observer) Option { return func(r *Relay) { r.obs = o } }

// WithForceStop gives a channel whose closing ends a stop that is under way
// at once (the process's second SIGINT or SIGTERM): Run stops reading,
// confirms what Kafka has acknowledged, logs what it did not, and returns.
func WithForceStop(ch <-chan struct{}) Option { return func(r *Relay) { r.force = ch } }

// withBackend replaces the servers and the clock (the deterministic tests).
func withBackend(b backend, c clock) Option {
	return func(r *Relay) { r.be, r.clock = b, c }
}

// New validates cfg and builds a relay. log must not be nil.
func New(cfg Config, log *zap.Logger, opts ...Option) (*Relay, error) {
	if err := cfg.Validate(); err != nil {
		return nil, &ConfigError{Err: err}
	}
	rt, err := cfg.RouterSet()
	if err != nil {
		return nil, &ConfigError{Err: err}
	}
	r := &Relay{cfg: cfg, log: log, router: rt, obs: NopObserver{}, instance: newInstanceID(),
		topics: newTopicCache(cfg.Kafka.TopicMissingTimeout), poisoned: map[poisonKey]string{}, staleRetried: map[checkpoint.LSN]bool{}, maxPending: maxPendingTxns,
		maxProducerRecords: maxProducerRecords}
	r.be, r.clock = &liveBackend{log: log}, realClock{}
	for _, o := range opts {
		o(r)
	}
	return r, nil
}

// newInstanceID names this process: host, PID and a random part, so that
// two instances never share a name, even on one host.
func newInstanceID() string {
	host, _ := os.Hostname()
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(b[:]))
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
// cannot map, a slot whose WAL is lost, a publication that changed. Nothing
// past it was confirmed.
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

// maxPendingTxns caps the transactions read and not yet confirmed, as
// relay.max.inflight.records caps records: while Kafka holds back the
// oldest record's acknowledgement (its retries last minutes), transactions
// without records (of other tables in a FOR ALL TABLES publication, or
// updates of the outbox) each took a place in the tracker and in the
// session's list of commits, 40 bytes apiece, without bound. At the cap
// the relay reads no more WAL until the oldest is confirmed: about 10 MB.
const maxPendingTxns = 1 << 18

// maxProducerRecords is how many records one producer sends before the
// session hands over to a new one (between transactions, with nothing in
// flight). sarama numbers an idempotent producer's batches per partition
// with an int32 that it does not wrap at 2^31 as the Java client does: the
// broker then refuses the batch as out of sequence, sarama bumps the epoch
// and sends the next, and the refused batch's keys are resent after later
// records of theirs. A new producer starts its sequences at 0. (At
// 100,000 records/s, once every three hours.)
const maxProducerRecords = 1 << 30

var (
	// errStopped ends a session that stopped because Run's context was
	// cancelled.
	errStopped = errors.New("relay: stopped")
	// errNewProducer ends a session cleanly so that the next one starts at
	// once with a producer of normal batches again.
	errNewProducer = errors.New("relay: starting a new producer")
)

// Run streams until ctx is cancelled or a fatal error occurs. On
// cancellation it stops at a transaction boundary, waits for Kafka to
// acknowledge what is in flight, confirms, and returns nil, all within
// relay.shutdown.timeout. A session that fails for a reason a retry can cure
// (a lost connection, a Kafka error) is restarted from the slot's confirmed
// position after a capped, jittered, exponential backoff.
func (r *Relay) Run(ctx context.Context) error {
	defer func() {
		if lb, ok := r.be.(*liveBackend); ok {
			wctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			lb.wait(wctx)
			cancel()
		}
	}()
	// The poll source (relay.source: poll) has a loop of its own: poll.go.
	if r.cfg.Relay.Source == SourcePoll {
		return r.runPoll(ctx)
	}
	// Shown to the slot's other instances while Run runs (membership.go).
	r.joinSlot(ctx)
	defer r.leaveSlot()
	// snapshot.mode: initial publishes the tables' rows before the slot
	// streams, when it creates the slot: snapshot.go.
	if r.cfg.Snapshot.Mode == SnapshotInitial {
		if err := r.runSnapshot(ctx); err != nil || ctx.Err() != nil {
			return err
		}
	}
	backoff := r.cfg.Relay.RestartBackoff
	streamed := false
	for {
		started := r.clock.Now()
		ran, err := r.session(ctx)
		// A standby has found the servers and its slot (busy): from then on
		// a failure is retried as after streaming, not a start-up error.
		streamed = streamed || ran || errors.Is(err, replication.ErrSlotInUse)
		if errors.Is(err, errStopped) || (err == nil && ctx.Err() != nil) {
			return nil
		}
		var fe *FatalError
		if errors.As(err, &fe) {
			return err
		}
		if !streamed && !retriableAtStartup(err) {
			if ctx.Err() != nil {
				return nil
			}
			return &StartupError{Err: err}
		}
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, errNewProducer) {
			continue
		}
		if !ran && !errors.Is(err, replication.ErrSlotInUse) {
			// A session that failed before it streamed (a takeover whose
			// producer Kafka refuses): counted as one that ended, so that
			// the restarts show in pgoutbox_sessions_ended_total and its
			// alert, and the instance is no standby any more.
			r.obs.SessionEnded(err)
		}
		if ran && r.clock.Now().Sub(started) > 4*r.cfg.Relay.RestartBackoffMax {
			backoff = r.cfg.Relay.RestartBackoff
		}
		wait := jitter(backoff)
		if errors.Is(err, replication.ErrSlotInUse) {
			// Standby: another instance streams from the slot. Poll often
			// enough to take over within a few seconds of its end.
			wait = jitter(cmp.Or(r.standbyPollEvery, standbyPoll))
			r.log.Info("standby: the slot is in use by another instance; waiting to take over", zap.Error(err), zap.Duration("retry_in", wait))
		} else {
			r.log.Warn("stream stopped; restarting from the slot's confirmed position", zap.Error(err), zap.Duration("backoff", wait))
		}
		if !r.sleep(ctx, wait) {
			return nil
		}
		backoff = min(2*backoff, r.cfg.Relay.RestartBackoffMax)
	}
}

// jitter is a random wait in [d/2, d], so that instances that failed
// together do not retry in step.
func jitter(d time.Duration) time.Duration { return d/2 + mrand.N(d/2+1) }

// sleep waits d on the relay's clock between two tries of a restart loop.
// It returns false when ctx ended first: the loop then returns.
func (r *Relay) sleep(ctx context.Context, d time.Duration) bool {
	t := r.clock.NewTimer(d)
	select {
	case <-ctx.Done():
		t.Stop()
		return false
	case <-t.C():
		return true
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

// session runs one replication session. ran reports whether streaming
// started.
func (r *Relay) session(ctx context.Context) (ran bool, err error) {
	pcfg := r.cfg.Postgres
	if r.history.slotSeen {
		// The slot is created at most once, at the first start. One that
		// vanished since was dropped under the relay: recreating it would
		// silently skip every event written in between.
		pcfg.CreateSlot = false
	}
	// Where checkHistory judges the fence, Prepare holds cleanup if the
	// slot is past it.
	pcfg.HoldOnFencePassed = r.judgesFence()
	pcfg.BeforeCreate = func(ctx context.Context, conn *pgx.Conn) error {
		return PollRowsRefusal(ctx, conn, pcfg.Slot, pcfg.QualifiedTables())
	}
	r.joinSlot(ctx) // again, if it failed or its connection was lost
	start, err := r.be.Prepare(ctx, pcfg)
	if err != nil {
		return false, r.prepareError(err)
	}
	slot := start.Slot
	if slot.Active {
		// Another instance owns the slot, and may advance it: when this
		// one takes over, the slot's position is legitimately ahead. No
		// producer is built for a slot that is busy.
		r.history.slotBusy()
		r.standingBy(ctx, start)
		return false, fmt.Errorf("%w: slot %q (walsender PID %d)", replication.ErrSlotInUse, pcfg.Slot, slot.ActivePID)
	}
	// Not while an instance publishing elsewhere, which the last session
	// did, runs (membership.go).
	if err := r.checkDestination(ctx, start); err != nil {
		return false, err
	}
	if err := r.checkHistory(start); err != nil {
		return false, err
	}
	if err := r.checkColumns(&start.Catalog); err != nil {
		return false, err
	}

	if err := r.checkDeadLetterTopic(ctx); err != nil {
		return false, err
	}
	r.checkDebeziumMessageTopic(ctx)
	// The stream first: it takes the slot, and an instance that finds it
	// taken builds no producer. In exactly-once mode building one fences
	// every earlier producer of the transactional id: a standby that did
	// so in the moment the active instance was between two sessions made
	// Kafka refuse that instance's transaction, and it exited for a
	// takeover that never came.
	st, err := r.be.Open(ctx, r.cfg.Postgres, slot.ConfirmedFlushLSN)
	if err != nil {
		if errors.Is(err, replication.ErrSlotInUse) {
			r.history.slotBusy()
		}
		return false, err
	}
	closeStream := func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		_ = st.Close(cctx)
		cancel()
	}
	// Everything above judged the slot as Prepare read it. Someone who
	// advanced the slot before the stream took it skipped the events in
	// between: the stream starts at the slot's position, not at the one
	// judged. Now the slot is the stream's, so it can be read once more,
	// for good (before the status updates below confirm the position
	// judged: a server without the guard against moving a slot back would
	// take it, and hide the advance).
	serverNow, err := r.checkSlotAtStart(ctx, slot)
	if err != nil {
		closeStream()
		return false, err
	}
	kcfg := r.cfg.Kafka
	kcfg.AckBuffer = r.cfg.Relay.MaxInFlightRecords*eosHeadroom(kcfg.ExactlyOnce) + 1
	kcfg.SingleRecordBatches = r.singleUntil > 0
	var prod producer
	var txn txnProducer
	// Building the producer can take long (a broker slow to answer): the
	// stream, not read meanwhile, is kept from the server's
	// wal_sender_timeout by status updates that confirm nothing new, for
	// at most keepAliveMax. They also keep a PostgreSQL shutdown waiting
	// for the stream (its walsender waits for what it sent to be
	// confirmed): past keepAliveMax the server's timeout ends the stream,
	// and the session starts again.
	kept := keepStreamAlive(ctx, st, slot.ConfirmedFlushLSN, r.cfg.Postgres.StatusInterval)
	if kcfg.ExactlyOnce {
		txn, err = r.startTransactional(ctx, &kcfg, start, serverNow)
		prod = txn
	} else {
		prod, err = r.be.NewProducer(ctx, kcfg)
	}
	kept()
	if err != nil {
		closeStream()
		return false, err
	}
	// abandon ends the stream and the producer of a session that fails
	// before it streams.
	abandon := func() {
		closeStream()
		r.closeProducer(ctx, prod, r.clock.Now().Add(r.cfg.Relay.ShutdownTimeout))
	}
	// Recorded once this instance holds the slot, and before it confirms
	// anything: another instance that finds the slot moved on knows who did.
	// By the server's clock: the next start compares it with the server's
	// start time (CheckFence), and a relay host's clock ahead or behind
	// would tell a restart where there was none, or miss one.
	sessionStart := serverNow
	if sessionStart.IsZero() {
		sessionStart = r.clock.Now()
	}
	rec := sessionState(start, pcfg.Publication, r.cfg.Messages.Prefix, r.instance, sessionStart)
	rec.Destination = r.members.dest.record()
	if err := r.be.RecordSession(ctx, pcfg, rec); err != nil {
		abandon()
		return false, err
	}
	r.history.slotSeen, r.history.othersHeld = true, false
	r.history.lastConfirmed = max(r.history.lastConfirmed, slot.ConfirmedFlushLSN)
	r.history.sessionStarted = sessionStart
	if r.singleUntil > 0 {
		r.log.Warn("sending records one per produce request until the batch Kafka refused is confirmed",
			zap.Stringer("until", r.singleUntil))
	}
	for lsn := range r.staleRetried {
		// Confirmed: relayed or dead-lettered.
		if lsn < slot.ConfirmedFlushLSN {
			delete(r.staleRetried, lsn)
		}
	}
	s := newSession(r, ctx, start, st, prod)
	if txn != nil {
		stored, _ := txn.Stored()
		s.startEOS(txn, checkpoint.LSN(stored), txn.StoredAt())
	}
	r.obs.SessionStarted(slot.ConfirmedFlushLSN)
	err = s.loop()
	s.finish(err)
	var fe *FatalError
	if !errors.As(err, &fe) {
		if ferr := s.eos.fencedAfter(); ferr != nil {
			s.log.Error("Kafka refused this instance's transactional producer after the session ended", zap.NamedError("session_end", err), zap.Error(ferr))
			err = ferr
		}
	}
	if errors.Is(err, errStopped) || errors.Is(err, errNewProducer) {
		r.obs.SessionEnded(nil)
	} else {
		r.obs.SessionEnded(err)
	}
	return true, err
}

// keepAliveMax bounds how long keepStreamAlive keeps a stream alive: a
// producer's start that takes longer (the broker slow to answer, beyond
// sarama's own timeouts) costs the stream, not a PostgreSQL shutdown
// waiting on it.
const keepAliveMax = 2 * time.Minute

// keepStreamAlive sends a status update confirming confirmed (the slot's
// own position: nothing new) every interval, for at most keepAliveMax,
// until the returned function is called, which waits for it. It runs
// while the session builds its producer, before the loop reads the
// stream: the server ends a stream that says nothing for
// wal_sender_timeout. It waits on the wall clock, not the relay's, which
// belongs to the loop's goroutine.
func keepStreamAlive(ctx context.Context, st stream, confirmed checkpoint.LSN, interval time.Duration) (stop func()) {
	ctx, cancel := context.WithTimeout(ctx, keepAliveMax)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				// Bounded, so that stop never waits on the network; a
				// failure shows at the loop's first read.
				sctx, scancel := context.WithTimeout(ctx, interval)
				err := st.SendStatus(sctx, confirmed, false)
				scancel()
				if err != nil {
					return
				}
			}
		}
	}()
	return func() {
		cancel()
		wg.Wait()
	}
}

// checkSlotAtStart reads the slot again once the stream holds it: a slot
// that moved past where Prepare found it (judged was) was advanced by
// someone else in between, and the stream, which starts at the slot's
// position, would skip the events in between.
func (r *Relay) checkSlotAtStart(ctx context.Context, judged replication.SlotState) (serverNow time.Time, err error) {
	now, serverNow, err := r.be.ReadSlot(ctx, r.cfg.Postgres)
	if errors.Is(err, replication.ErrSlotMissing) {
		return serverNow, &FatalError{Err: fmt.Errorf("relay: slot %q was dropped as pgoutbox started streaming from it (it was at %s); events written since may be lost, so pgoutbox will not recreate it: investigate, then recreate the slot deliberately (pgoutbox migrate --recreate-slot): %w",
			r.cfg.Postgres.Slot, judged.ConfirmedFlushLSN, err)}
	}
	if err != nil {
		return serverNow, fmt.Errorf("relay: read slot %q after starting to stream from it: %w", r.cfg.Postgres.Slot, err)
	}
	if now.ConfirmedFlushLSN <= judged.ConfirmedFlushLSN {
		return serverNow, nil
	}
	if r.cfg.Postgres.StateTable != "" {
		// Another pgoutbox instance may have streamed from the slot in
		// between (it raises the state row's fence before it confirms);
		// anything else moved it past the fence. The next session's start
		// judges it by the fence, as after any other holder.
		r.history.slotBusy()
		return serverNow, fmt.Errorf("%w: slot %q moved from %s to %s between pgoutbox's checks and the start of its stream; the next start judges it by the state row's fence",
			replication.ErrSlotInUse, r.cfg.Postgres.Slot, judged.ConfirmedFlushLSN, now.ConfirmedFlushLSN)
	}
	// Without a state table there is no fence to judge by.
	return serverNow, &FatalError{Err: fmt.Errorf("%w: slot %q moved from %s to %s while pgoutbox started (between its checks and the start of the stream), and the events committed in between were skipped; investigate (pg_replication_slot_advance, or another client streaming from the slot) before starting again",
		replication.ErrSlotAdvanced, r.cfg.Postgres.Slot, judged.ConfirmedFlushLSN, now.ConfirmedFlushLSN)}
}

// prepareError classifies a failure of Prepare: a missing, vanished or lost
// slot and an unusable publication are fatal (a restart would only repeat
// them); anything else is retried.
func (r *Relay) prepareError(err error) error {
	pcfg := r.cfg.Postgres
	var ve *replication.VanishedError
	switch {
	case errors.As(err, &ve) && ve.State.AwaitingSnapshot != "":
		// (With snapshot.mode: initial, the snapshot takes it: snapshot.go.)
		return &FatalError{Err: fmt.Errorf("relay: slot %q is missing on purpose: it was %s, and the outbox rows written since are to be published by the WAL source's initial snapshot, which a slot made now would skip; start with snapshot.mode: initial (and snapshot.rows: unpublished, after the poll source), which publishes them and then makes the slot: %w",
			pcfg.Slot, ve.State.AwaitingSnapshot, replication.ErrSlotVanished)}
	case r.history.slotSeen && errors.Is(err, replication.ErrSlotMissing):
		return &FatalError{Err: fmt.Errorf("relay: slot %q was dropped while pgoutbox was using it (last confirmed %s); events written since may be lost, so pgoutbox will not recreate it: investigate, then recreate the slot deliberately (pgoutbox migrate --recreate-slot): %w", pcfg.Slot, r.history.lastConfirmed, err)}
	case errors.Is(err, replication.ErrPublicationMissing), errors.Is(err, replication.ErrSlotMissing), errors.Is(err, replication.ErrSlotAdvanced),
		errors.Is(err, replication.ErrSlotLost), errors.Is(err, replication.ErrSlotVanished), errors.Is(err, replication.ErrSlotUnusable),
		errors.Is(err, replication.ErrCatalogUnusable), errors.Is(err, replication.ErrCatalogChanged), errors.Is(err, replication.ErrPollRowsUnpublished):
		return &FatalError{Err: err}
	}
	return err
}

// judgesFence says whether the session judges the slot by the state row's
// fence: at the first start, and after another connection held the slot
// (a pgoutbox instance raises the fence before it confirms, so a slot past
// the fence was moved by something else: pg_recvlogical, a misconfigured
// Debezium, a slot advance in the takeover's window). Otherwise this
// process's own history knows more.
func (r *Relay) judgesFence() bool { return !r.history.slotSeen || r.history.othersHeld }

// checkHistory compares the slot with what this process and the state table
// remember: a slot ahead of the furthest position this process confirmed
// was advanced by someone else, unless another pgoutbox instance took it
// over meanwhile (it recorded its session in the state table); a slot
// behind what pgoutbox recorded as confirmed (a failover slot that was not
// synchronized to the end) means the transactions in between are sent
// again.
func (r *Relay) checkHistory(start replication.Start) error {
	slot, pcfg := start.Slot, r.cfg.Postgres
	// A slot whose position this server's WAL never reached, or reached on
	// another timeline only, came with a restore or a rewind (a restored
	// or rewound data directory keeps pg_replslot as it was): PostgreSQL
	// skips every transaction committing before the slot's position,
	// which are new ones here.
	// (Prepare refuses it first where there is a state row, and records it.)
	// So does one whose messages prefix changed (historyRefusal).
	if err := historyRefusal(start, r.cfg); err != nil {
		return err
	}
	if slot.ConfirmedFlushLSN < r.history.lastConfirmed {
		// The slot went back (a failover to a standby whose slot lagged):
		// this process has confirmed nothing of what lies past it since.
		// Kept, the furthest position of before would pass a slot someone
		// else advanced to below it, and be written as the fence at stop.
		r.history.lastConfirmed = slot.ConfirmedFlushLSN
	}
	if start.HadState && slot.ConfirmedFlushLSN < start.State.ConfirmedLSN {
		r.log.Warn("the slot is behind the position pgoutbox recorded as confirmed: the transactions in between will be sent to Kafka again (duplicates with the same event ids)",
			zap.String("slot", pcfg.Slot), zap.Stringer("slot_confirmed_lsn", slot.ConfirmedFlushLSN),
			zap.Stringer("recorded_confirmed_lsn", start.State.ConfirmedLSN), zap.Int32("timeline", start.Identity.Timeline),
			zap.Uint64("bytes", uint64(start.State.ConfirmedLSN-slot.ConfirmedFlushLSN)))
	}
	if start.HadState && start.State.PublicationOID == start.Catalog.Publication {
		if w := start.Catalog.Altered(start.State.PublicationXmin, "pgoutbox last streamed", pcfg); w != "" {
			r.publicationAltered(w, pcfg.Publication)
		}
	}
	if start.TimelineChanged() {
		fork := "unknown: the recorded timeline is not in the server's history"
		if start.ForkKnown {
			fork = start.Fork.String()
		}
		r.log.Warn("PostgreSQL changed timeline since pgoutbox last recorded the slot (a promotion or a restore)",
			zap.Int32("recorded_timeline", start.State.Timeline), zap.Int32("timeline", start.Identity.Timeline), zap.String("fork_lsn", fork))
	}
	if r.judgesFence() {
		// The slot moves only when a client confirms, and the last session
		// recorded the furthest its process may confirm before confirming
		// it (the fence). (Within one process the history below knows more.)
		// Prepare has held cleanup where events may have been skipped.
		fence := start.State.StoppedLSN
		switch start.CheckFence() {
		case replication.FencePassedByShutdown, replication.FencePassedAfterRestart:
			// Earlier versions confirmed the end of WAL as the server shut
			// down (the server waits for it, and refuses the connection the
			// fence is raised on); this one never confirms past the fence
			// (see errServerStopping), so only an earlier version's last
			// session, or someone who moved the slot, leaves it there.
			// Prepare has held cleanup.
			r.log.Warn("the slot is past the recorded fence, and PostgreSQL restarted since the last session began: either that session was of a pgoutbox version that confirmed the end of WAL as the server shut down (then nothing is lost), or someone moved the slot while pgoutbox was stopped (then the events committed in between were skipped); compare Kafka with the outbox between these positions (pgoutbox cleanup is held until then)",
				zap.String("slot", pcfg.Slot), zap.Stringer("slot_confirmed_lsn", slot.ConfirmedFlushLSN), zap.Stringer("fence", fence),
				zap.Bool("at_shutdown_checkpoint", start.CheckFence() == replication.FencePassedByShutdown),
				zap.Stringer("checkpoint_lsn", start.Identity.CheckpointLSN), zap.Time("server_started_at", start.Identity.StartedAt),
				zap.String("instance", start.State.Instance), zap.Time("session_started_at", start.State.SessionStartedAt))
			return nil
		case replication.FencePassed:
			return fenceRefusal(start, pcfg)
		case replication.FenceStale:
			r.log.Warn("the slot is past the recorded fence, but the state row records a later session that confirmed past it too, as pgoutbox versions from before the fence do (a rollback to such a version, then forward again): that version confirmed past its own record every few seconds, so the slot is most likely where it left it; if anything else may have moved the slot since (pg_replication_slot_advance, another client), the events between these positions were skipped: compare Kafka with the outbox between them (pgoutbox cleanup is held until then)",
				zap.String("slot", pcfg.Slot), zap.Stringer("slot_confirmed_lsn", slot.ConfirmedFlushLSN), zap.Stringer("fence", fence),
				zap.Stringer("recorded_confirmed_lsn", start.State.ConfirmedLSN), zap.String("instance", start.State.Instance),
				zap.Time("session_started_at", start.State.SessionStartedAt))
		}
	}
	if !r.history.slotSeen || r.history.othersHeld || slot.ConfirmedFlushLSN <= r.history.lastConfirmed {
		return nil
	}
	if start.HadState && start.State.Instance != "" && start.State.Instance != r.instance &&
		start.State.SessionStartedAt.After(r.history.sessionStarted) {
		r.log.Info("another pgoutbox instance took the slot over while this one was disconnected, and moved it on; continuing from its position",
			zap.String("slot", pcfg.Slot), zap.String("instance", start.State.Instance), zap.Stringer("confirmed_lsn", slot.ConfirmedFlushLSN))
		r.history.slotBusy()
		return nil
	}
	return &FatalError{Err: fmt.Errorf("relay: slot %q is at %s, past %s, the furthest pgoutbox confirmed, and no other pgoutbox instance recorded a session on it: it was advanced, or dropped and recreated, by someone else, and the events in between were skipped; investigate before restarting", pcfg.Slot, slot.ConfirmedFlushLSN, r.history.lastConfirmed)}
}

// checkColumns makes sure logical decoding sends every outbox table's
// event columns: a column missing from the stream (not in the table, or a
// generated one, which decoding leaves out) made every row of a missing
// id, payload or routing column poison, and of a missing key column a
// record without a key, its order per key lost without a word (Debezium's
// task stops on such a row).
func (r *Relay) checkColumns(cat *replication.Catalog) error {
	var problems []string
	for _, t := range cat.Tables {
		if t.OID == 0 || t.Columns == nil { // no table, or its columns not read
			continue
		}
		problems = append(problems, r.eventColumnProblems(t.Name, func(col string) (bool, string) { return cat.SentColumn(t, col) })...)
	}
	if len(problems) > 0 {
		return &FatalError{Err: &replication.CatalogError{Publication: r.cfg.Postgres.Publication, Problems: problems, Err: replication.ErrCatalogUnusable}}
	}
	return nil
}

// eventColumnProblems lists table's event columns (id, key, payload,
// routing) that sent says the rows will not carry, with why.
func (r *Relay) eventColumnProblems(table string, sent func(col string) (bool, string)) []string {
	var problems []string
	id, key, payload, route := r.router.For(table).EventColumns()
	for _, c := range []struct{ opt, col string }{
		{"table.field.event.id", id}, {"table.field.event.key", key},
		{"table.field.event.payload", payload}, {"route.by.field", route},
	} {
		if c.col == "" {
			continue
		}
		if ok, why := sent(c.col); !ok {
			problems = append(problems, fmt.Sprintf("%s %q %s", c.opt, c.col, why))
		}
	}
	return problems
}

// checkQueriedTable checks an outbox table that is read with queries (the
// poll source, the initial snapshot): row-level security must not hide
// rows from them, and the event columns must be there (queries return
// generated ones too).
func (r *Relay) checkQueriedTable(ctx context.Context, conn *pgx.Conn, table string) error {
	if err := replication.CheckRowSecurity(ctx, conn, table); err != nil {
		if errors.Is(err, replication.ErrRowSecurity) {
			return &FatalError{Err: err}
		}
		return err
	}
	cols, err := poll.Columns(ctx, conn, table)
	if err != nil || len(cols) == 0 {
		return err // a table that does not exist: its readers say so
	}
	problems := r.eventColumnProblems(table, func(col string) (bool, string) {
		return slices.Contains(cols, col), "is not a column of outbox table " + table
	})
	if len(problems) > 0 {
		return &FatalError{Err: fmt.Errorf("relay: %s: %s: its rows would be poison, or without a key (their order per key lost)", table, strings.Join(problems, "; "))}
	}
	return nil
}

// checkDeadLetterTopic makes sure, before the first stream, that the
// dead-letter topic exists: otherwise the first poison row would stop the
// relay, and dead-letter would silently mean fail.
func (r *Relay) checkDeadLetterTopic(ctx context.Context) error {
	lim := r.cfg.Relay
	if lim.PoisonPolicy != "dead-letter" || r.cfg.Kafka.AutoCreateTopics {
		return nil
	}
	missing, err := r.lookUpTopic(ctx, lim.DeadLetterTopic)
	if err != nil {
		return err
	}
	if missing != nil {
		return &FatalError{Err: fmt.Errorf("relay: dead.letter.topic %q: %w; create it (poison.policy=dead-letter sends the records that cannot be relayed there), or set kafka.auto.create.topics", lim.DeadLetterTopic, missing)}
	}
	return nil
}

// lookUpTopic asks Kafka whether topic exists, unless it is known to, and
// records it when it does: missing is why it cannot be written to (it
// does not exist), err a failure to ask.
func (r *Relay) lookUpTopic(ctx context.Context, topic string) (missing, err error) {
	if _, ok := r.topics.ok[topic]; ok {
		return nil, nil
	}
	st, err := r.be.CheckTopics(ctx, r.cfg.Kafka, []string{topic})
	if err != nil {
		return nil, err
	}
	if st[0].Err != nil {
		return st[0].Err, nil
	}
	r.topics.known(st)
	return nil, nil
}

// sessionState is the state row that records this instance's session,
// with the messages.prefix it relays messages with (prefix).
func sessionState(start replication.Start, publication, prefix, instance string, now time.Time) replication.State {
	s := start.State
	if awaited := start.State.AwaitingSnapshot; !start.HadState || start.Created || awaited != "" {
		// (A row awaiting the slot holds no history: the initial
		// snapshot made the slot.)
		s = replication.State{Slot: start.Slot.Name, SlotCreatedAt: now, SlotCreatedLSN: start.Slot.ConfirmedFlushLSN, Note: "created by pgoutbox"}
		switch {
		case awaited != "" && !start.Created:
			s.SlotCreatedAt, s.SlotCreatedLSN, s.Note = time.Time{}, 0, "found the slot already there, made by the initial snapshot after it was "+awaited
		case !start.Created:
			s.SlotCreatedAt, s.SlotCreatedLSN, s.Note = time.Time{}, 0, "found the slot already there"
		}
	}
	s.MessagesPrefix, s.MessagesRecorded = prefix, true
	s.Slot = start.Slot.Name
	s.SystemIdentifier = start.Identity.SystemIdentifier
	s.Database = start.Identity.Database
	s.Timeline = start.Identity.Timeline
	s.ConfirmedLSN = max(s.ConfirmedLSN, start.Slot.ConfirmedFlushLSN)
	if start.Slot.ConfirmedFlushLSN < start.State.ConfirmedLSN {
		// A slot behind the record: from here on the record follows the slot.
		s.ConfirmedLSN = start.Slot.ConfirmedFlushLSN
	}
	s.ConfirmedAt = now
	s.SetCatalog(&start.Catalog)
	s.Publication = publication
	s.Instance = instance
	s.SessionStartedAt = now
	// The fence: this session confirms nothing past the slot's position
	// until it has raised it.
	s.StoppedLSN = start.Slot.ConfirmedFlushLSN
	return s
}

// closeProducer closes p. Between sessions the old producer must be gone
// before a new one starts, since records it still delivers would interleave
// with the new session's resends and break per-key order: so it waits as
// long as sarama takes, unless a stop is requested; from then on it waits
// until deadline at most, after which sarama's connections are closed under
// it. A stop at once (the second signal) closes them at once.
func (r *Relay) closeProducer(ctx context.Context, p producer, deadline time.Time) {
	cctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The budget: what is left of the stop's when it is under way, a whole
	// relay.shutdown.timeout from a stop requested while waiting.
	budget := r.cfg.Relay.ShutdownTimeout
	if ctx.Err() != nil {
		budget = deadline.Sub(r.clock.Now())
	}
	// Closing gives up the moment sarama's Close is given, less the time
	// Close then needs to close the connections under it.
	budget -= kafka.CloseGrace
	var mu sync.Mutex
	var t *time.Timer
	stop := context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		t = time.AfterFunc(max(budget, 0), cancel)
	})
	// A second signal: at once.
	stopForce := func() bool { return false }
	if r.force != nil {
		stopForce = context.AfterFunc(forceContext{context.Background(), r.force}, cancel)
	}
	r.logClose(p.Close(cctx))
	stop()
	stopForce()
	mu.Lock()
	if t != nil {
		t.Stop()
	}
	mu.Unlock()
}

func (r *Relay) logClose(err error) {
	if err != nil {
		r.log.Warn("close the Kafka producer", zap.Error(err))
	}
}
