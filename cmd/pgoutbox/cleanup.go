package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/pgoutbox/pkg/relay"
	"github.com/pgoutbox/pgoutbox/poll"
	"github.com/pgoutbox/pgoutbox/replication"
)

const cleanupHelp = `Usage: pgoutbox cleanup [--retention D] [--marks-table T] [flags]

Deletes outbox rows that were relayed more than the retention ago, in small
batches (short transactions that skip locked rows, with a pause between
them), for cron. It never deletes a row that may not have been relayed yet.

  relay.source poll: the rows published (published_at) before now - retention.
  relay.source wal:  the rows whose transaction the slot (postgres.slot.name)
                     has confirmed. A row does not say where its commit lies,
                     so each run records a mark in --marks-table (the oldest
                     running transaction and the WAL position after it), and
                     deletes the rows older than the newest mark that is at
                     least the retention old and that the slot has passed:
                     the first run deletes nothing, a run a retention later
                     deletes what was relayed before the first.

After migrate --recreate-slot or --accept-catalog, the WAL source's
cleanup is held (the slot's position says nothing of the events of the
gap) and deletes nothing until --release-hold=ID, with the ID it prints
beside the hold, once those events are relayed. A start that finds the
outbox table or publication changed, or the slot moved on by something
else, holds it too. A slot past the fence the relay's last session
recorded, or no row for the slot in the state table, also stops cleanup
before it deletes anything. A hold of another slot whose state row (in
the same state table) records one of the tables, or records none yet and
whose publication publishes one, stops the cleanup of either source too:
the rows of that slot's gap are in the table, to be relayed from it.
Release it with that slot's configuration. Cleanup reads the holds and
the fence from postgres.state.table: its role needs SELECT on that table
(and UPDATE for --release-hold). Without a state table the WAL source's cleanup refuses
unless --without-state-table is given: nothing then records what would
make the slot's position say nothing of rows never relayed.

The retention is poll.retention unless --retention is given (0s: everything
relayed). Exit status 0, 1 when something failed, 2 for bad flags or
settings, 3 when PostgreSQL cannot be reached.
`

// cmdCleanup implements "pgoutbox cleanup".
func cmdCleanup(args, environ []string, stdout, stderr io.Writer) int {
	c := newFlags("cleanup", stderr, cleanupHelp)
	retention := c.fs.Duration("retention", 0, "delete rows relayed longer ago than this (default poll.retention)")
	marks := c.fs.String("marks-table", poll.DefaultMarksTable, "the WAL source's cleanup marks (created when missing)")
	release := c.fs.String("release-hold", "", "the WAL source: clear the hold with this ID (a held cleanup prints it), once the events of the gap it names are relayed, and clean up")
	noState := c.fs.Bool("without-state-table", false, "the WAL source with postgres.state.table empty: delete by the slot's position though nothing records what could make it say nothing of rows never relayed")
	cfg, code, ok := c.loadOrExit(args, environ, &stdout, &stderr)
	if !ok {
		return code
	}
	keep := cfg.Poll.Retention
	given := false
	c.fs.Visit(func(f *flag.Flag) {
		if f.Name == "retention" {
			given = true
		}
	})
	if given {
		keep = *retention
	}
	if keep < 0 || (!given && keep == 0) {
		fmt.Fprintln(stderr, "pgoutbox: configuration: no retention: poll.retention is 0 (keep published rows); pass --retention")
		return exitConfig
	}
	if *release != "" && isPoll(cfg) {
		fmt.Fprintln(stderr, "pgoutbox: configuration: --release-hold: relay.source is poll, whose cleanup is never held (it deletes by published_at); the flag is for relay.source wal")
		return exitConfig
	}
	if *release != "" && cfg.Postgres.StateTable == "" {
		fmt.Fprintln(stderr, "pgoutbox: configuration: --release-hold: postgres.state.table is empty, and holds are kept there")
		return exitConfig
	}
	if !isPoll(cfg) && cfg.Postgres.StateTable == "" && !*noState {
		// The state row is what records a slot that vanished and was made
		// again (the relay, without one, makes it again silently), a
		// catalog change, a slot moved by something else, rows that
		// joined the outbox without being streamed: each makes the slot's
		// position say nothing of rows it never relayed.
		fmt.Fprintln(stderr, "pgoutbox: configuration: postgres.state.table is empty, so nothing records a slot that vanished and was made again, a catalog change or a slot moved by something else, after which the slot's position says nothing of rows never relayed; nothing was deleted: keep a state table (the default), or pass --without-state-table to delete by the slot's position anyway")
		return exitConfig
	}
	ctx := context.Background()
	conn, code := connectOrReport(ctx, cfg.Postgres, "pgoutbox-cleanup", stderr)
	if conn == nil {
		return code
	}
	defer conn.Close(ctx)
	cl := poll.DefaultCleanup(cfg.Poll.CleanupBatchSize)
	if isPoll(cfg) {
		return cleanupPoll(ctx, conn, cfg, cl, keep, stdout, stderr)
	}
	return cleanupWAL(ctx, conn, cfg, cl, keep, *marks, *release, stdout, stderr)
}

