package relay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"go.uber.org/zap"

	"github.com/pgoutbox/pgoutbox/poll"
	"github.com/pgoutbox/pgoutbox/replication"
	"github.com/pgoutbox/pgoutbox/router"
)

// The WAL source's initial snapshot (snapshot.mode: initial, Debezium's
// name): when the slot does not exist yet, publish the rows the outbox
// tables hold before streaming from it. A temporary slot is created with
// an exported snapshot (replication.CreateSnapshotSlot); the tables are
// read in that snapshot and their rows published, every one acknowledged;
// then the permanent slot is made, which starts at the snapshot's
// consistent point: the snapshot has every transaction committed before
// it, the slot every one after it. A relay that stops before that leaves
// no slot, and the next start takes a new snapshot (at-least-once: what
// it had sent is sent again, with the same ids). What only WAL held after
// the first attempt's consistent point (rows deleted by their own
// transaction, table-less messages) is in no later snapshot: before it
// publishes a row, the first attempt copies its temporary slot into a
// permanent anchor slot (replication.AnchorSlot), the permanent slot is
// made as a copy of the anchor, whichever attempt finishes, and the anchor
// is dropped then. A later attempt's slot starts at the first one's point:
// what was committed in between is in its snapshot and the slot, sent
// twice with the same ids.
//
// With snapshot.rows: unpublished only the rows with published_at NULL are
// published: the move from the poll source, whose relays must be stopped
// first (the snapshot waits while one runs, and keeps new ones from
// claiming while it reads).

// runSnapshot takes the initial snapshot if it is due, retrying with the
// relay's backoff what a retry can cure.
func (r *Relay) runSnapshot(ctx context.Context) error {
	backoff := r.cfg.Relay.RestartBackoff
	started := false
	// Kept across attempts while they live: the temporary slot and its
	// snapshot (a new one would start later, and what only WAL held in
	// between, table-less messages and rows deleted by their own
	// transaction, would be in neither), and the connection holding the
	// snapshot lock (released, another instance or pgoutbox migrate could
	// make the slot, starting after the snapshot, meanwhile).
	var held snapshotHeld
	defer held.release(ctx)
	for {
		// While the snapshot runs or waits for the poll relays to stop,
		// the instance counts as available for a rolling update
		// (/rolloutz), as a standby does: otherwise a rollout that moves a
		// stream from the poll source would wait for this pod while the
		// pod waits for the old poll pods it would stop, and a long
		// snapshot would fail helm's --wait. A failed attempt ends it
		// (SessionEnded, in the loop below), and a session's start too.
		r.obs.StandingBy(nil)
		err := r.initialSnapshot(ctx, &started, &held)
		var fe *FatalError
		switch {
		case err == nil, ctx.Err() != nil:
			return nil
		case errors.As(err, &fe):
			return err
		case !started && !errors.Is(err, errWaitingForOthers):
			// As for a first session: a server that cannot be reached or
			// refuses us is reported at once.
			return &StartupError{Err: err}
		}
		wait := jitter(backoff)
		if !errors.Is(err, errWaitingForOthers) {
			r.obs.SessionEnded(err)
		}
		r.log.Warn("initial snapshot not taken; trying again", zap.Error(err), zap.Duration("backoff", wait))
		if !r.sleep(ctx, wait) {
			return nil
		}
		backoff = min(2*backoff, r.cfg.Relay.RestartBackoffMax)
	}
}

// snapshotHeld is what runSnapshot keeps across attempts.
type snapshotHeld struct {
	snap *replication.SnapshotSlot
	lock *pgx.Conn
	// publishedAt, when not 0: every row was acknowledged, and only making
	// the slot from the anchor there is left.
	publishedAt replication.LSN
	// sinceAnchor goes with snap: by table, the event ids of its rows the
	// slot streams from the anchor at sinceAnchorAt (insertedSinceAnchor),
	// which it does not publish.
	sinceAnchor   map[string]map[string]bool
	sinceAnchorAt replication.LSN
}

func (h *snapshotHeld) release(ctx context.Context) {
	h.dropSnap(ctx)
	if h.lock != nil {
		closeConn(h.lock)
		h.lock = nil
	}
}

