package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/pkg/testenv"
	"github.com/pgoutbox/pgoutbox/replication"
)

// TestMigrateGuardRefusesToDropWhatPgoutboxStreams: after `migrate --guard`,
// dropping the outbox table, taking it out of the publication and dropping
// the publication fail with an error that says why; a session that sets
// pgoutbox.allow_outbox_ddl may.
func TestMigrateGuardRefusesToDropWhatPgoutboxStreams(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	env := f.environ(f.dsn)
	if r := invoke(cmdMigrate, []string{"--guard"}, env); r.code != exitOK || !strings.Contains(r.stdout, "guard installed") {
		t.Fatalf("migrate --guard:\n%s", r)
	}
	for _, ddl := range []string{
		"DROP TABLE public.outbox",
		"ALTER PUBLICATION " + f.publication + " DROP TABLE public.outbox",
		"DROP PUBLICATION " + f.publication,
	} {
		_, err := f.conn.Exec(context.Background(), ddl)
		if err == nil || !strings.Contains(err.Error(), "is streamed by pgoutbox") {
			t.Fatalf("%s: %v, want the guard's refusal", ddl, err)
		}
	}
	// Other tables are not the guard's business.
	f.exec(t, "CREATE TABLE public.scratch (id int)")
	f.exec(t, "DROP TABLE public.scratch")
	f.exec(t, "SET pgoutbox.allow_outbox_ddl = on")
	f.exec(t, "ALTER PUBLICATION "+f.publication+" DROP TABLE public.outbox")

	// Names that PostgreSQL quotes when it names the dropped object
	// (capitals): the guard refuses the same.
	t.Run("quoted names", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		f.exec(t, `CREATE TABLE public."Outbox" (LIKE public.outbox)`)
		f.outboxTable, f.publication = "public.Outbox", "OutboxPub" // the fixture's database is its own
		pub := `"` + f.publication + `"`
		if r := invoke(cmdMigrate, []string{"--guard"}, f.environ(f.dsn)); r.code != exitOK || !strings.Contains(r.stdout, "guard installed") {
			t.Fatalf("migrate --guard:\n%s", r)
		}
		for _, ddl := range []string{
			`DROP TABLE public."Outbox"`,
			"ALTER PUBLICATION " + pub + ` DROP TABLE public."Outbox"`,
			"DROP PUBLICATION " + pub,
		} {
			_, err := f.conn.Exec(context.Background(), ddl)
			if err == nil || !strings.Contains(err.Error(), "is streamed by pgoutbox") {
				t.Fatalf("%s: %v, want the guard's refusal", ddl, err)
			}
		}
		f.exec(t, "DROP TABLE public.outbox") // not streamed here
	})
}

