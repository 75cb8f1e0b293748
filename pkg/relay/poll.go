package relay

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"

	"github.com/pgoutbox/pgoutbox/pkg/kafka"
	"github.com/pgoutbox/pgoutbox/poll"
	"github.com/pgoutbox/pgoutbox/replication"
	"github.com/pgoutbox/pgoutbox/router"
)

// The poll source (relay.source: poll) publishes the outbox table's own
// rows: claim a batch of unpublished rows in sequence order, route and
// produce them, wait until Kafka acknowledged every one, mark them
// published, commit. The table is its checkpoint: a crash before the
// commit leaves the rows unpublished and they are claimed again. Several
// instances share the table by key buckets (package poll), so that one
// key is published by one instance at a time, in sequence order.

// PollObserver is implemented by an Observer that also follows the poll
// source (pkg/metrics does). The relay calls PollProgress from Run's
// goroutine and CleanedUp from its cleanup goroutine: implementations must
// be safe for concurrent use and return quickly.
type PollObserver interface {
	// PollProgress: after every claim, and at least every second while
	// waiting for rows or for Kafka.
	PollProgress(p PollProgress)
	// CleanedUp: the relay's cleanup deleted rows published more than
	// poll.retention ago.
	CleanedUp(rows int64)
}

// PollProgress is the poll source's state after a claim, or while it waits.
type PollProgress struct {
	Table string
	// Members is how many instances relay the table; Owned of its buckets
	// this one owns, out of Buckets.
	Members, Owned, Buckets int
	// Claimed is how many rows the last claim took; Published how many of
	// them were marked published (or deleted), Failed how many failed
	// an attempt.
	Claimed, Published, Failed int
	// InFlightRecords is what waits for Kafka's acknowledgement.
	InFlightRecords int
	// Committed: a claim transaction just ended (its outcome recorded, or
	// it found nothing): the relay makes progress.
	Committed bool
}

// errWaitingForOthers ends a poll session that cannot start yet because
// of another relay (a WAL relay still on the handover slot): waited out
// with the restart backoff, also at start-up.
var errWaitingForOthers = errors.New("relay: waiting for another relay")

// pollRunner is what the poll source keeps across sessions.
//
// Concurrency: owned by Run's goroutine.
type pollRunner struct {
	r     *Relay
	table *poll.Table
	// rowCap caps the length of a claimed row (receive.max.message.bytes).
	rowCap replication.MessageCap
	// blocked holds the keys whose first unpublished row failed, until
	// when its retry waits (poll.retry.backoff): no row of such a key is
	// claimed meanwhile, so later rows never overtake it.
	blocked map[string]time.Time
	// heldWarned is when holdKeys last logged.
	heldWarned time.Time
	// refusedSeqs: the broker refused a batch for these rows' records
	// (too large, say); while there are any, sessions send one record per
	// produce request (single), where such a record is refused alone and
	// is poison, until the rows are published or dead-lettered. Left at
	// the first claim that went through instead, a row refused alone too
	// went back into a batch at each retry, and the broker refused the
	// whole batch again: its acknowledged rows sent twice, their keys'
	// order broken, up to poll.max.attempts times.
	refusedSeqs []int64
	// staleRetried holds the rows Kafka refused for a partition or topic
	// the producer's metadata lacked (kafka.MayBeStaleMetadata), which a
	// session with a new producer, and fresh metadata, tries again before
	// the refusal counts as an attempt: sarama keeps a topic's partition
	// count for up to ten minutes, longer than a row's attempts last. An
	// entry goes when the row is published or dead-lettered (one whose
	// buckets another instance took stays: a few bytes).
	staleRetried map[int64]bool
	// holdsWarned are the other slots' cleanup holds (slot and hold) the
	// cleanup last found and warned of, so that each is warned of once
	// while it lasts, not at every cleanup interval. Only the cleanup
	// goroutine uses it, one at a time: a session's stopClean waits for
	// its goroutine before the next session starts another.
	holdsWarned map[replication.SharedHold]bool
	// membersWarned are the PIDs of the other instances on the table a
	// rebalance warned of (their destination unknown, or another), so
	// that each is warned of once.
	membersWarned map[uint32]bool
	// holdsUnreadable: the state table may not be read, warned of once.
	holdsUnreadable bool
}

// single says sessions send one record per produce request (see
// refusedSeqs).
func (pr *pollRunner) single() bool { return len(pr.refusedSeqs) > 0 }