// dropFinishedAnchor drops the anchor slot an initial snapshot left when
// it stopped between making the slot and dropping it: the slot, made as
// its copy, is where the anchor is. An anchor elsewhere kept the start of
// a snapshot that did not finish, and the slot was made by something else
// since, starting later (pgoutbox migrate, another tool; the snapshot
// itself stops on that, and a supervisor starts it again): streaming from
// it would skip what was committed in between, so that stops, saying to
// drop the slot, and the next snapshot makes it from the anchor. Only if
// a pgoutbox session streamed from the slot since (the state row names
// its instance) is the slot taken as it is, with an error, and the
// anchor, which holds WAL back, left for the operator.
func (r *Relay) dropFinishedAnchor(ctx context.Context, conn *pgx.Conn, start replication.Start) error {
	name := replication.AnchorSlot(r.cfg.Postgres.Slot)
	anchor, err := replication.ReadSlot(ctx, conn, name)
	if errors.Is(err, replication.ErrSlotMissing) {
		return nil
	}
	if err != nil {
		return err
	}
	slot := start.Slot
	if slot.ConfirmedFlushLSN == anchor.ConfirmedFlushLSN {
		if err := replication.DropSlot(ctx, conn, name); err != nil {
			return err
		}
		r.log.Info("initial snapshot: dropped its anchor slot, left by a stop after the slot was made", zap.String("anchor_slot", name))
		return nil
	}
	if !start.HadState || start.State.Instance == "" {
		if sc := r.cfg.Postgres.StateTable; sc != "" && !start.HadState {
			// Prepare recorded the slot it found: a slot the operator is
			// told to drop, which no pgoutbox session streamed from. Kept,
			// the row would make the next start take the dropped slot for
			// one lost, and refuse the snapshot that recovers everything.
			if st, ok, err := replication.ReadState(ctx, conn, sc, r.cfg.Postgres.Slot); err == nil && ok && st.Instance == "" {
				if err := replication.DeleteState(ctx, conn, sc, r.cfg.Postgres.Slot); err != nil {
					r.log.Warn("cannot remove the state row recorded for the slot made meanwhile: remove it when you drop the slot", zap.Error(err))
				}
			}
		}
		return &FatalError{Err: fmt.Errorf("relay: slot %q exists at %s, but slot %q still keeps %s, where an initial snapshot that did not finish started: the slot was made by something else meanwhile (pgoutbox migrate, another tool), and streaming from it would skip what was committed in between; drop slot %q (SELECT pg_drop_replication_slot('%s')), and its row in the state table if an earlier version recorded one, and start again: the snapshot is published again and the slot made where the anchor is (duplicates with the same event ids, nothing lost)",
			r.cfg.Postgres.Slot, slot.ConfirmedFlushLSN, name, anchor.ConfirmedFlushLSN, r.cfg.Postgres.Slot, r.cfg.Postgres.Slot)}
	}
	r.log.Error("initial snapshot: the slot exists and pgoutbox has streamed from it, but an anchor slot still keeps where an initial snapshot that did not finish started: if the slot was made by anything other than pgoutbox's snapshot, the transactions between the two positions were never relayed; once checked, drop the anchor slot, which holds WAL back",
		zap.String("slot", r.cfg.Postgres.Slot), zap.Stringer("slot_lsn", slot.ConfirmedFlushLSN),
		zap.String("anchor_slot", name), zap.Stringer("anchor_lsn", anchor.ConfirmedFlushLSN), zap.String("last_instance", start.State.Instance))
	return nil
}

// dropSnap closes the kept temporary slot (and its snapshot), if any.
func (h *snapshotHeld) dropSnap(ctx context.Context) {
	if h.snap != nil {
		h.snap.Close(ctx)
		h.snap = nil
	}
	h.sinceAnchor, h.sinceAnchorAt = nil, 0
}

