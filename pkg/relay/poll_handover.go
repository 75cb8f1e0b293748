package relay

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"

	"github.com/pgoutbox/pgoutbox/poll"
	"github.com/pgoutbox/pgoutbox/replication"
)

// handoverFlushWait bounds the wait for the WAL a handover reads to be
// flushed: asynchronous commits are flushed by the WAL writer within three
// wal_writer_delay (at most 10 s each).
const handoverFlushWait = time.Minute

// handover takes over from a WAL-source relay (poll.handover.slot) before
// anything is claimed: every unpublished row its slot relayed is marked
// published, then the slot is dropped.
//
// A row was relayed when its transaction committed before the slot's
// confirmed position; the slot's pending changes are exactly the others.
// In one repeatable-read transaction: read the WAL insert position L (past
// the commit of every transaction the snapshot sees), wait until WAL is
// flushed up to L (the peek decodes no further), peek at the slot's
// changes up to L (without consuming them), and mark published every
// unpublished row the snapshot sees but the peek does not name. Rows
// committed later are invisible to the transaction and stay unpublished.
// The slot is dropped only when rows carry everything it has not relayed:
// pending messages, inserts into tables this relay does not read, and
// inserts whose rows are gone stop the handover (fatal) and keep the slot.
// Doing it again is harmless while the slot exists and nobody consumes
// it, so instances starting together need no more than a lock to take
// turns; the first one drops the slot, and the others find nothing to do.
func (pr *pollRunner) handover(ctx context.Context, conn *pgx.Conn) error {
	r, t := pr.r, pr.table
	slot := r.cfg.Poll.HandoverSlot
	if slot == "" {
		return pr.walSlotLeft(ctx, conn)
	}
	if err := poll.LockHandover(ctx, conn, t.Name); err != nil {
		return err
	}
	defer func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_ = poll.UnlockHandover(uctx, conn, t.Name)
		cancel()
	}()
	st, err := replication.ReadSlot(ctx, conn, slot)
	if errors.Is(err, replication.ErrSlotMissing) {
		r.log.Info("poll.handover.slot does not exist (any more): nothing to take over from it", zap.String("slot", slot))
		return nil
	}
	if err != nil {
		return err
	}
	if st.Active {
		return fmt.Errorf("%w: a WAL relay still streams from slot %q (walsender PID %d); stop it (SIGTERM), and this relay takes over", errWaitingForOthers, slot, st.ActivePID)
	}
	state, err := pr.slotJudged(ctx, conn, st)
	if err != nil {
		return err
	}
	recorded := state.Publication
	// The peek sees the pending inserts only through a publication that
	// carries every one of them: through any other (missing, which
	// PostgreSQL 18 only warns about; without the table; not publishing
	// inserts; filtering rows) it names fewer, and every row it does not
	// name would be marked published without ever being relayed. The WAL
	// relay's own (its state row names it) carried them as it streamed;
	// another must have carried the table since before anything the slot
	// still holds, since decoding judges each change by the publication
	// as it was then: one that took the table in later (as the refusal
	// below advises) shows none of the inserts before.
	pcfg := r.cfg.Postgres
	if recorded != "" && recorded != pcfg.Publication {
		r.log.Info("handover: reading the slot's pending changes through the publication the WAL relay streamed through",
			zap.String("slot", slot), zap.String("publication", recorded), zap.String("postgres.publication.name", pcfg.Publication))
		pcfg.Publication = recorded
	}
	pcfg.Tables = []string{t.Name}
	cat, err := replication.ReadCatalog(ctx, conn, pcfg)
	if err != nil {
		return fmt.Errorf("relay: handover from slot %q: %w", slot, err)
	}
	if p := cat.Problems(pcfg); len(p) > 0 {
		which := "postgres.publication.name: set it to the WAL relay's"
		if recorded != "" {
			which = "the WAL relay's, as its state row records it: it changed since; run the WAL relay, which stops and says how to go on"
		}
		return &FatalError{Err: fmt.Errorf("relay: handover from slot %q reads its pending inserts through publication %q (%s), which cannot show them all, so rows it relayed cannot be told from rows it did not: %w",
			slot, pcfg.Publication, which, &replication.CatalogError{Publication: pcfg.Publication, Problems: p, Err: replication.ErrCatalogUnusable})}
	}
	if recorded == "" {
		ok, why, err := replication.CarriedAllAlong(ctx, conn, slot, pcfg.Publication, t.Name)
		if err != nil {
			return fmt.Errorf("relay: handover from slot %q: %w", slot, err)
		}
		if !ok {
			return &FatalError{Err: fmt.Errorf("relay: handover from slot %q reads its pending inserts through publication %q, and %s: decoding judges each change by the publication as it was then, so the inserts before would not be named, and would be marked published without being relayed; nothing was marked: set postgres.publication.name to the WAL relay's publication, or run the WAL relay until it has relayed everything and stop it",
				slot, pcfg.Publication, why)}
		}
	}
	walRelayed, known, err := pr.walTables(ctx, conn, slot)
	if err != nil {
		return err
	}
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		return fmt.Errorf("relay: handover from slot %q: %w", slot, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
	var upto int64
	if err := tx.QueryRow(ctx, "SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint").Scan(&upto); err != nil {
		return fmt.Errorf("relay: handover from slot %q: %w", slot, err)
	}
	lsn := replication.LSN(upto)
	// The peek decodes flushed WAL only, and a commit made with
	// synchronous_commit=off is visible before it is flushed: without the
	// wait its rows would be seen, not named, and marked.
	waiting := func(flushed replication.LSN) {
		r.log.Info("handover: waiting for the server to flush its WAL (commits made with synchronous_commit=off are visible before that, and the slot shows them only after)",
			zap.String("slot", slot), zap.Stringer("upto", lsn), zap.Stringer("flushed", flushed))
	}
	if err := replication.WaitFlushed(ctx, tx, lsn, handoverFlushWait, waiting); err != nil {
		return fmt.Errorf("relay: handover from slot %q: %w", slot, err)
	}
	// The messages the WAL relay relayed are those with its prefix, which
	// its state row records; this relay's messages.prefix need not be it.
	prefix := r.cfg.Messages.Prefix
	if state.MessagesRecorded {
		if state.MessagesPrefix != prefix {
			r.log.Info("handover: counting the slot's pending messages with the messages.prefix the WAL relay relayed them with",
				zap.String("slot", slot), zap.String("prefix", state.MessagesPrefix), zap.String("messages.prefix", prefix))
		}
		prefix = state.MessagesPrefix
	}
	pending, err := replication.PeekPending(ctx, tx, slot, pcfg.Publication, t.Name, t.IDColumn, prefix, lsn)
	if err != nil {
		return err
	}
	// What the slot holds that no row can carry would go with the slot.
	if pending.Messages > 0 {
		return &FatalError{Err: fmt.Errorf("relay: handover from slot %q: the slot holds %d logical decoding messages with prefix %q that it has not relayed (the first at %s); a poll relay reads rows, so they would be dropped with the slot: have writers stop emitting them, run the WAL relay until it has relayed them, stop it and start again; nothing was marked",
			slot, pending.Messages, prefix, pending.FirstMessage)}
	}
	if len(pending.OtherMessages) > 0 {
		// Without a record of the WAL relay's prefix, a message with
		// another one than this relay's may be one it would have relayed
		// (a poll configuration keeps the default prefix).
		if !state.MessagesRecorded {
			return &FatalError{Err: fmt.Errorf("relay: handover from slot %q: the slot holds logical decoding messages it has not relayed with prefixes other than %q (messages.prefix): %s; no state row records the WAL relay's messages.prefix, and messages with it would be dropped with the slot (a poll relay reads rows); nothing was marked: start the WAL relay once and stop it (it records its prefix in postgres.state.table), or set messages.prefix to the WAL relay's; if messages with it are among these, have writers stop emitting them and run the WAL relay until it has relayed them first",
				slot, prefix, replication.OtherPrefixes(pending.OtherMessages))}
		}
		r.log.Info("handover: the slot holds messages with prefixes the WAL relay did not relay (its messages.prefix, as its state row records it, is another); they go with the slot",
			zap.String("slot", slot), zap.String("prefix", prefix), zap.String("other_prefixes", replication.OtherPrefixes(pending.OtherMessages)))
	}
	pending.Others = pr.unrelayedElsewhere(slot, pending.Others, walRelayed, known, cat.AllTables)
	if len(pending.Others) > 0 {
		return &FatalError{Err: fmt.Errorf("relay: handover from slot %q: the slot holds inserts it has not relayed into tables this poll relay does not read: %s; a poll relay reads %s only, and they would be dropped with the slot: run the WAL relay until it has relayed them (or take those tables out of publication %q if they are not outbox tables), stop it and start again; nothing was marked",
			slot, replication.OtherTables(pending.Others), t.Name, pcfg.Publication)}
	}
	n, err := poll.MarkRelayed(ctx, tx, t, pending.Inserts)
	if err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("relay: handover from slot %q: %w", slot, err)
	}
	// Inserts the slot has not relayed whose rows are gone (a writer that
	// deletes in the same transaction) cannot be relayed by reading rows.
	// (Asked outside the snapshot: a row committed after it but before the
	// WAL position is there, and stays unpublished.)
	gone, err := poll.Unrelayable(ctx, conn, t, pending.Inserts)
	if err != nil {
		return err
	}
	if len(gone) > 0 {
		return &FatalError{Err: fmt.Errorf("relay: handover from slot %q: the slot holds %d inserts into %s that it has not relayed whose rows are gone (deleted in the same transaction, as writers do in the delete-after-insert mode), e.g. id %s; a poll relay reads rows, so they would be dropped with the slot: switch writers to keep their rows, run the WAL relay until it has relayed them, stop it and start again (the rows the slot had relayed are marked published already)",
			slot, len(gone), t.Name, strings.Join(gone[:min(len(gone), 3)], ", "))}
	}
	r.log.Info("took over from the WAL source: marked the rows its slot relayed as published",
		zap.String("slot", slot), zap.String("slot_confirmed_lsn", st.ConfirmedFlushLSN.String()), zap.Int64("rows_marked", n),
		zap.Int("rows_left_to_poll", len(pending.Inserts)), zap.Stringer("upto", lsn))
	marked, err := pr.dropHandedOver(ctx, conn, slot, state.Publication)
	if err != nil {
		return err
	}
	r.log.Info("dropped the WAL source's slot", zap.String("slot", slot), zap.Bool("state_row_awaits_snapshot", marked))
	return nil
}