// TestMigrateGuardRefusesWhatKeepsInsertsFromTheStream: after `migrate
// --guard`, the changes that keep inserts from the stream for a while and
// leave nothing a later catalog check could find, once undone, fail with
// an error that says why. PostgreSQL itself refuses SET UNLOGGED on a
// table named in a publication, not on one a FOR ALL TABLES publication
// carries, nor on a partition; it lets a table inherit from an outbox
// table, and a publication stop publishing inserts. Other tables' DDL and a
// role that may not read the state table are not the guard's business.
func TestMigrateGuardRefusesWhatKeepsInsertsFromTheStream(t *testing.T) {
	t.Parallel()
	refused := func(t *testing.T, f *fixture, want string, ddls ...string) {
		t.Helper()
		for _, ddl := range ddls {
			_, err := f.conn.Exec(context.Background(), ddl)
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("%s: %v, want the guard's refusal (%q)", ddl, err, want)
			}
		}
	}
	guard := func(t *testing.T, f *fixture) {
		t.Helper()
		if r := invoke(cmdMigrate, []string{"--guard"}, f.environ(f.dsn)); r.code != exitOK || !strings.Contains(r.stdout, "guard installed") {
			t.Fatalf("migrate --guard:\n%s", r)
		}
	}

	// partitioned is a fixture whose outbox table is partitioned by n, with
	// one partition (outbox_1, n from 0 to 10).
	partitioned := func(t *testing.T) *fixture {
		t.Helper()
		f := newFixture(t)
		f.exec(t, "DROP TABLE public.outbox")
		f.exec(t, `CREATE TABLE public.outbox (id uuid, aggregatetype text NOT NULL, aggregateid text NOT NULL,
			type text NOT NULL, payload jsonb, n int NOT NULL) PARTITION BY RANGE (n)`)
		f.exec(t, "CREATE TABLE public.outbox_1 PARTITION OF public.outbox FOR VALUES FROM (0) TO (10)")
		return f
	}

	t.Run("table", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		f.exec(t, "CREATE PUBLICATION "+f.publication+" FOR ALL TABLES")
		guard(t, f)
		refused(t, f, "unlogged", "ALTER TABLE public.outbox SET UNLOGGED")
		refused(t, f, "inherit", "CREATE TABLE public.child () INHERITS (public.outbox)")
		// A table created inside CREATE SCHEMA is a subcommand of it.
		schema := strings.ToLower(testenv.UniqueName(t, "s"))
		refused(t, f, "inherit", "CREATE SCHEMA "+schema+" CREATE TABLE "+schema+".child () INHERITS (public.outbox)")
		f.exec(t, "CREATE TABLE public.loose (LIKE public.outbox)")
		refused(t, f, "inherit", "ALTER TABLE public.loose INHERIT public.outbox")
		refused(t, f, "publishing inserts", "ALTER PUBLICATION "+f.publication+" SET (publish = 'update, delete')")
		// What keeps every insert in the stream goes on.
		f.exec(t, "ALTER TABLE public.outbox ADD COLUMN extra int")
		f.exec(t, "ALTER PUBLICATION "+f.publication+" SET (publish = 'insert, update')")
		f.exec(t, "ALTER TABLE public.loose SET UNLOGGED")
		// A role that may not read the state table still runs its DDL.
		role := strings.ToLower(testenv.UniqueName(t, "app"))
		f.exec(t, "CREATE ROLE "+role)
		f.exec(t, "GRANT CREATE ON SCHEMA public TO "+role)
		f.exec(t, "SET ROLE "+role)
		f.exec(t, "CREATE TABLE public.app_table (id int)")
		f.exec(t, "ALTER TABLE public.app_table ADD COLUMN x int")
		f.exec(t, "DROP TABLE public.app_table")
		f.exec(t, "RESET ROLE")
		// Dropping a publication of its own makes the guard read the
		// state table, which this role may not.
		f.exec(t, "DO $$BEGIN EXECUTE format('GRANT CREATE ON DATABASE %I TO "+role+"', current_database()); END$$")
		f.exec(t, "SET ROLE "+role)
		f.exec(t, "CREATE TABLE public.app_events (id int)")
		f.exec(t, "CREATE PUBLICATION "+role+"_pub FOR TABLE public.app_events")
		f.exec(t, "ALTER PUBLICATION "+role+"_pub DROP TABLE public.app_events")
		f.exec(t, "DROP PUBLICATION "+role+"_pub")
		f.exec(t, "RESET ROLE")
		f.exec(t, "SET pgoutbox.allow_outbox_ddl = on")
		f.exec(t, "ALTER TABLE public.outbox SET UNLOGGED")
		// Once the state table is gone, the guards let everything pass.
		f.exec(t, "RESET pgoutbox.allow_outbox_ddl")
		f.exec(t, "DROP TABLE public.pgoutbox_state")
		f.exec(t, "CREATE TABLE public.child () INHERITS (public.outbox)")
		f.exec(t, "DROP TABLE public.child")
		f.exec(t, "DROP PUBLICATION "+f.publication)
	})

	// A publication of the outbox's schema: the table moved elsewhere is
	// out of it. Added by name, it moves with its membership.
	t.Run("schema publication", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		f.exec(t, "CREATE PUBLICATION "+f.publication+" FOR TABLES IN SCHEMA public")
		guard(t, f)
		schema := strings.ToLower(testenv.UniqueName(t, "s"))
		f.exec(t, "CREATE SCHEMA "+schema)
		// migrate added the table by name as well: only the schema's
		// membership is left (the guard refuses that too, unless told).
		f.exec(t, "SET pgoutbox.allow_outbox_ddl = on; ALTER PUBLICATION "+f.publication+" DROP TABLE public.outbox; RESET pgoutbox.allow_outbox_ddl")
		refused(t, f, "out of the publication", "ALTER TABLE public.outbox SET SCHEMA "+schema)
		f.exec(t, "ALTER PUBLICATION "+f.publication+" ADD TABLE public.outbox")
		f.exec(t, "ALTER TABLE public.outbox SET SCHEMA "+schema)
		f.exec(t, "ALTER TABLE "+schema+".outbox SET SCHEMA public")
	})

	t.Run("foreign table", func(t *testing.T) {
		t.Parallel()
		f := partitioned(t)
		// A wrapper without handler is enough: no extension, and the
		// guard refuses before any row could be written.
		wrapper := strings.ToLower(testenv.UniqueName(t, "fdw"))
		f.exec(t, "CREATE FOREIGN DATA WRAPPER "+wrapper)
		f.exec(t, "CREATE SERVER "+wrapper+"_server FOREIGN DATA WRAPPER "+wrapper)
		t.Cleanup(func() {
			_, _ = f.conn.Exec(context.Background(), "DROP FOREIGN DATA WRAPPER "+wrapper+" CASCADE")
		})
		guard(t, f)
		refused(t, f, "makes a foreign table part of outbox table",
			"CREATE FOREIGN TABLE public.outbox_2 PARTITION OF public.outbox FOR VALUES FROM (10) TO (20) SERVER "+wrapper+"_server")
		f.exec(t, "CREATE FOREIGN TABLE public.remote (id uuid, aggregatetype text NOT NULL, aggregateid text NOT NULL, type text NOT NULL, payload jsonb, n int NOT NULL) SERVER "+wrapper+"_server")
		refused(t, f, "makes a foreign table part of outbox table", "ALTER TABLE public.outbox ATTACH PARTITION public.remote FOR VALUES FROM (20) TO (30)")
		f.exec(t, "DROP TABLE public.outbox_1 CASCADE")
	})

	t.Run("partitioned table", func(t *testing.T) {
		t.Parallel()
		f := partitioned(t)
		guard(t, f)
		refused(t, f, "unlogged",
			"ALTER TABLE public.outbox_1 SET UNLOGGED",
			"CREATE UNLOGGED TABLE public.outbox_2 PARTITION OF public.outbox FOR VALUES FROM (10) TO (20)")
		schema := strings.ToLower(testenv.UniqueName(t, "s"))
		refused(t, f, "unlogged", "CREATE SCHEMA "+schema+" CREATE UNLOGGED TABLE "+schema+".outbox_2 PARTITION OF public.outbox FOR VALUES FROM (10) TO (20)")
		f.exec(t, "CREATE SCHEMA "+schema+" CREATE TABLE "+schema+".outbox_2 PARTITION OF public.outbox FOR VALUES FROM (10) TO (20)")
		f.exec(t, "CREATE UNLOGGED TABLE public.outbox_3 (LIKE public.outbox)")
		refused(t, f, "unlogged", "ALTER TABLE public.outbox ATTACH PARTITION public.outbox_3 FOR VALUES FROM (20) TO (30)")
		f.exec(t, "CREATE TABLE public.outbox_4 PARTITION OF public.outbox FOR VALUES FROM (30) TO (40)")
	})

	// A table attached with rows in it: they were decoded as its own, so
	// never reach the stream. An empty one attached, or a partition made
	// and written into in one transaction, goes on.
	t.Run("attached with rows", func(t *testing.T) {
		t.Parallel()
		f := partitioned(t)
		guard(t, f)
		row := " (id, aggregatetype, aggregateid, type, payload, n) VALUES (gen_random_uuid(), 'a', 'k', 'T', '{}', "
		f.exec(t, "CREATE TABLE public.outbox_2 (LIKE public.outbox)")
		f.exec(t, "INSERT INTO public.outbox_2"+row+"15)")
		refused(t, f, "which holds rows", "ALTER TABLE public.outbox ATTACH PARTITION public.outbox_2 FOR VALUES FROM (10) TO (20)")
		// Written in the attaching transaction itself, before the attach.
		f.exec(t, "CREATE TABLE public.outbox_3 (LIKE public.outbox)")
		refused(t, f, "which holds rows", "INSERT INTO public.outbox_3"+row+"25); ALTER TABLE public.outbox ATTACH PARTITION public.outbox_3 FOR VALUES FROM (20) TO (30)")
		// Attached in a subtransaction (a savepoint, as ORMs nest
		// transactions), written into before in another.
		f.exec(t, "CREATE TABLE public.outbox_6 (LIKE public.outbox)")
		refused(t, f, "which holds rows", "BEGIN; SAVEPOINT a; "+"INSERT INTO public.outbox_6"+row+"65); RELEASE a; SAVEPOINT b; ALTER TABLE public.outbox ATTACH PARTITION public.outbox_6 FOR VALUES FROM (60) TO (70); RELEASE b; COMMIT")
		_, _ = f.conn.Exec(context.Background(), "ROLLBACK")
		// A partitioned table whose partition holds rows.
		f.exec(t, "CREATE TABLE public.outbox_4 (LIKE public.outbox) PARTITION BY RANGE (n)")
		f.exec(t, "CREATE TABLE public.outbox_4a PARTITION OF public.outbox_4 FOR VALUES FROM (30) TO (40)")
		f.exec(t, "INSERT INTO public.outbox_4"+row+"35)")
		refused(t, f, "which holds rows", "ALTER TABLE public.outbox ATTACH PARTITION public.outbox_4 FOR VALUES FROM (30) TO (40)")
		f.exec(t, "DELETE FROM public.outbox_3")
		f.exec(t, "ALTER TABLE public.outbox ATTACH PARTITION public.outbox_3 FOR VALUES FROM (20) TO (30)")
		f.exec(t, "INSERT INTO public.outbox"+row+"25)")
		f.exec(t, "BEGIN; CREATE TABLE public.outbox_5 PARTITION OF public.outbox FOR VALUES FROM (50) TO (60); INSERT INTO public.outbox"+row+"55); ALTER TABLE public.outbox ADD COLUMN extra int; COMMIT")
		f.exec(t, "ALTER TABLE public.outbox_2 ADD COLUMN extra int")
		f.exec(t, "SET pgoutbox.allow_outbox_ddl = on")
		f.exec(t, "ALTER TABLE public.outbox ATTACH PARTITION public.outbox_2 FOR VALUES FROM (10) TO (20)")
	})
}