// initialSnapshot publishes the outbox tables' rows and creates the slot,
// unless the slot exists. started is set once it began publishing. held
// keeps the snapshot lock's connection and the temporary slot and
// snapshot of an earlier attempt, used again while they live, and left
// there for the next attempt when this one fails.
func (r *Relay) initialSnapshot(ctx context.Context, started *bool, held *snapshotHeld) error {
	pc := r.cfg.Postgres
	if held.lock != nil && held.lock.IsClosed() {
		held.lock = nil
	}
	if held.lock == nil {
		// One instance at a time: the others find the slot made.
		lock, err := replication.ConnectSQL(ctx, pc, "pgoutbox-snapshot-lock", pc.ConnectTimeout)
		if err != nil {
			return err
		}
		if _, err := lock.Exec(ctx, "SELECT pg_advisory_lock(hashtext($1))", replication.SnapshotLock(pc.Slot)); err != nil {
			closeConn(lock)
			return fmt.Errorf("relay: lock the initial snapshot of slot %q: %w", pc.Slot, err)
		}
		held.lock = lock
	}
	conn, err := replication.ConnectSQL(ctx, pc, "pgoutbox-snapshot", pc.ConnectTimeout)
	if err != nil {
		return err
	}
	defer closeConn(conn)
	// The server, the publication (created when missing: it must exist
	// before the slot's first change is decoded), the catalog and the
	// slot's history, without creating the slot.
	check := pc
	check.CreateSlot = false
	start, err := replication.Prepare(ctx, check, r.log)
	var ve *replication.VanishedError
	awaited := errors.As(err, &ve) && ve.State.AwaitingSnapshot != ""
	switch {
	case err == nil:
		// The slot exists: streaming goes on from it.
		return r.dropFinishedAnchor(ctx, conn, start)
	case awaited && pc.CreateSlot:
		// Handed over to the poll source, or recreated by migrate
		// --recreate-slot for this snapshot: its state row awaits it.
		r.log.Info("the slot is missing on purpose, left to the initial snapshot", zap.String("slot", pc.Slot), zap.String("why", ve.State.AwaitingSnapshot))
	case errors.As(err, &ve):
		return &FatalError{Err: fmt.Errorf("%w; with snapshot.mode: initial, pgoutbox migrate --recreate-slot with this configuration records the gap and leaves the slot to the next start, whose snapshot publishes the rows the outbox tables hold (snapshot.rows: %s) before it makes the slot", err, r.cfg.Snapshot.Rows)}
	case !errors.Is(err, replication.ErrSlotMissing):
		return r.prepareError(err)
	case !pc.CreateSlot:
		return &FatalError{Err: err}
	}
	for _, table := range pc.QualifiedTables() {
		if err := r.checkQueriedTable(ctx, conn, table); err != nil {
			return err
		}
	}
	if r.cfg.Snapshot.Rows == SnapshotRowsUnpublished {
		if err := r.keepPollRelaysOut(ctx, conn); err != nil {
			return err
		}
	}
	r.log.Info("slot missing: publishing the rows the outbox tables hold, then streaming (snapshot.mode=initial)",
		zap.String("slot", pc.Slot), zap.String("rows", r.cfg.Snapshot.Rows))
	// The anchor keeps the first attempt's consistent point: the slot
	// starts there, whichever snapshot this attempt publishes.
	anchorName := replication.AnchorSlot(pc.Slot)
	anchor, err := replication.ReadSlot(ctx, conn, anchorName)
	hasAnchor := err == nil
	if !hasAnchor || anchor.ConfirmedFlushLSN != held.publishedAt {
		// Another anchor than the one this process published against.
		held.publishedAt = 0
	}
	switch {
	case err != nil && !errors.Is(err, replication.ErrSlotMissing):
		return err
	case hasAnchor && (anchor.WALStatus == "lost" || anchor.InvalidationReason != ""):
		return &FatalError{Err: fmt.Errorf("relay: slot %q, which keeps where an unfinished initial snapshot of slot %q started (%s), was invalidated by PostgreSQL (%s): what only WAL held since then (rows deleted by their own transaction, table-less messages) is gone; drop it (SELECT pg_drop_replication_slot('%s')) to take a new snapshot, which relays every row the tables hold",
			anchorName, pc.Slot, anchor.ConfirmedFlushLSN, cmp.Or(anchor.InvalidationReason, "wal_status lost"), anchorName)}
	case hasAnchor && anchor.Active:
		return fmt.Errorf("relay: slot %q, which keeps where an unfinished initial snapshot of slot %q started, is in use by PID %d: stop what streams from it", anchorName, pc.Slot, anchor.ActivePID)
	case held.publishedAt != 0:
		// Every row is in Kafka, and the anchor kept the slot's start: an
		// earlier attempt failed only to make the slot. Publishing again,
		// from a new snapshot, would put what only WAL held since the
		// anchor after later events of its keys.
	case hasAnchor && held.snap == nil:
		r.log.Warn("initial snapshot: an earlier attempt did not finish; the slot will start where it started, which its anchor slot kept, and a new snapshot publishes the rows committed before that point (those the earlier attempt sent are sent again, with the same event ids); the rows committed since come from the slot, in commit order",
			zap.String("slot", pc.Slot), zap.String("anchor_slot", anchorName), zap.Stringer("anchor_lsn", anchor.ConfirmedFlushLSN))
	}
	if !hasAnchor && *started {
		r.log.Error("initial snapshot: the anchor slot an earlier attempt made is gone (dropped by someone): this attempt starts from a new point, and what only WAL held since the first one (rows deleted by their own transaction, table-less messages) is not relayed",
			zap.String("slot", pc.Slot), zap.String("anchor_slot", anchorName))
	}
	n := 0
	if held.publishedAt == 0 {
		if n, err = r.publishAnchored(ctx, conn, held, started, hasAnchor, &anchor, anchorName); err != nil || ctx.Err() != nil {
			return err // stopped: no slot, the next start begins again
		}
	}
	if r.persistFault != nil {
		if err := r.persistFault(); err != nil {
			return err
		}
	}
	if held.lock == nil || held.lock.IsClosed() || held.lock.Ping(ctx) != nil {
		// The snapshot lock went with its connection: another instance may
		// be taking the snapshot over, and only the holder makes the slot.
		// The next attempt takes the lock again, and finds the slot made
		// or makes it.
		return fmt.Errorf("relay: initial snapshot of slot %q: the snapshot lock's connection ended before the slot was made; trying again", pc.Slot)
	}
	st, err := replication.Persist(ctx, conn, anchorName, anchor.ConfirmedFlushLSN, pc.Slot)
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42710" { // duplicate_object
		if cur, rerr := replication.ReadSlot(ctx, conn, pc.Slot); rerr == nil && cur.ConfirmedFlushLSN == anchor.ConfirmedFlushLSN {
			// Made from the same anchor, by another instance that held
			// the snapshot lock while this one's connection had lost it:
			// the next attempt finds it and streams from it (or waits as
			// the standby). Not something else's slot.
			return fmt.Errorf("relay: slot %q was made meanwhile from this snapshot's anchor by another pgoutbox instance's initial snapshot: streaming from it", pc.Slot)
		}
		// Made by something that did not wait for the snapshot (another
		// tool, an earlier pgoutbox migrate): it starts after the
		// snapshot's consistent point, and what was committed in between
		// is in neither. Streaming from it would skip that: never.
		return &FatalError{Err: fmt.Errorf("relay: slot %q was created by something else while the initial snapshot was read (its %d rows are published): the transactions committed between the snapshot's consistent point %s and that slot's creation are in neither; drop that slot and start again (the snapshot is published again: duplicates with the same event ids, nothing lost): %w",
			pc.Slot, n, anchor.ConfirmedFlushLSN, err)}
	}
	if err != nil {
		return err
	}
	if err := replication.DropSlot(ctx, conn, anchorName); err != nil {
		// The next attempt finds the slot made, and drops it then.
		return err
	}
	r.log.Info("initial snapshot published; the slot starts where it ends", zap.String("slot", pc.Slot), zap.Int("rows", n),
		zap.Stringer("consistent_point", st.ConfirmedFlushLSN))
	return nil
}