func cleanupPoll(ctx context.Context, conn *pgx.Conn, cfg fileConfig, cl poll.Cleanup, keep time.Duration, stdout, stderr io.Writer) int {
	t, err := cfg.PollTable()
	if err != nil {
		fmt.Fprintf(stderr, "pgoutbox: configuration: %v\n", err)
		return exitConfig
	}
	if err := t.Check(ctx, conn); err != nil {
		fmt.Fprintf(stderr, "pgoutbox: cleanup: %v\n", err)
		return exitRuntime
	}
	// A published row may still be in a WAL slot's gap (a slot on the
	// same table, or the one handed over to the poll source): its hold
	// says those rows are to be relayed from the table.
	if cfg.Postgres.StateTable != "" && refuseSharedHolds(ctx, conn, cfg.Postgres.StateTable, "", t.Name, []string{t.Name}, stderr) {
		return exitRuntime
	}
	n, err := cl.Published(ctx, conn, t, keep)
	fmt.Fprintf(stdout, "deleted %d rows of %s published more than %s ago\n", n, t.Name, keep)
	if err != nil {
		fmt.Fprintf(stderr, "pgoutbox: cleanup: %v\n", err)
		return exitRuntime
	}
	return exitOK
}

func cleanupWAL(ctx context.Context, conn *pgx.Conn, cfg fileConfig, cl poll.Cleanup, keep time.Duration, marks, release string, stdout, stderr io.Writer) int {
	pc := cfg.Postgres
	if err := replication.ValidateSlotName(pc.Slot); err != nil {
		fmt.Fprintf(stderr, "pgoutbox: configuration: %v\n", err)
		return exitConfig
	}
	if release != "" && pc.StateTable != "" {
		hold, err := replication.ReleaseCleanupHold(ctx, conn, pc.StateTable, pc.Slot, release)
		if err != nil {
			fmt.Fprintf(stderr, "pgoutbox: cleanup: nothing was released or deleted: %v\n", err)
			return exitRuntime
		}
		if hold != "" {
			fmt.Fprintf(stdout, "cleanup hold of slot %s released (ID %s: %s)\n", pc.Slot, release, hold)
		}
	}
	ddl, err := poll.MarksTableDDL(marks)
	if err != nil {
		fmt.Fprintf(stderr, "pgoutbox: configuration: --marks-table: %v\n", err)
		return exitConfig
	}
	_, err = conn.Exec(ctx, ddl)
	if replication.CreatedConcurrently(err) {
		// Made by another cleanup at the same moment: IF NOT EXISTS
		// finds it now.
		_, err = conn.Exec(ctx, ddl)
	}
	if err != nil {
		fmt.Fprintf(stderr, "pgoutbox: cleanup: create %s: %v\n", marks, err)
		return exitRuntime
	}
	slot, err := replication.ReadSlot(ctx, conn, pc.Slot)
	if errors.Is(err, replication.ErrSlotMissing) {
		fmt.Fprintf(stderr, "pgoutbox: cleanup: slot %q does not exist: what it relayed cannot be told, so nothing was deleted\n", pc.Slot)
		return exitRuntime
	}
	if err != nil {
		fmt.Fprintf(stderr, "pgoutbox: cleanup: %v\n", err)
		return exitRuntime
	}
	// A slot past the end of WAL came with a restore or a rewind: the rows
	// written since are before its position and were never relayed.
	end, err := replication.ReadWALEnd(ctx, conn)
	if err != nil {
		fmt.Fprintf(stderr, "pgoutbox: cleanup: %v\n", err)
		return exitRuntime
	}
	if end != 0 && slot.ConfirmedFlushLSN > end {
		fmt.Fprintf(stderr, "pgoutbox: cleanup: slot %s is confirmed up to %s, past %s, the end of this server's WAL: the database was put back to an earlier point (a restore, pg_rewind) with a slot from after it, so its position says nothing of the rows written since, and nothing was deleted; start pgoutbox run, which stops and says how to go on\n", pc.Slot, slot.ConfirmedFlushLSN, end)
		return exitRuntime
	}
	// After a recreated slot or an accepted catalog, the slot's position
	// says nothing of the rows of the gap: deleting by it would delete
	// events that were never relayed. The hold is read after the slot: a
	// migrate --recreate-slot holds cleanup before it creates the slot, so
	// a slot seen here is never newer than the hold read after it.
	if pc.StateTable != "" {
		// The slot moves only when a client confirms, and a pgoutbox
		// session records the furthest it may confirm (the fence) before
		// it confirms it: a slot past the fence was moved by something
		// else, and its position says nothing of the events in between.
		// The relay's next start tells that from PostgreSQL's shutdown
		// and holds cleanup where events may have been skipped. A state
		// row that is missing (a mistyped state.table, a dropped table)
		// says nothing either. The fence is read before the hold: a start
		// that holds cleanup does so before it moves the fence up to the
		// slot.
		st, ok, err := replication.ReadState(ctx, conn, pc.StateTable, pc.Slot)
		if err != nil {
			fmt.Fprintf(stderr, "pgoutbox: cleanup: %v; cleanup needs SELECT on %s to see what the relay recorded\n", err, pc.StateTable)
			return exitRuntime
		}
		if !ok {
			fmt.Fprintf(stderr, "pgoutbox: cleanup: %s has no row for slot %s, so what pgoutbox relayed from it cannot be told, and nothing was deleted: check postgres.state.table and postgres.slot, or start pgoutbox run once (it records the row)\n", pc.StateTable, pc.Slot)
			return exitRuntime
		}
		if st.FencePassedBy(slot.ConfirmedFlushLSN) {
			fmt.Fprintf(stderr, "pgoutbox: cleanup: slot %s is at %s, past %s, the furthest the last pgoutbox session on it may have confirmed: something else moved it (pg_replication_slot_advance, another client, or a pgoutbox version that confirmed the end of WAL as PostgreSQL shut down), so nothing was deleted; start pgoutbox run: it tells these apart, and holds cleanup where events may have been skipped\n", pc.Slot, slot.ConfirmedFlushLSN, st.StoppedLSN)
			return exitRuntime
		}
		// What the relay's next start would refuse, cleanup must not take
		// for relayed meanwhile: rows of a table or partition that joined
		// the outbox since the last session, which were never in the
		// stream, and what cannot be looked at.
		if problems, _, err := replication.NeverStreamed(ctx, conn, pc, st); err != nil || len(problems) > 0 {
			if err != nil {
				problems = []string{err.Error()}
			}
			fmt.Fprintf(stderr, "pgoutbox: cleanup of slot %s: nothing was deleted: %s; start pgoutbox run, which stops and says how to go on\n", pc.Slot, strings.Join(problems, "; "))
			return exitRuntime
		}
		hold, err := replication.CleanupHold(ctx, conn, pc.StateTable, pc.Slot)
		if err != nil {
			fmt.Fprintf(stderr, "pgoutbox: cleanup: %v; cleanup needs SELECT on %s to see whether it is held\n", err, pc.StateTable)
			return exitRuntime
		}
		if hold != "" {
			fmt.Fprintf(stderr, "pgoutbox: cleanup of slot %s is held, so nothing was deleted: %s. Relay those events from the outbox table, then run pgoutbox cleanup --release-hold=%s (the ID of this hold: a gap added later changes it)\n", pc.Slot, hold, replication.HoldID(hold))
			return exitRuntime
		}
		// Another slot on the same table (a region's) may be held: its
		// gap's rows are in this table, to be relayed from it, and this
		// slot's position says nothing of them.
		if refuseSharedHolds(ctx, conn, pc.StateTable, pc.Slot, "slot "+pc.Slot, pc.QualifiedTables(), stderr) {
			return exitRuntime
		}
		// A slot of the same tables left behind where this one started
		// (the relay refuses to start then): the rows committed in
		// between were relayed by neither, and this slot's position is
		// past them.
		others, err := replication.OtherSlots(ctx, conn, pc.StateTable, pc.Slot, pc.QualifiedTables())
		if err != nil {
			fmt.Fprintf(stderr, "pgoutbox: cleanup of slot %s: nothing was deleted: %v\n", pc.Slot, err)
			return exitRuntime
		}
		start := replication.Start{Slot: slot, HadState: true, State: st, OtherSlots: others}
		if o, ok := relay.LeftBehindSlot(start, cfg.Config); ok {
			fmt.Fprintf(stderr, "pgoutbox: cleanup of slot %s: nothing was deleted: slot %s, which relayed %s too, is idle at %s, before %s where slot %s started, so the rows committed in between were relayed by neither; start pgoutbox run, which stops and says how to go on\n",
				pc.Slot, o.Slot, strings.Join(o.Tables, ", "), o.Confirmed, start.StartedAt(), pc.Slot)
			return exitRuntime
		}
	}
	failed := false
	for _, table := range pc.QualifiedTables() {
		m, ok, err := poll.UsableMark(ctx, conn, marks, table, pc.Slot, slot.ConfirmedFlushLSN.String(), keep)
		if err == nil {
			_, err = poll.TakeMark(ctx, conn, marks, table, pc.Slot)
		}
		if err != nil {
			fmt.Fprintf(stderr, "pgoutbox: cleanup of %s: %v\n", table, err)
			failed = true
			continue
		}
		if !ok {
			fmt.Fprintf(stdout, "%s: nothing deleted: no mark yet that is %s old and that slot %s has confirmed (a new mark was recorded; a later run deletes what the slot relayed before it)\n", table, keep, pc.Slot)
			continue
		}
		n, err := cl.Relayed(ctx, conn, table, m)
		fmt.Fprintf(stdout, "deleted %d rows of %s that slot %s relayed (committed before the mark of %s)\n", n, table, pc.Slot, m.TakenAt.UTC().Format(time.RFC3339))
		if err != nil {
			fmt.Fprintf(stderr, "pgoutbox: cleanup of %s: %v\n", table, err)
			failed = true
		}
	}
	if failed {
		return exitRuntime
	}
	return exitOK
}