// runPoll is Run for the poll source: sessions restarted with the
// relay's backoff until a stop or a fatal error.
func (r *Relay) runPoll(ctx context.Context) error {
	table, err := r.cfg.PollTable()
	if err != nil {
		return &ConfigError{Err: err}
	}
	pr := &pollRunner{r: r, table: table, blocked: map[string]time.Time{}, staleRetried: map[int64]bool{}, rowCap: r.cfg.Postgres.MessageCap()}
	lim := r.cfg.Relay
	backoff := lim.RestartBackoff
	ran := false
	for {
		started := r.clock.Now()
		streamed, err := pr.session(ctx)
		ran = ran || streamed
		var fe *FatalError
		switch {
		case errors.As(err, &fe):
			return err
		case ctx.Err() != nil, errors.Is(err, errStopped):
			return nil
		case errors.Is(err, errNewProducer):
			continue
		case !ran && !errors.Is(err, errWaitingForOthers):
			return &StartupError{Err: err}
		}
		if streamed && r.clock.Now().Sub(started) > 4*lim.RestartBackoffMax {
			backoff = lim.RestartBackoff
		}
		wait := jitter(backoff)
		if errors.Is(err, poll.ErrDestinationMismatch) {
			r.log.Error("poll instance waiting: another instance on the table publishes to another destination; this one claims nothing until it has left", zap.Error(err), zap.Duration("backoff", wait))
		} else {
			r.log.Warn("poll session stopped; starting again", zap.Error(err), zap.Duration("backoff", wait))
		}
		if !r.sleep(ctx, wait) {
			return nil
		}
		backoff = min(2*backoff, lim.RestartBackoffMax)
	}
}

// connect opens an ordinary connection named app, on which the server
// finds a vanished client within about a minute (deadPeerSettings).
func (pr *pollRunner) connect(ctx context.Context, app string) (*pgx.Conn, error) {
	pc := pr.r.cfg.Postgres
	conn, err := replication.ConnectSQL(ctx, pc, app, pc.ConnectTimeout)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, deadPeerSettings); err != nil {
		closeConn(conn)
		return nil, fmt.Errorf("relay: poll connection %s: set the server's TCP keepalives (%s): %w", app, deadPeerSettings, err)
	}
	return conn, nil
}

// deadPeerSettings make the server end a session whose client host
// vanished without a word (a crash of its host or VM, a network
// partition) within about a minute: idle for 30 s, then a probe every
// 10 s, gone after 3 unanswered (60 s); what the server sent and the
// client never acknowledged, gone after 60 s (tcp_user_timeout, in ms).
// The claim session holds its member lock, its buckets' locks and its
// claimed rows until the server ends it; with the operating system's
// keepalives (2 h idle, then 9 probes 75 s apart) the other instances
// could not take its buckets for 2 h 11 min, and nothing said why. Any
// role may set these for its session; on a Unix socket the server ignores
// them. The client side needs nothing here: Go's dialer probes an idle
// connection after 15 s, and every statement has a deadline (op).
const deadPeerSettings = `SELECT set_config('tcp_keepalives_idle', '30', false), set_config('tcp_keepalives_interval', '10', false),
	set_config('tcp_keepalives_count', '3', false), set_config('tcp_user_timeout', '60000', false)`

func closeConn(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = conn.Close(ctx)
}

// pollSession is one connection's worth of the poll source.
//
// Concurrency: Run's goroutine owns the claim connection, the membership,
// the producer's input and the publisher. Beside it run the producer's
// drain goroutine, the topic checker, the listener (its own connection),
// the cleanup (its own connection) and a goroutine that turns a second
// signal into the cancellation of the SQL in progress; finish stops and
// waits for all of them.
type pollSession struct {
	pr       *pollRunner
	r        *Relay
	ctx      context.Context // Run's
	conn     *pgx.Conn
	members  *poll.Membership
	claimer  *poll.Claimer
	pub      *rowPublisher
	listener *poll.Listener // nil without poll.notify
	own      poll.Ownership
	// sqlCtx ends at once on a second signal; each statement adds its
	// own deadline to it.
	sqlCtx     context.Context
	stopSQL    context.CancelFunc
	watchDone  chan struct{}
	stopClean  func()
	nextRebal  time.Time
	lastReport time.Time
	// userTypes are the user types of the claims' columns, read once.
	userTypes map[uint32]replication.UserType
}