// publishAnchored publishes the rows in the kept snapshot, or in a new one
// (with the anchor made from its slot when there is none yet), and closes
// the temporary slot once every row is acknowledged.
func (r *Relay) publishAnchored(ctx context.Context, conn *pgx.Conn, held *snapshotHeld, started *bool, hasAnchor bool, anchor *replication.SlotState, anchorName string) (int, error) {
	pc := r.cfg.Postgres
	if held.snap != nil && !held.snap.Alive() {
		held.dropSnap(ctx)
	}
	if held.snap != nil && held.sinceAnchor != nil && (!hasAnchor || anchor.ConfirmedFlushLSN != held.sinceAnchorAt) {
		// Its rows were left out for the slot to stream from an anchor
		// that is gone (dropped by someone) or another: a slot made from
		// the anchor made now would start elsewhere, past rows left out.
		// A new snapshot, judged against the anchor there is.
		r.log.Warn("initial snapshot: the anchor slot changed since this snapshot was taken; taking a new one",
			zap.String("slot", pc.Slot), zap.String("anchor_slot", anchorName), zap.Stringer("was", held.sinceAnchorAt))
		held.dropSnap(ctx)
	}
	snap := held.snap
	if snap != nil {
		r.log.Info("initial snapshot: publishing again in the same snapshot (its rows sent already are sent again, with the same event ids)",
			zap.String("slot", pc.Slot), zap.Stringer("consistent_point", snap.ConsistentPoint))
	} else {
		var err error
		if snap, err = replication.CreateSnapshotSlot(ctx, pc); err != nil {
			return 0, err
		}
		held.snap = snap
		if r.exportedHook != nil {
			r.exportedHook()
		}
		if hasAnchor {
			// A new snapshot after an earlier one's: what was committed
			// since the anchor comes from the slot, which starts there.
			held.sinceAnchor = r.insertedSinceAnchor(ctx, conn, anchorName, anchor.ConfirmedFlushLSN, snap.ConsistentPoint)
			held.sinceAnchorAt = anchor.ConfirmedFlushLSN
		}
	}
	if !hasAnchor {
		// Before a row is published: a stop before this publishes
		// nothing.
		a, err := snap.Anchor(ctx, conn, anchorName)
		if err != nil {
			return 0, err
		}
		*anchor = a
	}
	*started = true
	n, err := r.publishSnapshot(ctx, conn, snap.Snapshot, held.sinceAnchor)
	if errors.Is(err, errSnapshotGone) || errors.Is(err, errSnapshotRewritten) {
		// The server ended the replication connection, or a table was
		// rewritten since the snapshot: the next attempt needs a new one.
		held.dropSnap(ctx)
	}
	if err != nil || ctx.Err() != nil {
		return n, err
	}
	// Every row is in Kafka: the temporary slot and its snapshot are done
	// with, and the anchor keeps the position. Closed first, so that the
	// snapshot needs no more slots than before the anchor: two. A retry
	// that only has the slot to make does not publish again.
	held.publishedAt = anchor.ConfirmedFlushLSN
	held.dropSnap(ctx)
	return n, nil
}

