package poll_test

import (
	"context"
	"testing"

	"github.com/pgoutbox/pgoutbox/migrations"
	"github.com/pgoutbox/pgoutbox/poll"
)

// TestRelayedLeavesTheSessionKeepingUnpublishedRows: the WAL source's
// cleanup deletes relayed rows past the poll source's keep trigger (a table
// on its way to the poll source has it), and the session it used keeps
// unpublished rows again afterwards. Through a pooler in transaction mode
// that session next serves an application: with the setting left on for
// the session (as before), the application's delete of a row not yet
// published went through, and the poll source never saw its event.
func TestRelayedLeavesTheSessionKeepingUnpublishedRows(t *testing.T) {
	ctx := context.Background()
	conn := newDatabase(t)
	if err := migrations.ApplyPoll(ctx, conn, migrations.PollParams{Table: "public.outbox"}); err != nil {
		t.Fatal(err)
	}
	insert := func(key string, n int) {
		t.Helper()
		if _, err := conn.Exec(ctx, `INSERT INTO public.outbox (id, aggregatetype, aggregateid, type, payload)
			SELECT gen_random_uuid(), 'order', $1, 'created', '{}' FROM generate_series(1, $2)`, key, n); err != nil {
			t.Fatal(err)
		}
	}
	count := func(key string) (n int) {
		t.Helper()
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM public.outbox WHERE aggregateid = $1", key).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	insert("relayed", 5)
	// A mark at the next transaction id covers every row written so far.
	var next uint64
	if err := conn.QueryRow(ctx, "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint").Scan(&next); err != nil {
		t.Fatal(err)
	}
	n, err := poll.DefaultCleanup(100).Relayed(ctx, conn, "public.outbox", poll.Mark{SnapshotXmin: next})
	if err != nil || n != 5 || count("relayed") != 0 {
		t.Fatalf("Relayed: %d rows, %v; %d left: want the 5 relayed rows deleted past the keep trigger", n, err, count("relayed"))
	}
	var setting string
	if err := conn.QueryRow(ctx, "SELECT coalesce(current_setting($1, true), '')", migrations.DeleteUnpublished).Scan(&setting); err != nil {
		t.Fatal(err)
	}
	if setting == "on" {
		t.Fatalf("after Relayed the session's %s is %q: a pooled session handed on would delete unpublished rows", migrations.DeleteUnpublished, setting)
	}
	// What the next user of the session does: its delete of an
	// unpublished row is skipped, and the poll source publishes the row.
	insert("unpublished", 1)
	if _, err := conn.Exec(ctx, "DELETE FROM public.outbox WHERE aggregateid = 'unpublished'"); err != nil {
		t.Fatal(err)
	}
	if count("unpublished") != 1 {
		t.Fatal("an application's delete of an unpublished row on the session cleanup used went through the keep trigger")
	}
}
