package main

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/pkg/testenv"
	"github.com/pgoutbox/pgoutbox/poll"
	"github.com/pgoutbox/pgoutbox/replication"
)

// count runs a count query on the fixture's database.
func (f *fixture) count(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := f.conn.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// waitHorizon waits until every transaction that began before it has ended,
// in the whole cluster: a cleanup mark covers the transactions that ended
// before the oldest one still running anywhere (its snapshot's xmin), and
// the other packages' tests run transactions of their own on the same
// server, so without the wait a mark may cover none of the rows written
// just before it.
func (f *fixture) waitHorizon(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	var xid string
	if err := f.conn.QueryRow(ctx, "SELECT pg_current_xact_id()::text").Scan(&xid); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Minute, 20*time.Millisecond, func() (bool, string) {
		var past bool
		if err := f.conn.QueryRow(ctx, "SELECT pg_snapshot_xmin(pg_current_snapshot()) > $1::text::xid8", xid).Scan(&past); err != nil {
			t.Fatal(err)
		}
		return past, "a transaction older than xid " + xid + " still runs"
	})
}

// TestPollSourceMigrateStatusValidateAndCleanup takes an outbox table of
// the WAL source's shape through the poll source's commands: status and
// validate name the missing columns; migrate adds them (twice is the same
// as once); status shows the backlog and validate passes; cleanup deletes
// only rows published before the retention; without poll.notify migrate
// drops the trigger again.
func TestPollSourceMigrateStatusValidateAndCleanup(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	env := f.environ(withPassword(t, f.dsn, ""), "PGOUTBOX_RELAY_SOURCE=poll")

	r := invoke(cmdStatus, nil, env)
	if r.code != exitRuntime || !strings.Contains(r.stdout, "lacks the poll columns seq, published_at, attempts, last_error") {
		t.Fatalf("status before migrate: want exit 1 naming the missing columns:\n%s", r)
	}
	r = invoke(cmdValidate, nil, env)
	if r.code != exitRuntime {
		t.Fatalf("validate before migrate: want exit 1:\n%s", r)
	}
	wantLine(t, r, `^FAIL poll columns: public.outbox lacks seq, published_at, attempts, last_error$`)
	assertNoSecret(t, r)

	for range 2 {
		r = invoke(cmdMigrate, nil, env)
		if r.code != exitOK || !strings.Contains(r.stdout, `migrated public.outbox for the poll source`) {
			t.Fatalf("migrate: want exit 0:\n%s", r)
		}
	}
	for i := range 3 {
		f.exec(t, `INSERT INTO public.outbox (id, aggregatetype, aggregateid, type, payload) VALUES (gen_random_uuid(), 'order', $1, 'created', '{}')`, string(rune('a'+i)))
	}
	r = invoke(cmdStatus, []string{"--format", "json"}, env)
	if r.code != exitOK {
		t.Fatalf("status after migrate: want exit 0:\n%s", r)
	}
	var st pollStatus
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatalf("status JSON: %v\n%s", err, r)
	}
	if st.Source != "poll" || !st.Table.Exists || len(st.Table.Missing) != 0 || !st.Table.Trigger || st.Backlog == nil ||
		st.Backlog.Unpublished != 3 || st.Backlog.OldestAgeSeconds == nil || len(st.Instances) != 0 || len(st.Problems) != 0 {
		t.Fatalf("status: %+v", st)
	}
	r = invoke(cmdStatus, nil, env)
	wantLine(t, r, `^  unpublished_rows +3$`)
	r = invoke(cmdValidate, []string{"--topics", f.topicName}, env)
	for _, check := range []string{"poll columns", "poll index", "poll keep triggers", "poll trigger", "poll privileges"} {
		wantLine(t, r, `^PASS `+check+`: `)
	}
	if strings.Contains(r.stdout, "wal_level") || strings.Contains(r.stdout, "slot") {
		t.Fatalf("validate checks replication for the poll source:\n%s", r)
	}

	f.exec(t, "UPDATE public.outbox SET published_at = now() - interval '2 hours' WHERE aggregateid IN ('a', 'b')")
	r = invoke(cmdCleanup, []string{"--retention", "3h"}, env)
	if r.code != exitOK || !strings.Contains(r.stdout, "deleted 0 rows") {
		t.Fatalf("cleanup with a longer retention: want nothing deleted:\n%s", r)
	}
	r = invoke(cmdCleanup, []string{"--retention", "1h"}, env)
	if r.code != exitOK || !strings.Contains(r.stdout, "deleted 2 rows of public.outbox published more than 1h0m0s ago") {
		t.Fatalf("cleanup: want the 2 published rows deleted:\n%s", r)
	}
	if n := f.count(t, "SELECT count(*) FROM public.outbox WHERE published_at IS NULL"); n != 1 {
		t.Fatalf("%d unpublished rows left, want 1", n)
	}

	r = invoke(cmdMigrate, nil, append(env, "PGOUTBOX_POLL_NOTIFY=false"))
	if r.code != exitOK || !strings.Contains(r.stdout, "no notification trigger") {
		t.Fatalf("migrate without notify:\n%s", r)
	}
	if n := f.count(t, "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'public.outbox'::regclass AND NOT tgisinternal AND tgname NOT LIKE 'pgoutbox_keep_unpublished%'"); n != 0 {
		t.Fatalf("%d triggers left on the table", n)
	}
	// The trigger that keeps unpublished rows stays with the poll source,
	// and goes with a migrate for the WAL source.
	if n := f.count(t, "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'public.outbox'::regclass AND tgname LIKE 'pgoutbox_keep_unpublished%'"); n != 2 {
		t.Fatalf("%d triggers keep unpublished rows, want 2 (DELETE, TRUNCATE)", n)
	}
	// While a poll relay runs on the table, migrate for the WAL source
	// refuses to drop them.
	ctx := context.Background()
	member := testenv.ConnectPG(t, f.dsn)
	if _, err := poll.Join(ctx, member, "public.outbox", 4); err != nil {
		t.Fatal(err)
	}
	r = invoke(cmdMigrate, nil, append(env, "PGOUTBOX_RELAY_SOURCE=wal"))
	if r.code != exitRuntime || !strings.Contains(r.stderr, "1 poll relay session(s) run on public.outbox") {
		t.Fatalf("migrate for the WAL source while a poll relay runs: want exit 1 refusing:\n%s", r)
	}
	if n := f.count(t, "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'public.outbox'::regclass AND tgname LIKE 'pgoutbox_keep_unpublished%'"); n != 2 {
		t.Fatalf("the refused migrate left %d of the 2 keep triggers", n)
	}
	if _, err := member.Exec(ctx, "SELECT pg_advisory_unlock_all()"); err != nil {
		t.Fatal(err)
	}
	// With no poll relay running and a row it has not published, the
	// slot migrate would make starts after that row: refused, nothing
	// changed (the move is snapshot.mode: initial).
	r = invoke(cmdMigrate, nil, append(env, "PGOUTBOX_RELAY_SOURCE=wal"))
	if r.code != exitRuntime || !strings.Contains(r.stderr, "nothing was changed") || !strings.Contains(r.stderr, "public.outbox (1 rows)") {
		t.Fatalf("migrate for the WAL source over an unpublished row: want exit 1 refusing:\n%s", r)
	}
	if n := f.count(t, "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'public.outbox'::regclass AND tgname LIKE 'pgoutbox_keep_unpublished%'"); n != 2 {
		t.Fatalf("the refused migrate left %d of the 2 keep triggers", n)
	}
	f.exec(t, "UPDATE public.outbox SET published_at = now() WHERE published_at IS NULL") // as the poll relays would
	if r = invoke(cmdMigrate, nil, append(env, "PGOUTBOX_RELAY_SOURCE=wal")); r.code != exitOK ||
		!strings.Contains(r.stdout, "dropped the poll source's triggers pgoutbox_keep_unpublished and pgoutbox_keep_unpublished_truncate from public.outbox") {
		t.Fatalf("migrate for the WAL source: want exit 0 saying it dropped the keep triggers:\n%s", r)
	}
	if n := f.count(t, "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'public.outbox'::regclass AND tgname LIKE 'pgoutbox_keep_unpublished%'"); n != 0 {
		t.Fatal("migrate for the WAL source left the trigger that keeps unpublished rows")
	}
	// Without them the poll source's status and validate say so.
	r = invoke(cmdStatus, []string{"--format", "json"}, env)
	if r.code != exitRuntime {
		t.Fatalf("status without the keep triggers: want exit 1:\n%s", r)
	}
	st = pollStatus{}
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatalf("status JSON: %v\n%s", err, r)
	}
	if !slices.Equal(st.Table.MissingKeep, []string{"pgoutbox_keep_unpublished", "pgoutbox_keep_unpublished_truncate"}) ||
		!slices.ContainsFunc(st.Problems, func(p string) bool {
			return strings.Contains(p, "keep triggers pgoutbox_keep_unpublished and pgoutbox_keep_unpublished_truncate") && strings.Contains(p, "pgoutbox migrate run with the poll configuration")
		}) {
		t.Fatalf("status without the keep triggers: %+v", st)
	}
	r = invoke(cmdValidate, []string{"--topics", f.topicName}, env)
	if r.code != exitRuntime {
		t.Fatalf("validate without the keep triggers: want exit 1:\n%s", r)
	}
	wantLine(t, r, `^FAIL poll keep triggers: public.outbox lacks pgoutbox_keep_unpublished and pgoutbox_keep_unpublished_truncate `)
	if r = invoke(cmdMigrate, nil, env); r.code != exitOK {
		t.Fatalf("migrate for the poll source:\n%s", r)
	}
	r = invoke(cmdValidate, []string{"--topics", f.topicName}, env)
	wantLine(t, r, `^PASS poll keep triggers: `)
}

