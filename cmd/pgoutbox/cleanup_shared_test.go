package main

import (
	"context"
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox/migrations"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
	"github.com/pgoutbox/pgoutbox/replication"
)

// holdSlot writes a state row for slot that records the tables given (by
// name, with their OIDs now) and the publication, and holds its cleanup as
// migrate --recreate-slot does; it returns the hold's ID.
func (f *fixture) holdSlot(t *testing.T, slot, publication string, tables ...string) string {
	t.Helper()
	ctx := context.Background()
	st := replication.State{Slot: slot, Publication: publication, Note: "a test's stand-in"}
	if len(tables) > 0 {
		st.TableOIDs = map[string]uint32{}
		for _, name := range tables {
			st.TableOIDs[name] = uint32(f.count(t, "SELECT to_regclass($1)::oid::bigint", name))
		}
	}
	if err := replication.WriteState(ctx, f.conn, replication.DefaultStateTable, st); err != nil {
		t.Fatal(err)
	}
	hold, err := replication.SetCleanupHold(ctx, f.conn, replication.DefaultStateTable, slot,
		"slot recreated by pgoutbox migrate --recreate-slot: events committed after 0/1 and before the new slot were not relayed from the WAL")
	if err != nil {
		t.Fatal(err)
	}
	return replication.HoldID(hold)
}

