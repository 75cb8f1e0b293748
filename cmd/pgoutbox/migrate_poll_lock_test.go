package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/migrations"
	"github.com/pgoutbox/pgoutbox/poll"
)

// connectAs opens a connection to the fixture's database with the given
// application_name, closed when the test ends.
func (f *fixture) connectAs(t *testing.T, app string) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["application_name"] = app
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// invokeAsync runs a command in the background; its result arrives on the
// channel.
func invokeAsync(cmd func(args, environ []string, stdout, stderr io.Writer) int, args, environ []string) <-chan cmdResult {
	done := make(chan cmdResult, 1)
	go func() { done <- invoke(cmd, args, environ) }()
	return done
}

// TestPollMigrateTakesNoLockWhenNothingIsMissingAndBoundsItsWait: upgrading
// users run migrate while the relays run, and a poll relay's claim
// transaction (here one held open, as while it waits on Kafka) holds a
// lock on the table. Migrate of a table that has everything takes no lock
// that waits for it, and an application's INSERT meanwhile goes through;
// when something is missing, migrate waits for its lock at most
// --lock-timeout a bounded number of times, then fails naming the table
// and the session holding it, with nothing changed.
func TestPollMigrateTakesNoLockWhenNothingIsMissingAndBoundsItsWait(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	env := f.environ(f.dsn, "PGOUTBOX_RELAY_SOURCE=poll")
	if r := invoke(cmdMigrate, nil, env); r.code != exitOK {
		t.Fatalf("first migrate:\n%s", r)
	}
	f.exec(t, `INSERT INTO public.outbox (id, aggregatetype, aggregateid, type, payload) VALUES (gen_random_uuid(), 'order', 'a', 'created', '{}')`)

	// A claim that waits on Kafka: its transaction holds ROW EXCLUSIVE.
	claim := f.connectAs(t, "devb-claim")
	claimOpen := true
	endClaim := func() {
		if claimOpen {
			claimOpen = false
			if _, err := claim.Exec(ctx, "ROLLBACK"); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Cleanup(endClaim)
	if _, err := claim.Exec(ctx, "BEGIN; UPDATE public.outbox SET attempts = attempts WHERE published_at IS NULL"); err != nil {
		t.Fatal(err)
	}

	done := invokeAsync(cmdMigrate, nil, env)
	var r cmdResult
	finished := false
	select {
	case r = <-done:
		finished = true
	case <-time.After(500 * time.Millisecond):
		// Still running: it waits for a lock, and INSERTs queue behind it.
	}
	writer := f.connectAs(t, "devb-writer")
	if _, err := writer.Exec(ctx, `SET statement_timeout = '3s'; INSERT INTO public.outbox (id, aggregatetype, aggregateid, type, payload) VALUES (gen_random_uuid(), 'order', 'b', 'created', '{}')`); err != nil {
		t.Errorf("an application INSERT while migrate ran: %v", err)
	}
	if !finished {
		select {
		case r = <-done:
		case <-time.After(10 * time.Second):
			endClaim() // let it end before the test does
			t.Fatalf("migrate of a complete table still waits 10 s after an open claim took its lock: %s", <-done)
		}
	}
	if r.code != exitOK || !strings.Contains(r.stdout, "nothing was missing, and no lock was taken") {
		t.Fatalf("migrate of a complete table under an open claim:\n%s", r)
	}

	// Something missing: the DDL waits at most --lock-timeout, 5 times.
	endClaim()
	f.exec(t, "DROP INDEX public.outbox_published_at_idx")
	claimOpen = true
	if _, err := claim.Exec(ctx, "BEGIN; UPDATE public.outbox SET attempts = attempts WHERE published_at IS NULL"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	done = invokeAsync(cmdMigrate, []string{"--lock-timeout", "200ms"}, env)
	select {
	case r = <-done:
	case <-time.After(15 * time.Second):
		endClaim()
		t.Fatalf("migrate that needs a lock held by an open claim still waits after 15 s: %s", <-done)
	}
	took := time.Since(start)
	if r.code != exitRuntime {
		t.Fatalf("migrate under an open claim with an index to add: want exit 1:\n%s", r)
	}
	wantLine(t, r, `attempt 1 of 5 got no lock on public.outbox within 200ms; trying again: held by PID \d+ \(application_name "devb-claim"`)
	wantLine(t, r, fmt.Sprintf(`poll table public.outbox: no lock on it in 5 attempts of lock_timeout 200ms, needed to add the published rows' index; nothing was changed\. sessions holding locks on it: PID %d \(application_name "devb-claim".*state "idle in transaction", transaction started .*RowExclusiveLock`, claim.PgConn().PID()))
	if took > 8*time.Second {
		t.Fatalf("migrate took %s to give up, want about 5 × 200 ms of waits and 4 × 200 ms of pauses", took)
	}
	if n := f.count(t, "SELECT count(*) FROM pg_class WHERE relname = 'outbox_published_at_idx'"); n != 0 {
		t.Fatalf("the index was made although migrate failed")
	}
	endClaim()
	r = invoke(cmdMigrate, nil, env)
	if r.code != exitOK || !strings.Contains(r.stdout, "added the published rows' index") {
		t.Fatalf("migrate once the claim ended:\n%s", r)
	}
}

// TestPollMigrateRefusesTheKeepTriggerUnderRunningRelaysThatDelete: relays
// of versions before the keep trigger delete the rows they publish
// (poll.on.publish=delete) without setting pgoutbox.delete_unpublished, so
// the trigger would skip those deletes and the rows would be resent
// forever. Migrate that would newly install it while poll relays hold the
// table's member locks refuses, naming them, unless told to go on.
func TestPollMigrateRefusesTheKeepTriggerUnderRunningRelaysThatDelete(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	env := f.environ(f.dsn, "PGOUTBOX_RELAY_SOURCE=poll", "PGOUTBOX_POLL_ON_PUBLISH=delete")
	if r := invoke(cmdMigrate, nil, env); r.code != exitOK {
		t.Fatalf("first migrate:\n%s", r)
	}
	// The table as a version before the keep trigger left it.
	dropKeep := func() {
		t.Helper()
		f.exec(t, "DROP TRIGGER "+migrations.KeepTrigger+" ON public.outbox; DROP TRIGGER "+migrations.KeepTruncateTrigger+" ON public.outbox")
	}
	dropKeep()
	hasKeep := func() bool {
		t.Helper()
		return f.count(t, "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'public.outbox'::regclass AND tgname = $1", migrations.KeepTrigger) == 1
	}

	// This simulates a poll relay of an earlier version running on the
	// table: it holds the table's member and bucket advisory locks, taken
	// as the current member code takes them (their keys are unchanged
	// since the poll source's first version).
	old := f.connectAs(t, "devb-old-relay")
	m, err := poll.Join(ctx, old, "public.outbox", 4)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Rebalance(ctx); err != nil {
		t.Fatal(err)
	}

	// Refused whatever migrate's own poll.on.publish says: the running
	// relays' may be delete (an upgrade that also switches to mark; the
	// diff reader).
	for _, e := range [][]string{env, f.environ(f.dsn, "PGOUTBOX_RELAY_SOURCE=poll")} {
		r := invoke(cmdMigrate, nil, e)
		if r.code != exitRuntime {
			t.Fatalf("migrate installing the keep trigger under a running relay that deletes on publish: want exit 1:\n%s", r)
		}
		wantLine(t, r, fmt.Sprintf(`^pgoutbox: migrate: 1 poll relay session\(s\) run on public\.outbox now \(PID %d, application_name "devb-old-relay", client 127\.0\.0\.1\), and the table has no trigger %s yet: relays of an earlier version that delete rows on publish \(poll\.on\.publish=delete, whatever this configuration says\) would have those deletes skipped by the trigger \(each row stays unpublished and is resent forever\)\. Stop them, run migrate, then start this version; or run migrate --accept-running-poll-relays to go on anyway$`,
			old.PgConn().PID(), migrations.KeepTrigger))
		if hasKeep() {
			t.Fatal("the refused migrate installed the keep trigger")
		}
	}

	r := invoke(cmdMigrate, []string{"--accept-running-poll-relays"}, env)
	if r.code != exitOK || !strings.Contains(r.stderr, "going on (--accept-running-poll-relays)") || !hasKeep() {
		t.Fatalf("migrate --accept-running-poll-relays: want exit 0, a warning and the trigger:\n%s", r)
	}

	// With the trigger already there, or no relay running, nothing is refused.
	if r := invoke(cmdMigrate, nil, env); r.code != exitOK {
		t.Fatalf("migrate with the trigger in place:\n%s", r)
	}
	dropKeep()
	if err := old.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if r := invoke(cmdMigrate, nil, env); r.code != exitOK || !hasKeep() {
		t.Fatalf("migrate once the relay stopped:\n%s", r)
	}
}