// insertedSinceAnchor returns, by table, the event ids of the rows the
// anchor slot decodes between its position (from) and a new snapshot's
// consistent point (upto): rows committed after the first attempt's
// snapshot, which the new one sees too. The slot, made from the anchor,
// streams them after the rows committed before, with the events only WAL
// held in between (rows deleted by their own transaction, table-less
// messages); published from the new snapshot as well, one would reach
// Kafka before such an event of its key that was committed earlier.
//
// A snapshot row is left out by its event id only where the id column has
// a unique index on it alone (else a row committed before the anchor could
// share an id with one after, and be left out unsent). A table without
// one, a gap of more than sinceAnchorMaxWAL of WAL (the ids are held in
// memory), or a peek that fails (a column renamed in the gap, say) keeps
// the earlier behaviour for that table or all, said at Error: the rows of
// the gap are published from the new snapshot too, nothing lost, and a
// key's event only WAL held may follow a later row of its own.
func (r *Relay) insertedSinceAnchor(ctx context.Context, conn *pgx.Conn, anchor string, from, upto replication.LSN) map[string]map[string]bool {
	if upto <= from {
		return nil
	}
	pc := r.cfg.Postgres
	degrade := func(why string, err error, table string) {
		r.log.Error("initial snapshot: started over from a new snapshot, and "+why+", so the rows committed since the first attempt's point are published from the new snapshot and again from the slot (the same event ids, nothing lost): a key with an event only WAL held since (a row deleted by its own transaction, a table-less message) may get it after a later event of its own",
			zap.String("table", table), zap.Stringer("anchor_lsn", from), zap.Stringer("snapshot_lsn", upto), zap.Error(err))
	}
	if gap := uint64(upto - from); gap > sinceAnchorMaxWAL {
		degrade(fmt.Sprintf("the %d MB of WAL in between are more than pgoutbox reads to tell those rows (%d MB)", gap>>20, sinceAnchorMaxWAL>>20), nil, "")
		return nil
	}
	if err := replication.WaitFlushed(ctx, conn, upto, handoverFlushWait, nil); err != nil {
		degrade("the WAL in between could not be read", err, "")
		return nil
	}
	r.log.Info("initial snapshot: reading the WAL since the first attempt's point, for the rows the slot will stream",
		zap.String("anchor_slot", anchor), zap.Stringer("from", from), zap.Stringer("to", upto))
	out := map[string]map[string]bool{}
	for _, table := range pc.QualifiedTables() {
		_, id := r.cfg.columnsOf(table)
		t, err := poll.NewTable(table, "", "")
		if err != nil {
			degrade("the table's name could not be read", err, table)
			continue
		}
		var unique bool
		if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
			WHERE i.indrelid = to_regclass($1) AND i.indisunique AND i.indisvalid AND i.indnkeyatts = 1 AND i.indpred IS NULL AND a.attname = $2)`,
			t.Quoted(), id).Scan(&unique); err != nil {
			degrade("the table's unique indexes could not be read", err, table)
			continue
		}
		if !unique {
			degrade(fmt.Sprintf("the event id column %q has no unique index of its own", id), nil, table)
			continue
		}
		p, err := replication.PeekPending(ctx, conn, anchor, pc.Publication, table, id, "", upto)
		if err != nil {
			degrade("the WAL in between could not be read", err, table)
			continue
		}
		set := make(map[string]bool, len(p.Inserts))
		for _, v := range p.Inserts {
			set[v] = true
		}
		out[table] = set
	}
	return out
}

// sinceAnchorMaxWAL bounds the WAL insertedSinceAnchor reads (and the ids
// it holds): a gap between two attempts longer than this is published
// twice instead.
const sinceAnchorMaxWAL = 1 << 30

// errSnapshotGone: the exported snapshot can no longer be imported (its
// replication connection ended).
var errSnapshotGone = errors.New("the exported snapshot is gone")

// keepPollRelaysOut waits while poll relays run on the outbox tables, then
// holds every bucket lock of each, on conn, until conn closes: no poll
// relay can claim a row while the snapshot is read and published.
func (r *Relay) keepPollRelaysOut(ctx context.Context, conn *pgx.Conn) error {
	for _, table := range r.cfg.Postgres.QualifiedTables() {
		ms, err := poll.Members(ctx, conn, table)
		if err != nil {
			return err
		}
		if len(ms) > 0 {
			return fmt.Errorf("%w: %d poll relays still run on %s (PID %d, ...): stop them first (SIGTERM); the initial snapshot publishes what they left unpublished",
				errWaitingForOthers, len(ms), table, ms[0].PID)
		}
		ok, err := poll.LockAll(ctx, conn, table, r.cfg.Poll.Buckets)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("%w: a poll relay holds buckets of %s", errWaitingForOthers, table)
		}
	}
	return nil
}

// publishSnapshot reads every outbox table in the snapshot and publishes
// its rows, a batch at a time, each acknowledged before the next is read.
func (r *Relay) publishSnapshot(ctx context.Context, conn *pgx.Conn, snapshot string, sinceAnchor map[string]map[string]bool) (int, error) {
	if err := r.checkDeadLetterTopic(ctx); err != nil {
		return 0, err
	}
	kcfg := r.cfg.Kafka
	kcfg.AckBuffer = r.cfg.Snapshot.BatchSize + 1
	// The snapshot is at least once in either mode: each batch is
	// acknowledged before the next is read, and a crash sends the snapshot
	// again. A transactional id would make the producer refuse every
	// record sent outside a transaction.
	kcfg.ExactlyOnce, kcfg.TransactionalID = false, ""
	prod, err := r.be.NewProducer(ctx, kcfg)
	if err != nil {
		return 0, err
	}
	pub := &rowPublisher{r: r, prod: prod, checker: r.be.StartTopicChecker(r.cfg.Kafka, func() {}), ctx: ctx}
	defer func() {
		by := pub.stopBy
		if !pub.stopping {
			by = r.clock.Now().Add(r.cfg.Relay.ShutdownTimeout)
		}
		r.closeProducer(context.WithoutCancel(ctx), prod, by)
		pub.checker.Stop()
	}()
	// A fetch reads each row whole: one longer than the process has the
	// memory for stops the snapshot (publishTable) before it is read,
	// instead of getting the process OOM-killed at every start.
	rowCap := r.cfg.Postgres.MessageCap()
	conn.PgConn().Frontend().SetMaxBodyLen(rowCap.Bytes)
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return 0, fmt.Errorf("relay: initial snapshot: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // read only
	if _, err := tx.Exec(ctx, "SET TRANSACTION SNAPSHOT "+quoteLiteral(snapshot)); err != nil {
		return 0, fmt.Errorf("relay: initial snapshot: use snapshot %s: %w: %w", snapshot, errSnapshotGone, err)
	}
	if err := r.lockUnrewritten(ctx, tx); err != nil {
		return 0, err
	}
	total := 0
	for _, table := range r.cfg.Postgres.QualifiedTables() {
		n, err := r.publishTable(ctx, tx, pub, table, sinceAnchor[table], rowCap)
		total += n
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// errSnapshotRewritten: an outbox table was rewritten (ALTER TABLE that
// rewrites, TRUNCATE, VACUUM FULL, CLUSTER) after the snapshot was
// exported, and the snapshot would read it as it is not.
var errSnapshotRewritten = errors.New("an outbox table was rewritten after the snapshot was taken")

// lockUnrewritten locks the outbox tables (and so their partitions) in tx,
// whose snapshot was exported earlier, against rewrites until tx ends, and
// then makes sure none was rewritten since the export. PostgreSQL keeps no
// old snapshot working across a table rewrite: a table rewritten after the
// export reads as empty in it (TRUNCATE and the rewriting forms of ALTER
// TABLE are not MVCC-safe), and the rewrite is no insert the slot decodes,
// so its rows would be in neither. A relation's file node as the snapshot
// sees pg_class against the one in use now tells: different, and the
// snapshot is dropped and a new one taken (the anchor keeps where the slot
// starts). A table is locked when its cursor opens in any case; locking
// them all first closes the window before the later tables' turn.
func (r *Relay) lockUnrewritten(ctx context.Context, tx pgx.Tx) error {
	tables := r.cfg.Postgres.QualifiedTables()
	if len(tables) == 0 {
		return nil
	}
	quoted := make([]string, 0, len(tables))
	for _, table := range tables {
		t, err := poll.NewTable(table, "", "")
		if err != nil {
			return err
		}
		quoted = append(quoted, t.Quoted())
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE "+strings.Join(quoted, ", ")+" IN ACCESS SHARE MODE"); err != nil {
		return fmt.Errorf("relay: initial snapshot: lock the outbox tables: %w", err)
	}
	var rewritten []string
	err := tx.QueryRow(ctx, `SELECT coalesce(array_agg(c.oid::regclass::text ORDER BY 1), '{}') FROM pg_class c
		WHERE c.oid IN (SELECT r.oid FROM unnest($1::regclass[]) AS r(oid)
				UNION SELECT t.relid FROM unnest($1::regclass[]) AS r(oid), pg_partition_tree(r.oid) AS t)
			AND c.relfilenode <> 0 AND c.relfilenode IS DISTINCT FROM pg_relation_filenode(c.oid)`, quoted).Scan(&rewritten)
	if err != nil {
		return fmt.Errorf("relay: initial snapshot: compare the outbox tables with the snapshot: %w", err)
	}
	if len(rewritten) > 0 {
		return fmt.Errorf("relay: initial snapshot: %s rewritten (ALTER TABLE, TRUNCATE, VACUUM FULL or CLUSTER) since the snapshot was taken, which would read as empty: taking a new snapshot (the slot still starts where the first one did): %w",
			strings.Join(rewritten, ", "), errSnapshotRewritten)
	}
	return nil
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// publishTable publishes one table's rows through a cursor, in sequence
// order (or created_at order, or as stored, whichever the table allows).
// Rows whose event id is in skip (the slot streams them: see
// insertedSinceAnchor) are left out. rowCap is the cap its connection
// reads rows with, for the stop on a longer row.
func (r *Relay) publishTable(ctx context.Context, tx pgx.Tx, pub *rowPublisher, table string, skip map[string]bool, rowCap replication.MessageCap) (int, error) {
	cols, err := poll.Columns(ctx, tx.Conn(), table)
	if err != nil {
		return 0, err
	}
	t, err := poll.NewTable(table, "", "")
	if err != nil {
		return 0, err
	}
	sql := "SELECT * FROM " + t.Quoted()
	if r.cfg.Snapshot.Rows == SnapshotRowsUnpublished {
		if !slices.Contains(cols, poll.ColumnPublishedAt) {
			return 0, &FatalError{Err: fmt.Errorf("relay: snapshot.rows=unpublished, but %s has no %s column", table, poll.ColumnPublishedAt)}
		}
		sql += " WHERE " + poll.ColumnPublishedAt + " IS NULL"
	}
	switch {
	case slices.Contains(cols, poll.ColumnSeq):
		sql += " ORDER BY " + poll.ColumnSeq
	case slices.Contains(cols, poll.ColumnCreatedAt):
		// created_at is its transaction's start (now()), the same for all
		// of its rows: sorted on it alone, which is no stable sort, one
		// transaction's rows of a key came out in any order. The row's
		// place in the table breaks the tie, which is the order written
		// only roughly (not across partitions, nor where vacuum's free
		// space put a later row on an earlier page; see the README); the
		// commit time, when the server keeps it, orders transactions as
		// they committed, not as they began.
		order := poll.ColumnCreatedAt + ", ctid"
		var commitTS string
		if err := tx.QueryRow(ctx, "SELECT current_setting('track_commit_timestamp')").Scan(&commitTS); err != nil {
			return 0, fmt.Errorf("relay: initial snapshot of %s: %w", table, err)
		}
		if commitTS == "on" {
			order = "pg_xact_commit_timestamp(xmin) NULLS FIRST, " + order
		} else {
			r.log.Warn("initial snapshot: the table has no seq column and the server does not keep commit times (track_commit_timestamp), so its rows are published in the order their transactions began: a key written by two transactions at once may come out in the other order",
				zap.String("table", table))
		}
		sql += " ORDER BY " + order
	default:
		sql += " ORDER BY ctid"
	}
	if _, err := tx.Exec(ctx, "DECLARE pgoutbox_snapshot NO SCROLL CURSOR FOR "+sql); err != nil {
		return 0, fmt.Errorf("relay: initial snapshot of %s: %w", table, err)
	}
	defer tx.Exec(context.WithoutCancel(ctx), "CLOSE pgoutbox_snapshot") //nolint:errcheck // the transaction ends anyway
	key, id := r.cfg.columnsOf(table)
	skipped := 0
	if len(skip) > 0 {
		defer func() {
			r.log.Info("initial snapshot: rows committed since the anchor's position left to the slot, which streams them in commit order",
				zap.String("table", table), zap.Int("rows", skipped))
		}()
	}
	// A fetch's rows are all read into memory: with large rows, the
	// snapshot's batch of them whole could take more than the process
	// has (a 1000-row fetch of 900 KB events, 900 MB). The first fetch
	// takes one row, and each next about as many as the last fetch's rows
	// on average fit relay.max.inflight.bytes, at most twice the last
	// count and at most snapshot.batch.size.
	n := 1
	total := 0
	var userTypes map[uint32]replication.UserType
	for {
		if ctx.Err() != nil {
			return total, nil
		}
		fetch := "FETCH " + strconv.Itoa(n) + " FROM pgoutbox_snapshot"
		rows, err := r.fetchRows(ctx, tx, fetch, table, key, &userTypes)
		if tl := (*pgproto3.ExceededMaxBodyLenErr)(nil); errors.As(err, &tl) {
			return total, &FatalError{Err: fmt.Errorf("relay: initial snapshot of %s: the row after the %d published (in the snapshot's order) is %d bytes, more than the %d bytes pgoutbox reads in one row (a cap set by %s): %s",
				table, total, tl.ActualBodyLen, tl.MaxExpectedBodyLen, rowCap.How, tooLargeAdvice(tl.ActualBodyLen, "the slot is not made"))}
		}
		if err != nil {
			return total, fmt.Errorf("relay: initial snapshot of %s: %w", table, err)
		}
		r.obs.StandingBy(nil) // still at work (runSnapshot)
		if len(rows) == 0 {
			return total, nil
		}
		n = nextFetch(n, rows, r.cfg.Relay.MaxInFlightBytes, r.cfg.Snapshot.BatchSize)
		if idAt := slices.Index(rows[0].row.Names, id); len(skip) > 0 && idAt >= 0 {
			kept := rows[:0]
			for _, row := range rows {
				if v := row.row.Values[idAt]; v != nil && skip[string(v)] {
					skipped++
					continue
				}
				kept = append(kept, row)
			}
			if rows = kept; len(rows) == 0 {
				continue
			}
		}
		for i := range rows {
			rows[i].where = fmt.Sprintf("snapshot row %d of %s", total+i+1, table)
		}
		if err := r.publishSnapshotBatch(pub, rows); err != nil {
			return total, err
		}
		total += len(rows)
	}
}

// nextFetch is how many rows the snapshot's next fetch takes, after a
// fetch of n that read rows: about as many as fit budget bytes at their
// average size, at least 1, at most 2n and limit.
func nextFetch(n int, rows []pubRow, budget int64, limit int) int {
	var bytes int64
	for i := range rows {
		for _, v := range rows[i].row.Values {
			bytes += int64(len(v))
		}
	}
	fit := budget * int64(len(rows)) / max(bytes, 1)
	return int(max(1, min(fit, int64(2*n), int64(limit))))
}

// fetchRows reads the next rows of the cursor as router rows (text values);
// userTypes caches the user types of the row description.
// The key column is found among the result's columns, which are the
// table's as it is now (a column dropped after the snapshot was exported
// is not among them, though the snapshot's pg_attribute has it).
func (r *Relay) fetchRows(ctx context.Context, tx pgx.Tx, fetch, table, key string, userTypes *map[uint32]replication.UserType) ([]pubRow, error) {
	res, err := tx.Query(ctx, fetch, pgx.QueryResultFormats{pgx.TextFormatCode})
	if err != nil {
		return nil, err
	}
	defer res.Close()
	fds := res.FieldDescriptions()
	names, types, mods := make([]string, len(fds)), make([]uint32, len(fds)), make([]int32, len(fds))
	for i, f := range fds {
		names[i], types[i], mods[i] = f.Name, f.DataTypeOID, f.TypeModifier
	}
	keyAt := slices.Index(names, key)
	var out []pubRow
	for res.Next() {
		raw := res.RawValues()
		vals := make([][]byte, len(raw))
		for i, v := range raw {
			if v != nil {
				vals[i] = append([]byte{}, v...)
			}
		}
		p := pubRow{row: router.Row{Table: table, Op: router.OpInsert, Names: names, Types: types, Mods: mods, Values: vals}}
		if keyAt >= 0 && keyAt < len(vals) {
			p.key = vals[keyAt]
		}
		out = append(out, p)
	}
	res.Close()
	if err := res.Err(); err != nil || len(out) == 0 {
		return out, err
	}
	rt, rm, err := queryRouterTypes(ctx, tx, userTypes, types, mods)
	if err != nil {
		return nil, err
	}
	for i := range out {
		out[i].row.Types, out[i].row.Mods = rt, rm
	}
	return out, nil
}

// queryRouterTypes returns the types and type modifiers of a query's row
// description (where a domain is already its base type) the router takes:
// a user type whose Connect value pgoutbox does not reproduce becomes
// router.NotReproducedType. It reads the user types it does not know
// into *cache.
func queryRouterTypes(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, cache *map[uint32]replication.UserType, types []uint32, mods []int32) ([]uint32, []int32, error) {
	m, err := replication.ReadUserTypes(ctx, q, types, *cache)
	*cache = m
	if err != nil {
		return nil, nil, err
	}
	if rt, rm, _ := replication.RouterTypes(m, types, mods); rt != nil {
		return rt, rm, nil
	}
	return types, mods, nil
}

// publishSnapshotBatch publishes rows: poison follows relay.poison.policy
// at once (a snapshot row has no attempts to count); a row held behind a
// poison row of its key is published after it is dead-lettered, in order.
func (r *Relay) publishSnapshotBatch(pub *rowPublisher, rows []pubRow) error {
	for len(rows) > 0 {
		res, err := pub.publish(rows)
		if err != nil {
			return err
		}
		var dead []router.Record
		var from []string // the topic each dead-letter record's event was meant for
		var rest []pubRow
		for i := range res {
			switch res[i].outcome {
			case rowPoison:
				if r.cfg.Relay.PoisonPolicy != "dead-letter" {
					return &FatalError{Err: fmt.Errorf("relay: %w (poison.policy=fail: stopping before the slot exists; the next start takes a new snapshot)", res[i].err)}
				}
				r.log.Warn("dead-lettering a snapshot row that cannot be published", zap.ByteString("event_id", res[i].rec.EventID), zap.Error(res[i].err))
				dead = append(dead, pub.deadLetterRecord(&rows[i], &res[i], 0, 1))
				from = append(from, res[i].rec.Topic)
				r.obs.DeadLettered(r.deadLetteredAs(res[i].rec.Topic))
			case rowHeld:
				rest = append(rest, rows[i])
			}
		}
		// Cut to what the dead-letter topic takes, and each alone: sent
		// together, one the topic refused failed them all as a batch to
		// resend, and the snapshot started again, and again.
		for i := range dead {
			refused, err := pub.deliverDeadLetter(&dead[i], 0, from[i])
			if err != nil {
				return err
			}
			if refused != nil {
				return &FatalError{Err: fmt.Errorf("relay: dead-letter topic %q refuses the dead-letter record of event %s (meant for topic %q): %w (poison.policy=dead-letter: stopping before the slot exists; the next start takes a new snapshot)",
					dead[i].Topic, dead[i].EventID, from[i], refused)}
			}
		}
		rows = rest
		if pub.stopping && len(rows) > 0 {
			return errStopTimeout
		}
	}
	return nil
}