// dropHandedOver drops the slot a handover is done with, and, in the same
// transaction, makes its state row a placeholder saying it was handed
// over (replication.AwaitSnapshot): a later WAL-source start with that
// slot name then takes it for one to be made by its initial snapshot
// (snapshot.mode: initial, which publishes the rows the poll relays left
// unpublished) and refuses to start without one, instead of taking the
// slot for lost (the row kept) or making a new one that skips those rows
// (no row). Without the state table (or its awaiting_snapshot column,
// which this role may not add) the row is left as it is: the WAL source
// refuses the slot as vanished then. marked says the row was made so.
func (pr *pollRunner) dropHandedOver(ctx context.Context, conn *pgx.Conn, slot, publication string) (marked bool, err error) {
	r, table := pr.r, pr.r.cfg.Postgres.StateTable
	var id replication.ServerIdentity
	if table != "" {
		exists, err := replication.StateTableExists(ctx, conn, table)
		if err != nil {
			return false, fmt.Errorf("relay: handover done: %w", err)
		}
		if !exists {
			table = ""
		} else {
			// (Adds the column where this role may.)
			if err := replication.EnsureStateTable(ctx, conn, table); err != nil {
				return false, fmt.Errorf("relay: handover done: %w", err)
			}
			if id, err = replication.ReadServerIdentity(ctx, conn); err != nil {
				return false, fmt.Errorf("relay: handover done: %w", err)
			}
		}
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("relay: handover done; drop slot %q: %w", slot, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
	if table != "" {
		sp, err := tx.Begin(ctx)
		if err != nil {
			return false, fmt.Errorf("relay: handover done; drop slot %q: %w", slot, err)
		}
		why := fmt.Sprintf("handed over to the poll source by a poll relay's handover (poll.handover.slot) at %s", time.Now().UTC().Format(time.RFC3339))
		err = replication.AwaitSnapshot(ctx, sp, table, slot, id, publication, why)
		switch {
		case err == nil:
			if err := sp.Commit(ctx); err != nil {
				return false, fmt.Errorf("relay: handover done; drop slot %q: %w", slot, err)
			}
			marked = true
		case replication.UndefinedColumn(err):
			_ = sp.Rollback(ctx)
			r.log.Warn("handover: the state table has no awaiting_snapshot column, and this role may not add it: its row for the slot stays, and a WAL source started again on this slot name takes it for lost; run pgoutbox migrate with the WAL source as the table's owner, then pgoutbox migrate --recreate-slot with snapshot.mode: initial",
				zap.String("slot", slot), zap.String("state_table", table))
		default:
			return false, fmt.Errorf("relay: handover done; slot %q kept: %w", slot, err)
		}
	}
	// pg_drop_replication_slot is not undone by a rollback; the row's
	// placeholder is, if the drop fails.
	if _, err := tx.Exec(ctx, "SELECT pg_drop_replication_slot($1)", slot); err != nil {
		return false, fmt.Errorf("relay: handover done; drop slot %q: %w (drop it yourself: it keeps WAL)", slot, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return false, fmt.Errorf("relay: handover done, slot %q dropped; record it in %s: %w (a WAL source started on this slot name takes it for lost)", slot, table, err)
	}
	return marked, nil
}

// walSlotLeft refuses a start without poll.handover.slot while a slot
// whose state row says a WAL relay relayed this table to the same Kafka
// cluster still exists: the events only it holds (rows their own
// transaction deleted, rows written while no relay read it, table-less
// messages) would never reach Kafka from the poll source, without a word
// (a prober lost 20 of 50 events so), and the slot would keep WAL for
// ever; or, for a WAL relay still streaming, every event would go out
// twice. A slot of another Kafka cluster is another deployment's (a
// region's); one whose row records no destination (an earlier version's)
// gets a warning, as does a role that may not read the state table (the
// poll source needs none).
func (pr *pollRunner) walSlotLeft(ctx context.Context, conn *pgx.Conn) error {
	r, t := pr.r, pr.table
	table := r.cfg.Postgres.StateTable
	if table == "" {
		return nil
	}
	others, err := replication.OtherSlots(ctx, conn, table, "", []string{t.Name})
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42501" { // insufficient_privilege
		r.log.Warn("the poll source cannot read the state table to see whether a WAL relay's slot on its table is left (whose events it would not relay): GRANT SELECT on it to this role to check",
			zap.String("state_table", table), zap.String("table", t.Name), zap.Error(err))
		return nil
	}
	if err != nil {
		return err
	}
	kafka := r.cfg.walDestination().Kafka
	for _, o := range others {
		if !o.Shares() {
			continue
		}
		d, ok := parseDestination(o.Destination)
		if !ok {
			// Recorded by a version before destinations (or a row made
			// by hand): a WAL slot beside the poll source, a region's, may
			// publish elsewhere.
			r.log.Warn("a WAL relay's slot on this table still exists, and its state row does not say where it publishes: if it is this deployment's own, left from a move to the poll source without poll.handover.slot, the events only it holds are never relayed; set poll.handover.slot to it",
				zap.String("table", t.Name), zap.String("slot", o.Slot), zap.String("state_table", table))
			continue
		}
		if d.Kafka != kafka {
			continue
		}
		if o.Active {
			return &FatalError{Err: fmt.Errorf("%w: a WAL relay streams from slot %q, which state table %s records relaying %s to this Kafka cluster: with the poll source beside it, each event would be published twice. If you are moving from the WAL source to the poll source, stop the WAL relay and set poll.handover.slot: %s (see the README's \"Moving between the sources\"); if you moved from the poll source to the WAL source, this poll relay is left over: stop it",
				replication.ErrSlotLeftBehind, o.Slot, table, t.Name, o.Slot)}
		}
		return &FatalError{Err: fmt.Errorf("%w: slot %q, which state table %s records relaying %s from the WAL to this Kafka cluster, is idle at %s and poll.handover.slot is not set: the events only that slot holds (rows their own transaction deleted, rows written while no relay read the table, table-less messages) would never reach Kafka from the poll source, and the slot would keep WAL for ever. Set poll.handover.slot: %s (the first poll relay marks what the slot relayed as published and drops it, or stops, keeping it, while it holds events no row carries; see the README's \"Moving between the sources\"); or, if everything it holds reached Kafka another way, drop it: SELECT pg_drop_replication_slot(%s)",
			replication.ErrSlotLeftBehind, o.Slot, table, t.Name, o.Confirmed, o.Slot, quoteLiteral(o.Slot))}
	}
	return nil
}

// walTables reads which relations the WAL relay relayed, by OID: the
// outbox tables its last session recorded in the state table, other than
// this relay's, with their partitions at every level (mapped to the table
// they belong to). known is false without a record of them.
func (pr *pollRunner) walTables(ctx context.Context, conn *pgx.Conn, slot string) (oids map[uint32]string, known bool, err error) {
	table := pr.r.cfg.Postgres.StateTable
	if table == "" {
		return nil, false, nil
	}
	st, found, err := replication.ReadState(ctx, conn, table, slot)
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42P01" { // undefined_table
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("relay: handover from slot %q: %w", slot, err)
	}
	if !found || len(st.TableOIDs) == 0 {
		return nil, false, nil
	}
	oids = map[uint32]string{}
	for name := range st.TableOIDs {
		if name == pr.table.Name {
			continue
		}
		ids, err := replication.TableTree(ctx, conn, name)
		if err != nil {
			return nil, false, fmt.Errorf("relay: handover from slot %q: %w", slot, err)
		}
		for _, id := range ids {
			oids[id] = name
		}
	}
	return oids, true, nil
}

// slotJudged refuses a handover from a slot whose position says nothing of
// what the WAL relay relayed, as cleanup refuses to delete by it: a slot
// past the fence of the last pgoutbox session on it was moved by something
// else (pg_replication_slot_advance, another client), and the rows
// committed in between were never relayed; a cleanup hold records such a
// gap (or another, see replication.CleanupHold) that was not resolved.
// Either way the handover would mark rows published that never reached
// Kafka. Without a state row there is nothing to judge by: a warning says
// so. It returns the WAL relay's state row (the zero State without one),
// which records the publication it streamed through and its messages
// prefix.
func (pr *pollRunner) slotJudged(ctx context.Context, conn *pgx.Conn, slot replication.SlotState) (replication.State, error) {
	r, table := pr.r, pr.r.cfg.Postgres.StateTable
	var none replication.State
	noRecord := func(why string) (replication.State, error) {
		r.log.Warn("handover: no record of the WAL relay's sessions on the slot ("+why+"), so whether something other than pgoutbox moved it cannot be told; every row before its position is taken as relayed",
			zap.String("slot", slot.Name), zap.String("state_table", table))
		return none, nil
	}
	if table == "" {
		return noRecord("postgres.state.table is empty")
	}
	st, found, err := replication.ReadState(ctx, conn, table, slot.Name)
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42P01" { // undefined_table
		return noRecord("the state table does not exist")
	}
	if err != nil {
		return none, fmt.Errorf("relay: handover from slot %q: %w", slot.Name, err)
	}
	if !found {
		return noRecord("the state table has no row for it")
	}
	// Rows that joined the outbox table without being streamed (a
	// partition attached with older rows, the table dropped and made
	// again) are before the slot's position but were never relayed.
	pcfg := r.cfg.Postgres
	pcfg.Tables, pcfg.Slot = []string{pr.table.Name}, slot.Name
	if st.Publication != "" {
		// The one the WAL relay streamed through (this relay's may be
		// another).
		pcfg.Publication = st.Publication
	}
	never, _, err := replication.NeverStreamed(ctx, conn, pcfg, st)
	if err != nil {
		return none, fmt.Errorf("relay: handover from slot %q: %w", slot.Name, err)
	}
	if len(never) > 0 {
		return none, &FatalError{Err: fmt.Errorf("relay: handover from slot %q: rows of %s before the slot's position were never in its stream, so the position does not say which rows were relayed; nothing was marked: %s; start the WAL relay (pgoutbox run with the WAL source) once: it stops, holds cleanup and says how to go on",
			slot.Name, pr.table.Name, strings.Join(never, "; "))}
	}
	hold, err := replication.CleanupHold(ctx, conn, table, slot.Name)
	if err != nil {
		return none, fmt.Errorf("relay: handover from slot %q: %w", slot.Name, err)
	}
	if hold != "" {
		return none, &FatalError{Err: fmt.Errorf("relay: handover from slot %q: cleanup of the slot is held (%s), so its position does not say which rows were relayed; nothing was marked: relay those events from the outbox table, release the hold (pgoutbox cleanup --release-hold=%s) and start again",
			slot.Name, hold, replication.HoldID(hold))}
	}
	if st.FencePassedBy(slot.ConfirmedFlushLSN) {
		return none, &FatalError{Err: fmt.Errorf("%w: handover from slot %q: the slot is at %s, past %s, the furthest the last pgoutbox session on it may have confirmed: something else moved it (pg_replication_slot_advance, another client, or a pgoutbox version that confirmed the end of WAL as PostgreSQL shut down), so its position does not say which rows were relayed; nothing was marked: start the WAL relay (pgoutbox run with the WAL source) once: it tells these apart, holds cleanup where events may have been skipped, and says how to go on",
			replication.ErrSlotAdvanced, slot.Name, slot.ConfirmedFlushLSN, st.StoppedLSN)}
	}
	return st, nil
}

// unrelayedElsewhere keeps, of the other relations' pending inserts, those
// of tables the WAL relay relayed (walTables, by the table they belong
// to); without a record, every table of a publication that names its
// tables. In a FOR ALL TABLES one, whose other tables' inserts the WAL
// relay skipped, they cannot be told apart without a record: a warning
// names them.
func (pr *pollRunner) unrelayedElsewhere(slot string, others map[uint32]replication.OtherInserts, wal map[uint32]string, known, allTables bool) map[uint32]replication.OtherInserts {
	kept := map[uint32]replication.OtherInserts{}
	for oid, o := range others {
		switch name, was := wal[oid]; {
		case was:
			kept[oid] = replication.OtherInserts{Table: name + " (" + o.Table + ")", Inserts: o.Inserts}
		case !known && !allTables:
			kept[oid] = o
		}
	}
	if !known && allTables && len(others) > 0 {
		pr.r.log.Warn("handover: the slot has inserts it has not relayed into other tables of its FOR ALL TABLES publication, and no state record says which of them the WAL relay relayed; any that is an outbox table loses those events with the slot",
			zap.String("slot", slot), zap.String("tables", replication.OtherTables(others)))
	}
	return kept
}