func (pr *pollRunner) session(ctx context.Context) (ran bool, err error) {
	r, t := pr.r, pr.table
	conn, err := pr.connect(ctx, "pgoutbox-poll")
	if err != nil {
		return false, err
	}
	defer closeConn(conn) // last: it releases the bucket locks
	// A claim reads each row whole: one longer than the process has the
	// memory for stops the relay (RowTooLargeError) before it is read.
	conn.PgConn().Frontend().SetMaxBodyLen(pr.rowCap.Bytes)
	// A claim keeps its transaction open until Kafka acknowledges: a
	// server that ended idle transactions (or long ones) would end the
	// session, release its buckets, and have another instance send the
	// same rows meanwhile. Any role may set these for its session.
	// (transaction_timeout is PostgreSQL 17's.)
	if _, err := conn.Exec(ctx, `SELECT set_config('idle_in_transaction_session_timeout', '0', false);
		SELECT set_config('transaction_timeout', '0', false) WHERE current_setting('transaction_timeout', true) IS NOT NULL`); err != nil {
		return false, fmt.Errorf("relay: poll session: turn off the server's transaction timeouts: %w", err)
	}
	// First the table an earlier session checked, if the name names
	// another now: Check takes the one it names. The table checked last
	// is recorded (by this process, another instance, or one before a
	// restart), so that a stop on its unpublished rows holds across
	// restarts, and a rename while no relay ran is found.
	unrecorded, err := pr.loadRecord(ctx, conn)
	if err != nil {
		return false, err
	}
	if re, err := t.Replaced(ctx, conn); err != nil {
		return false, err
	} else if re != nil {
		if err := pr.tableReplaced(re); err != nil {
			return false, err
		}
	}
	if err := t.Check(ctx, conn); err != nil {
		if errors.Is(err, poll.ErrLayout) {
			return false, &FatalError{Err: err}
		}
		return false, err
	}
	if names := t.KeepTriggersNotAlways(); len(names) > 0 {
		// Not a refusal: tables migrated by earlier versions have them so
		// until migrate runs again.
		r.log.Warn(poll.NotAlwaysWarning(t.Name, names), zap.String("table", t.Name), zap.Strings("triggers", names))
	}
	if where := t.DeleteUnpublishedSettings(); len(where) > 0 {
		r.log.Warn(poll.DeleteUnpublishedWarning(t.Name, where), zap.String("table", t.Name), zap.Strings("set_for", where))
	}
	if names := t.BeforeInsertTriggers(); len(names) > 0 {
		r.log.Warn(poll.BeforeInsertWarning(t.Name, names), zap.String("table", t.Name), zap.Strings("triggers", names))
	}
	if err := r.checkQueriedTable(ctx, conn, t.Name); err != nil {
		return false, err
	}
	if unrecorded == nil {
		if err := t.Record(ctx, conn); errors.Is(err, poll.ErrUnrecorded) {
			unrecorded = err
		} else if err != nil {
			return false, err
		}
	}
	if unrecorded != nil {
		r.log.Warn("the poll source cannot record the table it checked: it knows it only while it runs, so a table renamed away with unpublished rows while it is stopped, or before a restart, is not found, and those rows are never relayed",
			zap.String("table", t.Name), zap.Error(unrecorded))
	}
	if err := pr.handover(ctx, conn); err != nil {
		return false, err
	}
	m, err := poll.JoinTo(ctx, conn, t.Name, r.cfg.Poll.Buckets, r.cfg.PollDestination(t.Name))
	if err != nil {
		return false, err
	}
	if err := r.checkDeadLetterTopic(ctx); err != nil {
		return false, err
	}
	kcfg := r.cfg.Kafka
	kcfg.AckBuffer = pr.batchLimit() + 1
	kcfg.SingleRecordBatches = pr.single()
	prod, err := r.be.NewProducer(ctx, kcfg)
	if err != nil {
		return false, err
	}
	s := &pollSession{pr: pr, r: r, ctx: ctx, conn: conn, members: m, claimer: poll.NewClaimer(conn, t, r.cfg.Poll), watchDone: make(chan struct{})}
	s.pub = &rowPublisher{r: r, prod: prod, checker: r.be.StartTopicChecker(r.cfg.Kafka, func() {}), ctx: ctx, single: pr.single(),
		onWait: func(n int) { s.report(PollProgress{InFlightRecords: n}) }}
	s.sqlCtx, s.stopSQL = context.WithCancel(context.WithoutCancel(ctx))
	go func() {
		defer close(s.watchDone)
		select {
		case <-r.force:
			s.stopSQL()
		case <-s.sqlCtx.Done():
		}
	}()
	if r.cfg.Poll.Notify {
		channel := r.cfg.Poll.Channel(t.Name)
		s.listener = poll.Listen(func(ctx context.Context) (*pgx.Conn, error) { return pr.connect(ctx, "pgoutbox-poll-listen") }, channel, r.log)
	}
	s.stopClean = pr.startCleanup()
	r.log.Info("poll source started", zap.String("table", t.Name), zap.Int("buckets", r.cfg.Poll.Buckets),
		zap.Bool("notify", r.cfg.Poll.Notify), zap.String("on_publish", r.cfg.Poll.OnPublish), zap.Uint32("pid", conn.PgConn().PID()))
	r.obs.SessionStarted(0)
	err = s.loop()
	s.finish(err)
	if errors.Is(err, errStopped) || errors.Is(err, errNewProducer) {
		r.obs.SessionEnded(nil)
	} else {
		r.obs.SessionEnded(err)
	}
	return true, err
}

// loadRecord makes the record table if it is missing and reads the record
// of the table last checked under the name (poll.Table.LoadRecord), which
// Replaced then compares with. A record table this role may not make or
// read is returned as unrecorded (the relay goes on, saying so).
func (pr *pollRunner) loadRecord(ctx context.Context, conn *pgx.Conn) (unrecorded, err error) {
	t := pr.table
	if err := t.EnsureRecordTable(ctx, conn); errors.Is(err, poll.ErrUnrecorded) {
		return err, nil
	} else if err != nil {
		return nil, err
	}
	rec, err := t.LoadRecord(ctx, conn)
	if errors.Is(err, poll.ErrUnrecorded) {
		return err, nil
	}
	if err != nil {
		return nil, err
	}
	if rec.Elsewhere {
		pr.r.log.Warn("the record of the poll table checked last was made in another cluster or database (a restored copy, pg_upgrade, a database made from a template), whose table OIDs say nothing here: a table renamed away there is not looked for; relaying the table the name names",
			zap.String("table", t.Name), zap.Uint32("recorded_oid", rec.OID), zap.Time("checked_at", rec.CheckedAt))
	}
	return nil, nil
}