// TestMigrateWaitsForAnInitialSnapshotOfTheSlot: a relay with
// snapshot.mode=initial reads the outbox while holding the snapshot's lock
// of its slot, and makes the slot where the snapshot ends. A migrate that
// made the slot meanwhile would start it after the snapshot's consistent
// point, and what was committed in between would be in neither: migrate
// waits for the lock (here held by the test, standing in for a running
// snapshot, which cannot be held open on demand), then makes the slot.
func TestMigrateWaitsForAnInitialSnapshotOfTheSlot(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	lock, err := pgx.Connect(ctx, f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close(ctx)
	if _, err := lock.Exec(ctx, "SELECT pg_advisory_lock(hashtext($1))", replication.SnapshotLock(f.slot)); err != nil {
		t.Fatal(err)
	}
	done := make(chan cmdResult, 1)
	go func() { done <- invoke(cmdMigrate, nil, f.environ(f.dsn)) }()
	// migrate waits on the lock, with no slot made.
	testenv.Eventually(t, time.Minute, 20*time.Millisecond, func() (bool, string) {
		var waiting int
		err := f.conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgoutbox-migrate' AND wait_event_type = 'Lock' AND wait_event = 'advisory'").Scan(&waiting)
		return err == nil && waiting == 1, fmt.Sprintf("migrate does not wait on the snapshot's lock (%d, %v)", waiting, err)
	})
	var slots int
	if err := f.conn.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1", f.slot).Scan(&slots); err != nil || slots != 0 {
		t.Fatalf("%d slots named %s while the snapshot's lock is held (%v)", slots, f.slot, err)
	}
	if _, err := lock.Exec(ctx, "SELECT pg_advisory_unlock(hashtext($1))", replication.SnapshotLock(f.slot)); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.code != exitOK || !strings.Contains(r.stdout, "slot "+f.slot+" ready") || !strings.Contains(r.stdout, "waiting for the initial snapshot of slot "+f.slot) {
			t.Fatalf("migrate after the snapshot:\n%s", r)
		}
	case <-time.After(time.Minute):
		t.Fatal("migrate did not end within a minute of the lock's release")
	}
}