// TestCleanupKeepsTheRowsAnotherSlotsHoldNames: regions A and B each have a
// slot on one outbox table, with one state table. B's slot was made again
// (migrate --recreate-slot), which holds B's cleanup: the rows of its gap
// are to be relayed from the table. A's slot has relayed them past A's
// mark, and A's cleanup deleted them (before: exit 0, "deleted 5 rows"),
// so B never got them. Now A's cleanup deletes nothing and names B's hold and how to
// release it, while a hold of a slot on another table does not stop it;
// once B's hold is released, A's cleanup deletes the rows. A row that
// records no tables yet (a placeholder) but whose publication publishes
// the table stops it too.
func TestCleanupKeepsTheRowsAnotherSlotsHoldNames(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.ready(t)
	env := f.environ(withPassword(t, f.dsn, ""))
	ctx := context.Background()
	if err := replication.EnsureStateTable(ctx, f.conn, replication.DefaultStateTable); err != nil {
		t.Fatal(err)
	}
	if err := replication.WriteState(ctx, f.conn, replication.DefaultStateTable, replication.State{Slot: f.slot, Note: "a test's stand-in"}); err != nil {
		t.Fatal(err)
	}
	// Another team's slot on another table, held: none of A's business.
	f.exec(t, "CREATE TABLE public.other_outbox (id int)")
	f.holdSlot(t, testenv.UniqueName(t, "other"), "other_pub", "public.other_outbox")
	for range 5 {
		f.exec(t, `INSERT INTO public.outbox (id, aggregatetype, aggregateid, type, payload) VALUES (gen_random_uuid(), 'order', 'gap', 'created', '{}')`)
	}
	rows := func() int { return f.count(t, "SELECT count(*) FROM public.outbox") }
	cleanup := func() cmdResult {
		t.Helper()
		f.waitHorizon(t)
		return invoke(cmdCleanup, []string{"--retention", "0s", "--marks-table", "public.cleanup_marks"}, env)
	}
	wantRefused := func(r cmdResult, slot, id string) {
		t.Helper()
		if r.code != exitRuntime || rows() != 5 || !strings.Contains(r.stderr, "nothing was deleted: the cleanup of slot "+slot+" is held") ||
			!strings.Contains(r.stderr, "--release-hold="+id+" with slot "+slot+"'s configuration") {
			t.Fatalf("cleanup of slot A with slot %s held on the same table: want exit 1 naming %s, its hold and --release-hold=%s, and the 5 rows kept (%d):\n%s", slot, slot, id, rows(), r)
		}
	}
	// A takes a mark after the rows and relays past it.
	if r := cleanup(); r.code != exitOK || !strings.Contains(r.stdout, "nothing deleted: no mark yet") {
		t.Fatalf("A's first cleanup: want exit 0 and a mark taken:\n%s", r)
	}
	f.exec(t, "SELECT pg_replication_slot_advance($1, pg_current_wal_lsn())", f.slot)
	// B's slot was dropped while B was down, and made again: the rows are
	// in B's gap.
	regionB := testenv.UniqueName(t, "region_b")
	f.exec(t, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", regionB)
	idB := f.holdSlot(t, regionB, f.publication, "public.outbox")
	wantRefused(cleanup(), regionB, idB)

	// B's operator relays the gap and releases the hold, as for its own.
	envB := f.environ(withPassword(t, f.dsn, ""), "PGOUTBOX_POSTGRES_SLOT_NAME="+regionB)
	r := invoke(cmdCleanup, []string{"--retention", "0s", "--marks-table", "public.cleanup_marks", "--release-hold=" + idB}, envB)
	if r.code != exitOK || !strings.Contains(r.stdout, "cleanup hold of slot "+regionB+" released") {
		t.Fatalf("cleanup --release-hold as slot B: want exit 0 and the hold released:\n%s", r)
	}

	// A placeholder of a slot being made again records no tables yet: its
	// publication says which it streams.
	placeholder := testenv.UniqueName(t, "placeholder")
	idP := f.holdSlot(t, placeholder, f.publication)
	wantRefused(cleanup(), placeholder, idP)
	if _, err := replication.ReleaseCleanupHold(ctx, f.conn, replication.DefaultStateTable, placeholder, idP); err != nil {
		t.Fatal(err)
	}

	r = cleanup()
	if r.code != exitOK || !strings.Contains(r.stdout, "deleted 5 rows") || rows() != 0 {
		t.Fatalf("cleanup of slot A once the holds on its table are released: want exit 0 and the 5 rows deleted (%d left):\n%s", rows(), r)
	}
}

// TestPollCleanupKeepsTheRowsAWALSlotsHoldNames: the poll source's cleanup
// deletes rows by published_at, and a WAL slot on the same table (the one
// handed over to the poll source, or a region's) may be held with rows of
// its gap still to be relayed from the table: cleanup deletes nothing and
// names the hold until it is released.
func TestPollCleanupKeepsTheRowsAWALSlotsHoldNames(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	if err := migrations.ApplyPoll(ctx, f.conn, migrations.PollParams{Table: "public.outbox"}); err != nil {
		t.Fatal(err)
	}
	if err := replication.EnsureStateTable(ctx, f.conn, replication.DefaultStateTable); err != nil {
		t.Fatal(err)
	}
	walSlot := testenv.UniqueName(t, "wal")
	f.exec(t, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", walSlot)
	id := f.holdSlot(t, walSlot, f.publication, "public.outbox")
	for range 3 {
		f.exec(t, `INSERT INTO public.outbox (id, aggregatetype, aggregateid, type, payload, published_at) VALUES (gen_random_uuid(), 'order', 'gap', 'created', '{}', now() - interval '2 hours')`)
	}
	rows := func() int { return f.count(t, "SELECT count(*) FROM public.outbox") }
	env := f.environ(withPassword(t, f.dsn, ""), "PGOUTBOX_RELAY_SOURCE=poll")
	r := invoke(cmdCleanup, []string{"--retention", "1h"}, env)
	if r.code != exitRuntime || rows() != 3 || !strings.Contains(r.stderr, "the cleanup of slot "+walSlot+" is held") || !strings.Contains(r.stderr, "--release-hold="+id) {
		t.Fatalf("poll cleanup with slot %s held on its table: want exit 1 naming the hold and --release-hold=%s, and the 3 rows kept (%d):\n%s", walSlot, id, rows(), r)
	}
	if _, err := replication.ReleaseCleanupHold(ctx, f.conn, replication.DefaultStateTable, walSlot, id); err != nil {
		t.Fatal(err)
	}
	r = invoke(cmdCleanup, []string{"--retention", "1h"}, env)
	if r.code != exitOK || !strings.Contains(r.stdout, "deleted 3 rows") || rows() != 0 {
		t.Fatalf("poll cleanup once the hold is released: want exit 0 and the 3 rows deleted (%d left):\n%s", rows(), r)
	}

	// A held row of a slot dropped for good (a region taken down) relays
	// nothing any more: it does not hold the table's cleanup for ever.
	gone := testenv.UniqueName(t, "gone")
	f.holdSlot(t, gone, f.publication, "public.outbox")
	f.exec(t, `INSERT INTO public.outbox (id, aggregatetype, aggregateid, type, payload, published_at) VALUES (gen_random_uuid(), 'order', 'gap', 'created', '{}', now() - interval '2 hours')`)
	if r := invoke(cmdCleanup, []string{"--retention", "1h"}, env); r.code != exitOK || rows() != 0 {
		t.Fatalf("poll cleanup with a held row of a slot that does not exist: want exit 0 and the row deleted (%d left):\n%s", rows(), r)
	}

	// A role that may not read the state table (another team's): the
	// poll source, which needs none, is not stopped by it, and says so.
	f.exec(t, "CREATE ROLE "+gone+"_reader LOGIN")
	f.exec(t, "GRANT SELECT, UPDATE, DELETE ON public.outbox TO "+gone+"_reader")
	t.Cleanup(func() { f.exec(t, "DROP OWNED BY "+gone+"_reader; DROP ROLE "+gone+"_reader") })
	f.exec(t, `INSERT INTO public.outbox (id, aggregatetype, aggregateid, type, payload, published_at) VALUES (gen_random_uuid(), 'order', 'gap', 'created', '{}', now() - interval '2 hours')`)
	reader := f.environ(withPassword(t, f.dsn, gone+"_reader"), "PGOUTBOX_RELAY_SOURCE=poll")
	if r := invoke(cmdCleanup, []string{"--retention", "1h"}, reader); r.code != exitOK || rows() != 0 || !strings.Contains(r.stderr, "are not checked") {
		t.Fatalf("poll cleanup by a role that may not read the state table: want exit 0, the row deleted (%d left) and a warning:\n%s", rows(), r)
	}
}