// tableReplaced is what the relay does when the table's name no longer
// names the table a session checked. Renamed away or moved to another
// schema with rows not published, it stops: a session follows the name
// and would leave them for good, and only the user can say whether to
// move them into the new table or relay the old one. Dropped, what it held
// unpublished is gone with it, by the dropper's hand; the relay cannot
// count it, and stopping would bring nothing back but stop the events
// written since: it goes on with the table the name names (if any, else
// Check stops it), saying so at Error. Renamed with every row published,
// nothing is lost: it goes on, with a warning. It returns the error that
// stops the relay, if it must stop.
func (pr *pollRunner) tableReplaced(re *poll.ReplacedError) error {
	switch {
	case re.Unpublished != 0:
		return &FatalError{Err: re}
	case re.Within:
		pr.r.log.Warn("the poll table was made a partition or child of the table its name names now, whose claims read its rows; relaying that table",
			zap.String("table", pr.table.Name), zap.String("old_table", re.Old), zap.Error(re))
	case re.Old == "":
		pr.r.log.Error("the poll table was dropped under the relay: any unpublished rows it held are gone with it, never relayed; relaying the table its name names now",
			zap.String("table", pr.table.Name), zap.Error(re))
	default:
		pr.r.log.Warn("the poll table was renamed or moved away with every row published; relaying the table its name names now",
			zap.String("table", pr.table.Name), zap.String("old_table", re.Old), zap.Error(re))
	}
	return nil
}

// batchLimit is the most rows one claim takes.
func (pr *pollRunner) batchLimit() int {
	return min(pr.r.cfg.Poll.BatchSize, pr.r.cfg.Relay.MaxInFlightRecords)
}

// op is a context for one statement: it ends on a second signal, and at
// the end of the stop's budget once a stop was requested, or after
// relay.shutdown.timeout otherwise (a server that stopped answering).
func (s *pollSession) op() (context.Context, context.CancelFunc) {
	by := s.r.clock.Now().Add(s.r.cfg.Relay.ShutdownTimeout)
	if s.pub.stopping && s.pub.stopBy.Before(by) {
		by = s.pub.stopBy
	}
	return context.WithDeadline(s.sqlCtx, by)
}

// loop claims and publishes until a stop (errStopped, always between
// claims) or a failure.
func (s *pollSession) loop() error {
	r, pr := s.r, s.pr
	limit := pr.batchLimit()
	for {
		if s.ctx.Err() != nil {
			return errStopped
		}
		now := r.clock.Now()
		if !now.Before(s.nextRebal) {
			if err := s.rebalance(); err != nil {
				return err
			}
		}
		if s.members.Count() == 0 {
			if err := s.idle(); err != nil {
				return err
			}
			continue
		}
		ctx, cancel := s.op()
		b, err := s.claimer.Claim(ctx, s.members.Owned(), pr.blockedKeys(now), limit, r.cfg.Relay.MaxInFlightBytes)
		cancel()
		if tl := (*poll.RowTooLargeError)(nil); errors.As(err, &tl) {
			return &FatalError{Err: fmt.Errorf("relay: %w (a cap set by %s): %s", err, pr.rowCap.How, tooLargeAdvice(tl.Size, "the claim was rolled back"))}
		}
		if err != nil {
			return err
		}
		// Rows held behind a skipped row of their key (another
		// transaction locks it) leave room: their keys wait a moment and
		// the next claim goes on with the others. A claim cut at the
		// in-flight bytes cap left rows too.
		full := len(b.Rows)+b.Held == limit || b.LateRows || b.Cut
		// Large rows: the server sends every row a claim locks, and those
		// past the cap are read for nothing; the next claims lock about as
		// many as were kept, growing back (doubling) once rows are small.
		if b.Cut {
			limit = max(len(b.Rows)+b.Held, 1)
		} else {
			limit = min(limit*2, pr.batchLimit())
		}
		// Counted now: process ends the batch, which lets go of its rows.
		claimed := len(b.Rows)
		pr.holdKeys(b, r.clock.Now())
		if err := s.process(b); err != nil {
			return err
		}
		// A claim went through one record per request: once the rows the
		// broker refused in a batch are published or dead-lettered (by
		// this claim, an earlier one, or another instance that took their
		// buckets), the next session batches again.
		if pr.single() && claimed > 0 {
			ctx, cancel := s.op()
			left, err := pr.table.Unpublished(ctx, s.conn, pr.refusedSeqs)
			cancel()
			if err != nil {
				return err
			}
			if pr.refusedSeqs = left; !pr.single() {
				r.log.Info("the rows Kafka refused in a batch are published or dead-lettered: sending records in batches again", zap.String("table", pr.table.Name))
				return errNewProducer
			}
		}
		if !full {
			if err := s.idle(); err != nil {
				return err
			}
		}
	}
}

