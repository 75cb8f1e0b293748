package main

import (
	"strings"
	"testing"

	"github.com/pgoutbox/pgoutbox/pkg/testenv"
	"github.com/pgoutbox/pgoutbox/replication"
)

// migrated runs pgoutbox migrate on f: the publication, the state table,
// the slot and its first state row (with the fence at the slot).
func (f *fixture) migrated(t *testing.T) []string {
	t.Helper()
	env := f.environ(f.dsn)
	if r := invoke(cmdMigrate, nil, env); r.code != exitOK || !strings.Contains(r.stdout, "ready at") {
		t.Fatalf("migrate:\n%s", r)
	}
	return env
}

// TestValidateFailsOnASlotMovedWhileStopped: a slot advanced past the
// recorded fence while no pgoutbox session held it is refused by run
// (ErrSlotAdvanced); validate fails with run's message, and migrate does
// not call the slot ready.
func TestValidateFailsOnASlotMovedWhileStopped(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	env := f.migrated(t)
	f.exec(t, `INSERT INTO public.outbox VALUES (gen_random_uuid(), 'a', '1', 't', '{}')`)
	f.exec(t, "SELECT pg_replication_slot_advance($1, pg_current_wal_lsn())", f.slot)

	r := invoke(cmdValidate, nil, env)
	if r.code != exitRuntime {
		t.Fatalf("want exit %d:\n%s", exitRuntime, r)
	}
	wantLine(t, r, `^FAIL start: pgoutbox run refuses to start: replication: the slot was moved on while pgoutbox was stopped: slot "`+f.slot+`" is at [0-9A-F/]+, past [0-9A-F/]+ where pgoutbox first recorded it .*SET stopped_lsn = NULL`)

	r = invoke(cmdMigrate, nil, env)
	if r.code != exitRuntime {
		t.Fatalf("migrate: want exit %d:\n%s", exitRuntime, r)
	}
	noLine(t, r, `ready at`)
	wantLine(t, r, `^slot `+f.slot+` at [0-9A-F/]+ is not ready: pgoutbox run refuses to start on it: replication: the slot was moved on while pgoutbox was stopped`)
}

// TestValidateFailsOnAnOutboxTableTakenOutOfThePublicationAndPutBack: the
// membership change run refuses (ErrCatalogChanged) fails validate with
// run's message.
func TestValidateFailsOnAnOutboxTableTakenOutOfThePublicationAndPutBack(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	env := f.migrated(t)
	f.exec(t, "ALTER PUBLICATION "+f.publication+" DROP TABLE public.outbox")
	f.exec(t, "ALTER PUBLICATION "+f.publication+" ADD TABLE public.outbox")

	r := invoke(cmdValidate, nil, env)
	if r.code != exitRuntime {
		t.Fatalf("want exit %d:\n%s", exitRuntime, r)
	}
	wantLine(t, r, `^FAIL start: pgoutbox run refuses to start: replication: stopped streaming from publication "`+f.publication+`": .*public\.outbox.*pgoutbox migrate --accept-catalog`)
}

// TestValidateFailsForARoleWithoutRightsOnTheStateTable: run stops at
// start with permission denied on the state table; validate names the
// privileges missing.
func TestValidateFailsForARoleWithoutRightsOnTheStateTable(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.migrated(t)
	role := strings.ToLower(testenv.UniqueName(t, "devd_nostate"))
	f.exec(t, "CREATE ROLE "+role+" LOGIN REPLICATION")
	f.exec(t, "GRANT SELECT ON public.outbox TO "+role)
	t.Cleanup(func() {
		f.exec(t, "DROP OWNED BY "+role)
		f.exec(t, "DROP ROLE "+role)
	})

	r := invoke(cmdValidate, nil, f.environ(withPassword(t, f.dsn, role)))
	if r.code != exitRuntime {
		t.Fatalf("want exit %d:\n%s", exitRuntime, r)
	}
	assertNoSecret(t, r)
	wantLine(t, r, `^FAIL state table public\.pgoutbox_state: "`+role+`" lacks SELECT, INSERT, UPDATE on it: .*permission denied`)
	wantLine(t, r, `^  fix: as the table's owner: GRANT SELECT, INSERT, UPDATE ON "public"\."pgoutbox_state" TO "?`+role+`"?;$`)
}

// TestValidateFailsOnAPublicationOfTheStateTablesSchema: a publication FOR
// TABLES IN SCHEMA public carries the default state table, whose writes run
// then decodes as a table that is not an outbox table, and stops on at
// every start.
func TestValidateFailsOnAPublicationOfTheStateTablesSchema(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ddl, err := replication.StateTableDDL("public.pgoutbox_state")
	if err != nil {
		t.Fatal(err)
	}
	f.exec(t, ddl)
	f.exec(t, "CREATE PUBLICATION "+f.publication+" FOR TABLES IN SCHEMA public")
	f.exec(t, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", f.slot)

	r := invoke(cmdValidate, nil, f.environ(f.dsn))
	if r.code != exitRuntime {
		t.Fatalf("want exit %d:\n%s", exitRuntime, r)
	}
	wantLine(t, r, `^FAIL state table public\.pgoutbox_state: table public\.pgoutbox_state \(OID \d+\) is in publication "`+f.publication+`" but is not an outbox table in postgres\.table\.include\.list`)
}
