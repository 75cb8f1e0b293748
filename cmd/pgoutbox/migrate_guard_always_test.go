package main

import (
	"context"
	"strings"
	"testing"
)

// TestMigrateGuardRefusesInReplicaMode: event triggers fire by default only
// in sessions whose session_replication_role is origin, and in one set to
// replica (a superuser's, pg_restore --disable-triggers, pglogical) the
// guard refused nothing: the publication stopped publishing inserts, and
// an insert in that window never reached Kafka. migrate --guard makes its
// event triggers fire always; validate warns about a guard that fires in
// origin mode only (as earlier versions installed it), and migrate --guard
// run again fixes it.
func TestMigrateGuardRefusesInReplicaMode(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	env := f.environ(f.dsn)
	guard := func() {
		t.Helper()
		if r := invoke(cmdMigrate, []string{"--guard"}, env); r.code != exitOK || !strings.Contains(r.stdout, "guard installed") {
			t.Fatalf("migrate --guard:\n%s", r)
		}
	}
	refusedInReplica := func(what string) {
		t.Helper()
		f.exec(t, "SET session_replication_role = replica")
		defer f.exec(t, "RESET session_replication_role")
		for _, ddl := range []string{
			"ALTER PUBLICATION " + f.publication + " SET (publish = 'update')",
			"ALTER PUBLICATION " + f.publication + " DROP TABLE public.outbox",
		} {
			_, err := f.conn.Exec(context.Background(), ddl)
			if err == nil || !strings.Contains(err.Error(), "pgoutbox") {
				t.Fatalf("%s: %s in a replica session: %v, want the guard's refusal", what, ddl, err)
			}
		}
	}
	guard()
	refusedInReplica("after migrate --guard")
	r := invoke(cmdValidate, nil, env)
	wantLine(t, r, `^PASS guard: installed, protecting what state table\(s\) public\.pgoutbox_state record$`)

	// As an earlier version installed them.
	f.exec(t, "ALTER EVENT TRIGGER pgoutbox_guard ENABLE")
	f.exec(t, "ALTER EVENT TRIGGER pgoutbox_guard_ddl ENABLE")
	r = invoke(cmdValidate, nil, env)
	wantLine(t, r, `^WARN guard: installed, .*pgoutbox_guard, pgoutbox_guard_ddl fire in origin mode only, so a session with session_replication_role = replica is refused nothing`)
	guard()
	refusedInReplica("after migrate --guard again")
	r = invoke(cmdValidate, nil, env)
	wantLine(t, r, `^PASS guard: installed, protecting what state table\(s\) public\.pgoutbox_state record$`)
}