// rebalance gives up or takes buckets.
func (s *pollSession) rebalance() error {
	ctx, cancel := s.op()
	defer cancel()
	o, err := s.members.Rebalance(ctx)
	s.nextRebal = s.r.clock.Now().Add(s.r.cfg.Poll.RebalanceInterval)
	if errors.Is(err, poll.ErrDestinationMismatch) {
		// Not fatal: in a rolling update that changes the destination, the
		// new instances wait for the old ones to leave, and then claim.
		// The session ends, leaving the group, and the next joins again.
		return fmt.Errorf("%w: %w", errWaitingForOthers, err)
	}
	if errors.Is(err, poll.ErrBucketsMismatch) || errors.Is(err, poll.ErrNotOwnSession) {
		return &FatalError{Err: err}
	}
	if err != nil {
		return err
	}
	s.warnMembers(o)
	// Every RebalanceInterval also: the table is still the one checked.
	if err := s.pr.table.Recheck(ctx, s.conn); err != nil {
		var re *poll.ReplacedError
		switch {
		case errors.Is(err, poll.ErrLayout):
			return &FatalError{Err: err}
		case errors.As(err, &re) && re.Unpublished != 0:
			return s.pr.tableReplaced(re)
		}
		// Replaced otherwise: the next session says what became of the
		// old table, and checks the one the name names.
		return err
	}
	if len(o.Gained) > 0 || len(o.Released) > 0 || o.Members != s.own.Members {
		s.r.log.Info("buckets rebalanced", zap.String("table", s.pr.table.Name), zap.Int("instances", o.Members),
			zap.Int("owned", len(o.Owned)), zap.Int("target", o.Target), zap.Ints("gained", o.Gained), zap.Ints("released", o.Released))
	}
	s.own = o
	return nil
}

// warnMembers warns, once per instance, of the other instances on the
// table whose destination this one cannot check (an earlier version's,
// or another fingerprint format's, during a rolling upgrade: accepted),
// or that publish elsewhere and joined later (left out of the shares;
// they stop at their own rebalance).
func (s *pollSession) warnMembers(o poll.Ownership) {
	pr := s.pr
	// The instances of now only: PIDs of those gone do not pile up.
	warned := map[uint32]bool{}
	for _, pid := range o.Unknown {
		warned[pid] = true
		if !pr.membersWarned[pid] {
			s.r.log.Warn("another instance on the poll table shows no destination fingerprint this version can read (an earlier version, or another fingerprint format, as in a rolling upgrade): counted as a member sending where this one does, unchecked; if it sends to another Kafka cluster or topics, the table's events are split between the two. Upgrade it, or check its kafka.brokers and router settings",
				zap.String("table", pr.table.Name), zap.Uint32("pid", pid))
		}
	}
	for _, f := range o.Foreign {
		warned[f.PID] = true
		if !pr.membersWarned[f.PID] {
			s.r.log.Error("another instance joined the poll table publishing to "+f.What()+" than this one: it stops before it claims (this one joined first), and is left out of the buckets' shares; give every instance on the table the same kafka.brokers and router settings",
				zap.String("table", pr.table.Name), zap.Uint32("pid", f.PID), zap.String("application_name", f.ApplicationName))
		}
	}
	pr.membersWarned = warned
}

// idle waits for a notification, the poll interval, the next rebalance or
// the next retry of a blocked key, whichever comes first, or a stop.
func (s *pollSession) idle() error {
	r := s.r
	now := r.clock.Now()
	until := now.Add(r.cfg.Poll.Interval)
	if s.nextRebal.Before(until) {
		until = s.nextRebal
	}
	for _, at := range s.pr.blocked {
		if at.Before(until) {
			until = at
		}
	}
	s.report(PollProgress{Committed: true})
	var wake <-chan struct{}
	if s.listener != nil {
		wake = s.listener.Wake()
	}
	t := r.clock.NewTimer(until.Sub(now))
	defer t.Stop()
	select {
	case <-wake:
	case <-t.C():
	case <-s.ctx.Done():
	case <-r.force:
		return errForced
	case res := <-s.pub.checker.Results():
		s.pub.noteTopic(res)
	}
	return nil
}

// heldKeyWait is how long a key whose earliest unpublished row another
// transaction locks waits before a claim tries it again.
const heldKeyWait = time.Second

// holdKeys blocks the keys a claim held back (poll.Batch.HeldKeys) for
// heldKeyWait, and says so at most once a minute.
func (pr *pollRunner) holdKeys(b *poll.Batch, now time.Time) {
	if len(b.HeldKeys) == 0 {
		return
	}
	for _, k := range b.HeldKeys {
		if at, ok := pr.blocked[k]; !ok || at.Before(now.Add(heldKeyWait)) {
			pr.blocked[k] = now.Add(heldKeyWait)
		}
	}
	if now.Sub(pr.heldWarned) >= time.Minute {
		pr.heldWarned = now
		pr.r.log.Warn("unpublished outbox rows are locked by another transaction (SELECT ... FOR UPDATE, an UPDATE of the row): the later rows of their keys wait for them, to keep each key's order",
			zap.String("table", pr.table.Name), zap.Int("keys", len(b.HeldKeys)), zap.Int("rows_waiting", b.Held),
			zap.Strings("some_keys", b.HeldKeys[:min(len(b.HeldKeys), 5)]))
	}
}

