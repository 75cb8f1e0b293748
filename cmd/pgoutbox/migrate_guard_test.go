package main

import (
	"context"
	"strings"
	"testing"
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
}