// TestCleanupOfTheWALSourceDeletesOnlyWhatTheSlotConfirmed: rows A are
// written after the slot, and cleanup runs record marks. While the slot
// stays where it is nothing is deleted (it has not relayed A). Once the
// slot is past the marks, rows B are written, and a run deletes A, not B
// (committed after every mark the slot passed); once the slot is past a
// mark taken after B, B goes. The slot stands in for a relay here, so
// its state row has no fence; a fence below the slot (something other than
// pgoutbox moved it) and a missing state row stop cleanup.
func TestCleanupOfTheWALSourceDeletesOnlyWhatTheSlotConfirmed(t *testing.T) {
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
	insert := func(key string, n int) {
		for range n {
			f.exec(t, `INSERT INTO public.outbox (id, aggregatetype, aggregateid, type, payload) VALUES (gen_random_uuid(), 'order', $1, 'created', '{}')`, key)
		}
	}
	rows := func(key string) int {
		return f.count(t, "SELECT count(*) FROM public.outbox WHERE aggregateid = $1", key)
	}
	cleanup := func(want string) {
		t.Helper()
		f.waitHorizon(t)
		r := invoke(cmdCleanup, []string{"--retention", "0s", "--marks-table", "public.cleanup_marks"}, env)
		if r.code != exitOK || !strings.Contains(r.stdout, want) {
			t.Fatalf("cleanup: want exit 0 and %q:\n%s", want, r)
		}
	}
	advance := func() {
		f.exec(t, "SELECT pg_replication_slot_advance($1, pg_current_wal_lsn())", f.slot)
	}
	insert("A", 5)
	cleanup("nothing deleted: no mark yet")
	cleanup("nothing deleted: no mark yet") // the slot has not moved: the first mark is ahead of it
	if rows("A") != 5 {
		t.Fatalf("rows the slot did not relay were deleted: %d of 5 left", rows("A"))
	}
	advance()
	insert("B", 2) // after the marks: not known to be relayed
	cleanup("deleted 5 rows")
	if rows("A") != 0 || rows("B") != 2 {
		t.Fatalf("after the slot passed the marks: A %d (want 0), B %d (want 2)", rows("A"), rows("B"))
	}
	cleanup("deleted 0 rows") // the slot has not passed the mark taken after B
	advance()
	// A fence below the slot: something other than pgoutbox moved it, and
	// cleanup deletes nothing by its position.
	f.exec(t, "UPDATE "+replication.DefaultStateTable+" SET stopped_lsn = '0/1' WHERE slot_name = $1", f.slot)
	f.waitHorizon(t)
	r := invoke(cmdCleanup, []string{"--retention", "0s", "--marks-table", "public.cleanup_marks"}, env)
	if r.code != exitRuntime || !strings.Contains(r.stderr, "past 0/1, the furthest the last pgoutbox session on it may have confirmed") || rows("B") != 2 {
		t.Fatalf("cleanup with the slot past the fence: want exit 1 saying so, and B kept (%d of 2):\n%s", rows("B"), r)
	}
	// No state row: what was relayed cannot be told either.
	f.exec(t, "DELETE FROM "+replication.DefaultStateTable+" WHERE slot_name = $1", f.slot)
	r = invoke(cmdCleanup, []string{"--retention", "0s", "--marks-table", "public.cleanup_marks"}, env)
	if r.code != exitRuntime || !strings.Contains(r.stderr, "has no row for slot") || rows("B") != 2 {
		t.Fatalf("cleanup without a state row: want exit 1 saying so, and B kept (%d of 2):\n%s", rows("B"), r)
	}
	if err := replication.WriteState(ctx, f.conn, replication.DefaultStateTable, replication.State{Slot: f.slot, Note: "a test's stand-in"}); err != nil {
		t.Fatal(err)
	}
	cleanup("deleted 2 rows")
	if rows("B") != 0 {
		t.Fatalf("after the slot passed the mark after B: B %d, want 0", rows("B"))
	}
	// Without a state table nothing records a slot made again, a catalog
	// change or a slot moved: refused unless asked for.
	insert("C", 1)
	// (In the file: an empty PGOUTBOX_POSTGRES_STATE_TABLE is refused.)
	noState := append(slices.Clone(env), "PGOUTBOX_CONFIG="+writeFile(t, "postgres:\n  state.table: \"\"\n"))
	r = invoke(cmdCleanup, []string{"--retention", "0s", "--marks-table", "public.cleanup_marks"}, noState)
	if r.code != exitConfig || !strings.Contains(r.stderr, "--without-state-table") || rows("C") != 1 {
		t.Fatalf("cleanup without a state table: want exit 2 naming --without-state-table, and C kept:\n%s", r)
	}
	if r = invoke(cmdCleanup, []string{"--retention", "0s", "--marks-table", "public.cleanup_marks", "--without-state-table"}, noState); r.code != exitOK {
		t.Fatalf("cleanup --without-state-table: want exit 0:\n%s", r)
	}
	f.exec(t, "SELECT pg_drop_replication_slot($1)", f.slot)
	r = invoke(cmdCleanup, []string{"--retention", "0s", "--marks-table", "public.cleanup_marks"}, env)
	if r.code != exitRuntime || !strings.Contains(r.stderr, "does not exist") {
		t.Fatalf("cleanup without the slot: want exit 1 saying so:\n%s", r)
	}
}