// blockedKeys forgets the keys whose retry is due and returns the others.
func (pr *pollRunner) blockedKeys(now time.Time) []string {
	var out []string
	for k, at := range pr.blocked {
		if !now.Before(at) {
			delete(pr.blocked, k)
			continue
		}
		out = append(out, k)
	}
	return out
}

// process publishes a claimed batch and records the outcome: rows Kafka
// acknowledged are marked published; rows that cannot be published count
// an attempt, and past poll.max.attempts follow relay.poison.policy; the
// rest stay as they were. A failure Kafka may recover from rolls the batch
// back, since what it acknowledged after the failure may lie after a gap. A
// row refused for a partition or topic the producer's metadata may not know
// yet stays as it was, once, and the session ends for a new producer.
func (s *pollSession) process(b *poll.Batch) error {
	r, pr := s.r, s.pr
	if len(b.Rows) == 0 {
		return s.finishBatch(b, nil, nil, 0)
	}
	// Every row of a batch has the claim's row description.
	ctx, cancel := s.op()
	types, mods, err := queryRouterTypes(ctx, s.conn, &s.userTypes, b.Rows[0].Types, b.Rows[0].Mods)
	cancel()
	if err != nil {
		s.abort(b)
		return fmt.Errorf("relay: poll %s: %w", pr.table.Name, err)
	}
	rows := make([]pubRow, 0, len(b.Rows))
	var bytes int64
	for i := range b.Rows {
		row := &b.Rows[i]
		size := int64(recordOverhead)
		for _, v := range row.Values {
			size += int64(len(v))
		}
		// The in-flight bytes cap: the rest of the batch waits for the
		// next claim (a prefix, so every key keeps its order).
		if bytes += size; bytes > r.cfg.Relay.MaxInFlightBytes && len(rows) > 0 {
			break
		}
		rows = append(rows, pubRow{
			row:   router.Row{Table: pr.table.Name, Op: router.OpInsert, Names: row.Names, Types: types, Mods: mods, Values: row.Values},
			key:   row.Key,
			stamp: row.Written * 1000,
			where: fmt.Sprintf("row seq %d of %s", row.Seq, pr.table.Name),
		})
	}
	res, err := s.pub.publish(rows)
	if err != nil {
		var pe *ProduceError
		refused := errors.As(err, &pe) && len(s.pub.refused) > 0
		if refused {
			for _, i := range s.pub.refused {
				pr.refusedSeqs = append(pr.refusedSeqs, b.Rows[i].Seq)
			}
		}
		s.abort(b) // lets go of b.Rows
		if refused {
			r.log.Warn("Kafka refused a whole batch for one of its records (too large for the topic, a timestamp out of its range, ...); sending records one per produce request until the rows it refused are published or dead-lettered, so that only a record refused on its own is poison",
				zap.String("table", pr.table.Name), zap.Int64s("refused_seqs", pr.refusedSeqs[:min(len(pr.refusedSeqs), 10)]), zap.Int("refused_rows", len(pr.refusedSeqs)))
		}
		return err
	}
	var published []int
	var failed []poll.Failure
	var dead []int
	var fatal error
	stale := false
	now := r.clock.Now()
	for i := range res {
		row := &b.Rows[i]
		retried := pr.staleRetried[row.Seq]
		switch res[i].outcome {
		case rowPublished:
			published = append(published, i)
			delete(pr.staleRetried, row.Seq)
		case rowPoison:
			if kafka.MayBeStaleMetadata(res[i].err) && !retried {
				// Neither published nor failed: the next session's
				// claim takes it again. The later rows of its key were
				// held.
				pr.staleRetried[row.Seq], stale = true, true
				r.log.Warn("Kafka refused a record for a partition or topic the producer's metadata lacks, which may be out of date (a partition added since, a leader moving): starting a new producer, with fresh metadata, before counting an attempt; refused again, the attempt counts",
					zap.ByteString("event_id", res[i].rec.EventID), zap.Int64("seq", row.Seq), zap.String("topic", res[i].rec.Topic), zap.Error(res[i].err))
				continue
			}
			attempts := row.Attempts + 1
			f := poll.Failure{Index: i, Err: res[i].err.Error()}
			switch {
			case attempts < r.cfg.Poll.MaxAttempts:
				retry := r.cfg.Poll.Backoff(attempts)
				pr.blocked[string(row.Key)] = now.Add(retry)
				r.log.Warn("a row cannot be published; trying it again later, and no later row of its key meanwhile",
					zap.ByteString("event_id", res[i].rec.EventID), zap.Int64("seq", row.Seq), zap.ByteString("key", row.Key),
					zap.Int("attempt", attempts), zap.Int("max_attempts", r.cfg.Poll.MaxAttempts), zap.Duration("retry_in", retry), zap.Error(res[i].err))
			case r.cfg.Relay.PoisonPolicy == "dead-letter":
				dead = append(dead, len(failed))
				delete(pr.staleRetried, row.Seq)
			default:
				if fatal == nil {
					fatal = &FatalError{Err: fmt.Errorf("relay: %w (event %s, key %q, after %d of poll.max.attempts=%d attempts; poison.policy=fail: stopping, no later row of its key was published)",
						res[i].err, res[i].rec.EventID, row.Key, attempts, r.cfg.Poll.MaxAttempts)}
				}
			}
			failed = append(failed, f)
		}
	}
	if len(dead) > 0 {
		if err := s.deadLetter(b, rows, res, failed, dead); err != nil {
			// Kafka acknowledged the published rows, and the dead-letter
			// records delivered, with nothing in flight since: recorded,
			// a restart does not send them again.
			if ferr := s.finishBatch(b, published, failed, len(rows)); ferr != nil {
				r.log.Error("could not mark the rows Kafka acknowledged as published, after a dead-letter record was not delivered: they are sent again",
					zap.String("table", pr.table.Name), zap.Int("rows", len(published)), zap.Error(ferr))
			}
			return err
		}
	}
	if err := s.finishBatch(b, published, failed, len(rows)); err != nil {
		return err
	}
	if fatal == nil && stale {
		return errNewProducer
	}
	return fatal
}