// refuseSharedHolds says on stderr, and returns true, when a slot other
// than slot ("": any) is held on one of tables: its gap's rows are to be
// relayed from the table, and cleanup of what (the cleanup's own name)
// would delete them as relayed.
func refuseSharedHolds(ctx context.Context, conn *pgx.Conn, stateTable, slot, what string, tables []string, stderr io.Writer) bool {
	holds, err := replication.SharedCleanupHolds(ctx, conn, stateTable, slot, tables)
	if pe := (*pgconn.PgError)(nil); slot == "" && errors.As(err, &pe) && pe.Code == "42501" {
		// The poll source, which needs no state table: a role that may not
		// read another team's is not stopped by it (nor was it before).
		fmt.Fprintf(stderr, "pgoutbox: cleanup of %s: warning: the cleanup holds of WAL slots on the table are not checked: %v (GRANT SELECT ON %s to this role to check them)\n", what, err, stateTable)
		return false
	}
	if err != nil {
		fmt.Fprintf(stderr, "pgoutbox: cleanup of %s: nothing was deleted: %v; cleanup needs SELECT on %s to see whether another slot on the same table is held\n", what, err, stateTable)
		return true
	}
	for _, h := range holds {
		fmt.Fprintf(stderr, "pgoutbox: cleanup of %s: nothing was deleted: the cleanup of slot %s is held (%s): %s. Its gap's rows are in the same table, to be relayed from it, and deleting them would lose them: relay those events from the outbox table, then run pgoutbox cleanup --release-hold=%s with slot %s's configuration (postgres.slot.name: %s, relay.source: wal)\n",
			what, h.Slot, h.Why, h.Hold, h.ID(), h.Slot, h.Slot)
	}
	return len(holds) > 0
}
