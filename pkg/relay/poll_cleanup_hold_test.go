package relay_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pgoutbox/pgoutbox/pkg/outboxtest"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
	"github.com/pgoutbox/pgoutbox/replication"
)

// TestPollRelayCleanupKeepsTheRowsAWALSlotsHoldNames: a WAL slot on the
// poll relay's table (the one handed over to it, or a region's) holds its
// cleanup: the rows of its gap are in the table, to be relayed from it.
// The poll relay publishes them, and its own periodic cleanup
// (poll.retention) deleted them by published_at at the next interval
// (before: every row gone), as pgoutbox cleanup no longer does. Now it
// keeps them while the hold stands, warns of the hold once (not at every
// interval), naming the slot and --release-hold, and deletes them once the
// hold is released.
func TestPollRelayCleanupKeepsTheRowsAWALSlotsHoldNames(t *testing.T) {
	env := testenv.Require(t)
	f := newPollFixture(t, env, 1)
	ctx := context.Background()
	if err := replication.EnsureStateTable(ctx, f.conn, replication.DefaultStateTable); err != nil {
		t.Fatal(err)
	}
	walSlot := testenv.UniqueName(t, "wal")
	// A slot that exists: the held row of one dropped for good holds nothing.
	if _, err := f.checkDB.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", walSlot); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = f.checkDB.Exec(context.Background(), "SELECT pg_drop_replication_slot($1)", walSlot) })
	var oid uint32
	if err := f.checkDB.QueryRow(ctx, "SELECT 'public.outbox'::regclass::oid").Scan(&oid); err != nil {
		t.Fatal(err)
	}
	st := replication.State{Slot: walSlot, Publication: f.pub, TableOIDs: map[string]uint32{"public.outbox": oid}, Note: "a test's stand-in"}
	if err := replication.WriteState(ctx, f.conn, replication.DefaultStateTable, st); err != nil {
		t.Fatal(err)
	}
	hold, err := replication.SetCleanupHold(ctx, f.conn, replication.DefaultStateTable, walSlot,
		"slot recreated by pgoutbox migrate --recreate-slot: events committed after 0/1 and before the new slot were not relayed from the WAL")
	if err != nil {
		t.Fatal(err)
	}
	id := replication.HoldID(hold)

	cfg := f.pollConfig()
	cfg.Poll.Retention, cfg.Poll.CleanupInterval = time.Millisecond, 100*time.Millisecond
	core, logs := observer.New(zapcore.InfoLevel)
	stop := runRelayLog(t, cfg, zap.New(core))
	w := outboxtest.NewWriter(f.conn, "outbox", f.shape, 31)
	writeEvents(t, w, 50, 100)
	rows := func() int {
		var n int
		if err := f.checkDB.QueryRow(ctx, "SELECT count(*) FROM outbox").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	total := rows()
	testenv.Eventually(t, time.Minute, 20*time.Millisecond, func() (bool, string) {
		n := f.unpublished(t)
		return n == 0, fmt.Sprintf("%d of %d rows unpublished", n, total)
	})
	warned := func() []observer.LoggedEntry {
		return logs.FilterMessageSnippet("cleanup of published rows is held by another slot's cleanup hold").FilterField(zap.String("slot", walSlot)).All()
	}
	testenv.Eventually(t, time.Minute, 20*time.Millisecond, func() (bool, string) {
		return len(warned()) > 0, fmt.Sprintf("the relay's cleanup has not warned of slot %s's hold (%d of %d rows left)", walSlot, rows(), total)
	})
	// Several more intervals: the cleanup session keeps running
	// statements (query_start moves on), deleting nothing, warning no more.
	after := time.Now().Add(6 * cfg.Poll.CleanupInterval)
	testenv.Eventually(t, time.Minute, 20*time.Millisecond, func() (bool, string) {
		var last *time.Time
		if err := f.checkDB.QueryRow(ctx, `SELECT max(query_start) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = 'pgoutbox-poll-cleanup'`).Scan(&last); err != nil {
			t.Fatal(err)
		}
		return last != nil && last.After(after), fmt.Sprintf("the cleanup session ran no statement after %s (last: %v)", after, last)
	})
	if n := rows(); n != total {
		t.Fatalf("the poll relay's cleanup deleted %d of %d published rows while slot %s's cleanup hold on the table stood", total-n, total, walSlot)
	}
	ws := warned()
	if len(ws) != 1 {
		t.Fatalf("the relay warned of slot %s's hold %d times over several cleanup intervals, want once", walSlot, len(ws))
	}
	fields := ws[0].ContextMap()
	if fields["hold"] != hold || fields["release"] != "pgoutbox cleanup --release-hold="+id+" with postgres.slot.name: "+walSlot {
		t.Fatalf("the warning does not name the hold %q and --release-hold=%s: %v", hold, id, fields)
	}

	if _, err := replication.ReleaseCleanupHold(ctx, f.conn, replication.DefaultStateTable, walSlot, id); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Minute, 20*time.Millisecond, func() (bool, string) {
		n := rows()
		return n == 0, fmt.Sprintf("%d of %d published rows left after the hold was released", n, total)
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}