// deadLetter produces the dead-letter records of the failures at dead
// (indexes into failed) and marks them dead-lettered. Each is cut to what
// the dead-letter topic takes and sent alone (deliverDeadLetter), so that a
// refusal is its own, never a batch's to send again: the dead-letter topic
// refusing it stops the relay (a FatalError
// naming the event and both topics; the failure's reason says so too).
// Sent with others, a record the topic refused failed the whole batch,
// which was taken for one to resend: the claim rolled back, and the
// session started again, sending its other rows again, without end.
func (s *pollSession) deadLetter(b *poll.Batch, rows []pubRow, res []rowResult, failed []poll.Failure, dead []int) error {
	for _, k := range dead {
		i := failed[k].Index
		row := &b.Rows[i]
		rec := s.pub.deadLetterRecord(&rows[i], &res[i], row.Seq, row.Attempts+1)
		s.r.log.Warn("dead-lettering a row that cannot be published", zap.ByteString("event_id", res[i].rec.EventID),
			zap.Int64("seq", row.Seq), zap.Int("attempts", row.Attempts+1), zap.Error(res[i].err))
		refused, err := s.pub.deliverDeadLetter(&rec, rows[i].stamp, res[i].rec.Topic)
		if err != nil {
			return err
		}
		if refused != nil {
			failed[k].Err += "; the dead-letter topic refuses its record: " + refused.Error()
			return &FatalError{Err: fmt.Errorf("relay: dead-letter topic %q refuses the dead-letter record of event %s (%s, meant for topic %q): %w (poison.policy=dead-letter: stopping; the row stays unpublished, and no later row of its key is published)",
				rec.Topic, res[i].rec.EventID, rows[i].where, res[i].rec.Topic, refused)}
		}
		failed[k].DeadLettered = true
		s.r.obs.DeadLettered(s.r.deadLetteredAs(res[i].rec.Topic))
	}
	return nil
}

// finishBatch records a batch's outcome and commits.
func (s *pollSession) finishBatch(b *poll.Batch, published []int, failed []poll.Failure, claimed int) error {
	ctx, cancel := s.op()
	defer cancel()
	if err := b.Finish(ctx, published, failed); err != nil {
		return err
	}
	s.report(PollProgress{Claimed: claimed, Published: len(published), Failed: len(failed), Committed: true})
	return nil
}

// abort rolls a batch back (a failure on the way: its rows are claimed again).
func (s *pollSession) abort(b *poll.Batch) {
	ctx, cancel := context.WithTimeout(s.sqlCtx, 5*time.Second)
	defer cancel()
	if err := b.Abort(ctx); err != nil {
		s.r.log.Debug("roll back a claim", zap.Error(err))
	}
}

// report tells a PollObserver where the session is: at every commit, at
// most every second otherwise.
func (s *pollSession) report(p PollProgress) {
	po, ok := s.r.obs.(PollObserver)
	if !ok {
		return
	}
	now := s.r.clock.Now()
	if !p.Committed && now.Sub(s.lastReport) < time.Second {
		return
	}
	s.lastReport = now
	p.Table, p.Members, p.Owned, p.Buckets = s.pr.table.Name, s.own.Members, s.members.Count(), s.r.cfg.Poll.Buckets
	po.PollProgress(p)
}

// finish stops the session's helpers in order: the producer first (what
// it still delivers must be done before another instance may own these
// buckets), then the listener, the cleanup and the topic checker; the
// claim connection, whose end releases the buckets, is closed by the
// caller last.
func (s *pollSession) finish(cause error) {
	r := s.r
	lim := r.cfg.Relay
	stopBy := s.pub.stopBy
	if !s.pub.stopping {
		stopBy = r.clock.Now().Add(lim.ShutdownTimeout)
	}
	stopCtx := s.ctx
	if !s.pub.stopping && s.ctx.Err() == nil && !errors.Is(cause, errForced) {
		stopCtx = context.WithoutCancel(s.ctx)
	}
	r.closeProducer(stopCtx, s.pub.prod, stopBy)
	if s.listener != nil {
		s.listener.Stop()
	}
	s.stopClean()
	s.pub.checker.Stop()
	s.stopSQL()
	<-s.watchDone
	r.log.Info("poll session ended", zap.String("table", s.pr.table.Name), zap.NamedError("cause", cause))
}