// TestMigrateGuardOfASecondDeploymentKeepsTheFirstProtected: the event
// triggers have one name per database, so the guard of a second deployment
// (another postgres.state.table, publication and outbox table) replaced the
// first one's, and DDL that breaks the first stream went through. Installed
// by both, in either order, the guard protects what both state tables
// record, and validate names both.
func TestMigrateGuardOfASecondDeploymentKeepsTheFirstProtected(t *testing.T) {
	t.Parallel()
	a := newFixture(t)
	b := *a
	b.slot, b.publication, b.outboxTable = testenv.UniqueName(t, "slotb"), testenv.UniqueName(t, "pubb"), "public.outbox_b"
	a.exec(t, "CREATE TABLE public.outbox_b (LIKE public.outbox INCLUDING ALL)")
	envA := a.environ(a.dsn)
	envB := b.environ(b.dsn, "PGOUTBOX_POSTGRES_STATE_TABLE=public.pgoutbox_state_b")
	guard := func(env []string) {
		t.Helper()
		if r := invoke(cmdMigrate, []string{"--guard"}, env); r.code != exitOK || !strings.Contains(r.stdout, "guard installed") {
			t.Fatalf("migrate --guard:\n%s", r)
		}
	}
	refused := func(ddls ...string) {
		t.Helper()
		for _, ddl := range ddls {
			_, err := a.conn.Exec(context.Background(), ddl)
			if err == nil || !strings.Contains(err.Error(), "is streamed by pgoutbox") {
				t.Fatalf("%s: %v, want the guard's refusal", ddl, err)
			}
		}
	}
	guard(envA)
	guard(envB)
	refused("ALTER PUBLICATION "+a.publication+" DROP TABLE public.outbox", "DROP PUBLICATION "+a.publication,
		"ALTER PUBLICATION "+b.publication+" DROP TABLE public.outbox_b")
	if _, err := a.conn.Exec(context.Background(), "ALTER TABLE public.outbox SET UNLOGGED"); err == nil {
		t.Fatal("ALTER TABLE public.outbox SET UNLOGGED went through after the second deployment's guard")
	}
	// Again by the first: the second stays protected.
	guard(envA)
	refused("ALTER PUBLICATION "+b.publication+" DROP TABLE public.outbox_b", "DROP PUBLICATION "+b.publication,
		"ALTER PUBLICATION "+a.publication+" DROP TABLE public.outbox")

	for _, env := range [][]string{envA, envB} {
		r := invoke(cmdValidate, nil, env)
		wantLine(t, r, `^PASS guard: installed, protecting what state table\(s\) public\.pgoutbox_state, public\.pgoutbox_state_b record$`)
	}
	// A third configuration's state table is not among them: validate
	// says so.
	r := invoke(cmdValidate, nil, a.environ(a.dsn, "PGOUTBOX_POSTGRES_STATE_TABLE=public.pgoutbox_state_c"))
	wantLine(t, r, `^WARN guard: installed, .*not postgres\.state\.table public\.pgoutbox_state_c`)

	// A guard installed by an earlier version keeps no list: its body
	// names its one state table, which the next install keeps.
	t.Run("guard of an earlier version", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		f.exec(t, `CREATE FUNCTION public.pgoutbox_guard() RETURNS event_trigger LANGUAGE plpgsql AS $g$
BEGIN
	IF to_regclass('"public"."old_state"') IS NULL THEN
		RETURN;
	END IF;
END
$g$`)
		f.exec(t, "CREATE EVENT TRIGGER pgoutbox_guard ON sql_drop EXECUTE FUNCTION public.pgoutbox_guard()")
		f.exec(t, "CREATE EVENT TRIGGER pgoutbox_guard_ddl ON ddl_command_end EXECUTE FUNCTION public.pgoutbox_guard()")
		r := invoke(cmdMigrate, []string{"--guard"}, f.environ(f.dsn))
		if r.code != exitOK || !strings.Contains(r.stdout, "state table(s) public.pgoutbox_state, public.old_state record") {
			t.Fatalf("migrate --guard over an earlier version's guard:\n%s", r)
		}
	})
}
