package main

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

// TestPollKeepTriggersFiringInOriginModeOnlyAreWarnedUntilMigrate: keep
// triggers as earlier versions made them fire in origin mode only, and a
// session with session_replication_role = replica deletes unpublished
// rows unchecked. status (exit 0: not a problem that stops the relay) and
// validate warn, naming the fix; migrate run again turns them to ALWAYS
// with an ALTER alone, and says so.
func TestPollKeepTriggersFiringInOriginModeOnlyAreWarnedUntilMigrate(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	env := f.environ(f.dsn, "PGOUTBOX_RELAY_SOURCE=poll")
	if r := invoke(cmdMigrate, nil, env); r.code != exitOK {
		t.Fatalf("migrate:\n%s", r)
	}
	f.exec(t, "ALTER TABLE public.outbox ENABLE TRIGGER pgoutbox_keep_unpublished, ENABLE TRIGGER pgoutbox_keep_unpublished_truncate")

	r := invoke(cmdStatus, []string{"--format", "json"}, env)
	if r.code != exitOK {
		t.Fatalf("status with keep triggers firing in origin mode only: want exit 0:\n%s", r)
	}
	var st pollStatus
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatalf("status JSON: %v\n%s", err, r)
	}
	if !slices.Equal(st.Table.NotAlwaysKeep, []string{"pgoutbox_keep_unpublished", "pgoutbox_keep_unpublished_truncate"}) || len(st.Problems) != 0 {
		t.Fatalf("status: %+v, want both keep triggers named as not firing always, and no problem", st)
	}
	r = invoke(cmdStatus, nil, env)
	wantLine(t, r, `^  keep_triggers +present; WARNING: the keep trigger\(s\) pgoutbox_keep_unpublished and pgoutbox_keep_unpublished_truncate of public.outbox fire in origin mode only: .*run pgoutbox migrate`)
	r = invoke(cmdValidate, nil, env)
	wantLine(t, r, `^WARN poll keep triggers: the keep trigger\(s\) pgoutbox_keep_unpublished and pgoutbox_keep_unpublished_truncate of public.outbox fire in origin mode only`)

	// The ALTER takes its lock as the rest of migrate does: waiting at
	// most --lock-timeout behind a claim that waits on Kafka.
	claim := f.connectAs(t, "deve-claim")
	if _, err := claim.Exec(context.Background(), "BEGIN; UPDATE public.outbox SET attempts = attempts WHERE published_at IS NULL"); err != nil {
		t.Fatal(err)
	}
	r = invoke(cmdMigrate, []string{"--lock-timeout", "50ms"}, env)
	if _, err := claim.Exec(context.Background(), "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	if r.code != exitRuntime {
		t.Fatalf("migrate under an open claim: want exit 1:\n%s", r)
	}
	wantLine(t, r, `no lock on it in 5 attempts of lock_timeout 50ms, needed to add ENABLE ALWAYS of trigger pgoutbox_keep_unpublished, ENABLE ALWAYS of trigger pgoutbox_keep_unpublished_truncate; nothing was changed`)

	r = invoke(cmdMigrate, nil, env)
	if r.code != exitOK || !strings.Contains(r.stdout, "added ENABLE ALWAYS of trigger pgoutbox_keep_unpublished, ENABLE ALWAYS of trigger pgoutbox_keep_unpublished_truncate") {
		t.Fatalf("migrate again: want exit 0 naming the ENABLE ALWAYS:\n%s", r)
	}
	if n := f.count(t, "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'public.outbox'::regclass AND tgname LIKE 'pgoutbox_keep_unpublished%' AND tgenabled = 'A'"); n != 2 {
		t.Fatalf("%d of the 2 keep triggers fire always after migrate", n)
	}
	r = invoke(cmdValidate, nil, env)
	wantLine(t, r, `^PASS poll keep triggers: `)
	r = invoke(cmdStatus, nil, env)
	wantLine(t, r, `^  keep_triggers +present$`)
}