// startCleanup starts the relay's cleanup of published rows older than
// poll.retention, every poll.cleanup.interval, on a connection of its own;
// of several instances one cleans up at a time. It returns the function
// that stops it and waits for it.
func (pr *pollRunner) startCleanup() (stop func()) {
	cfg := pr.r.cfg.Poll
	if cfg.Retention <= 0 || cfg.OnPublish != poll.OnPublishMark {
		return func() {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		pr.cleanup(ctx)
	}()
	return func() {
		cancel()
		wg.Wait()
	}
}

func (pr *pollRunner) cleanup(ctx context.Context) {
	r, cfg := pr.r, pr.r.cfg.Poll
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			closeConn(conn)
		}
	}()
	t := time.NewTicker(cfg.CleanupInterval)
	defer t.Stop()
	po, _ := r.obs.(PollObserver)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if conn == nil {
			c, err := pr.connect(ctx, "pgoutbox-poll-cleanup")
			if err != nil {
				r.log.Debug("cleanup: connect", zap.Error(err))
				continue
			}
			conn = c
		}
		n, err := pr.cleanupOnce(ctx, conn)
		if err != nil {
			if ctx.Err() == nil {
				r.log.Warn("cleanup of published rows failed; trying again at the next interval", zap.String("table", pr.table.Name), zap.Error(err))
			}
			closeConn(conn)
			conn = nil
			continue
		}
		if n > 0 {
			r.log.Info("deleted published rows older than poll.retention", zap.String("table", pr.table.Name), zap.Int64("rows", n), zap.Duration("retention", cfg.Retention))
			if po != nil {
				po.CleanedUp(n)
			}
		}
	}
}

// cleanupOnce deletes what is due, unless another instance is at it.
func (pr *pollRunner) cleanupOnce(ctx context.Context, conn *pgx.Conn) (int64, error) {
	cfg := pr.r.cfg.Poll
	ok, err := poll.TryLockCleanup(ctx, conn, pr.table.Name)
	if err != nil || !ok {
		return 0, err
	}
	defer func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_ = poll.UnlockCleanup(uctx, conn, pr.table.Name)
		cancel()
	}()
	if held, err := pr.cleanupHeld(ctx, conn); err != nil || held {
		return 0, err
	}
	return poll.DefaultCleanup(cfg.CleanupBatchSize).Published(ctx, conn, pr.table, cfg.Retention)
}

// cleanupHeld says whether another slot's cleanup hold covers the table
// (replication.SharedCleanupHolds), warning once of each new one. A WAL
// slot on the same table (the one handed over to this source, a region's
// slot) whose hold stands has rows of its gap in this table still to be
// relayed from it, and they may well be marked published already by this
// relay: deleting them by published_at would lose them for that slot's
// destination. pgoutbox cleanup refuses then too. Without a state table
// no hold is recorded anywhere, and none is checked.
func (pr *pollRunner) cleanupHeld(ctx context.Context, conn *pgx.Conn) (bool, error) {
	st := pr.r.cfg.Postgres.StateTable
	if st == "" {
		return false, nil
	}
	holds, err := replication.SharedCleanupHolds(ctx, conn, st, "", []string{pr.table.Name})
	if pe := (*pgconn.PgError)(nil); errors.As(err, &pe) && pe.Code == "42501" {
		// The poll source needs no state table: a role that may not read
		// another team's is not stopped by it (nor was it before).
		if !pr.holdsUnreadable {
			pr.holdsUnreadable = true
			pr.r.log.Warn("the cleanup holds of WAL slots on the table are not checked: the relay's role may not read the state table",
				zap.String("table", pr.table.Name), zap.String("state_table", st), zap.Error(err),
				zap.String("fix", "GRANT SELECT ON "+st+" to the relay's role"))
		}
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read other slots' cleanup holds on %s from %s (the relay's role needs SELECT on it), so nothing was deleted: %w", pr.table.Name, st, err)
	}
	now := make(map[replication.SharedHold]bool, len(holds))
	for _, h := range holds {
		now[h] = true
		if pr.holdsWarned[h] {
			continue
		}
		pr.r.log.Warn("cleanup of published rows is held by another slot's cleanup hold: its gap's rows are in this table, to be relayed from it, and deleting them would lose them; nothing is deleted until the hold is released. Relay those events from the outbox table, then run pgoutbox cleanup --release-hold=ID with that slot's configuration (relay.source: wal)",
			zap.String("table", pr.table.Name), zap.String("slot", h.Slot), zap.String("hold", h.Hold), zap.String("why", h.Why),
			zap.String("release", fmt.Sprintf("pgoutbox cleanup --release-hold=%s with postgres.slot.name: %s", h.ID(), h.Slot)))
	}
	if len(now) == 0 && len(pr.holdsWarned) > 0 {
		pr.r.log.Info("the cleanup holds of other slots on the table are released: cleanup of published rows resumes", zap.String("table", pr.table.Name))
	}
	pr.holdsWarned = now
	return len(holds) > 0, nil
}
