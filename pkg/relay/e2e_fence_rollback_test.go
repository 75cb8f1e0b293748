package relay_test

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/pkg/outboxtest"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// TestRollbackToAVersionWithoutTheFenceIsNotRefused: pgoutbox rolled back
// to a version from before the fence (stopped_lsn), then forward again.
// The old version confirms on, recording its position (confirmed_lsn)
// every few seconds, and never moves the fence the newer version left: so
// every start forward again found the slot past the fence and refused,
// for good (exit 1; an upgrade prober's finding with the real binary of
// 2026-12-01; nothing was lost). This version's sessions raise the fence
// before they confirm past it, so a row recording a position above its
// fence says a session of such a version ran since: the start goes on,
// silently when the slot is where that session recorded it, with a warning
// and cleanup held when it is further. A slot moved by something else,
// which records nothing, is still refused.
//
// The old version's session is emulated by what it writes (the state
// row's instance, session start and confirmed position) and the slot's
// position its confirmations leave (pg_replication_slot_advance); the
// real binary was the prober's oracle (real PostgreSQL and Kafka).
func TestRollbackToAVersionWithoutTheFenceIsNotRefused(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 1)
	ctx := context.Background()
	c := env.NewConsumer(t, f.topics)
	relayed(t, f, c, "first.log", 61, 5)
	// oldSession: the old version's session, which confirmed up to the
	// end of WAL and recorded that position last.
	oldSession := func() {
		t.Helper()
		at := f.queryLSN(t, "SELECT pg_current_wal_lsn()::text")
		if _, err := f.checkDB.Exec(ctx, "SELECT pg_replication_slot_advance($1, $2::pg_lsn)", f.slot, at.String()); err != nil {
			t.Fatal(err)
		}
		if _, err := f.checkDB.Exec(ctx, `UPDATE pgoutbox_state SET instance = 'old-version/4242/rollback', session_started_at = now(),
			confirmed_lsn = $2::pg_lsn, confirmed_at = now() WHERE slot_name = $1`, f.slot, at.String()); err != nil {
			t.Fatal(err)
		}
	}

	// The old version's session, its position recorded where it stopped.
	writeTxns(t, outboxtest.NewWriter(f.conn, "outbox", f.shape, 62), 3)
	oldSession()
	p := startBinary(t, f, "second.log")
	if lines := p.logLines(t, "versions from before the fence"); len(lines) != 0 {
		t.Fatalf("warned with the slot where the old version recorded it: %s", lines[0])
	}
	if hold := f.cleanupHold(t); hold != "" {
		t.Fatalf("cleanup held with the slot where the old version recorded it: %q", hold)
	}
	w := outboxtest.NewWriter(f.conn, "outbox", f.shape, 63)
	writeTxns(t, w, 5)
	waitAll(t, c, w, time.Minute)
	p.terminate(t, time.Minute)

	// The old version confirmed past its last record: a warning.
	writeTxns(t, outboxtest.NewWriter(f.conn, "outbox", f.shape, 64), 3)
	oldSession()
	writeTxns(t, outboxtest.NewWriter(f.conn, "outbox", f.shape, 65), 2)
	if _, err := f.checkDB.Exec(ctx, "SELECT pg_replication_slot_advance($1, pg_current_wal_lsn())", f.slot); err != nil {
		t.Fatal(err)
	}
	stat := exec.Command(pgoutboxBinary(t), "status")
	stat.Env = f.environ()
	if out, err := stat.CombinedOutput(); err != nil || strings.Contains(string(out), "was advanced while no pgoutbox session held it") {
		t.Fatalf("status after the rollback: %v\n%s", err, out)
	}
	p = startBinary(t, f, "third.log")
	if lines := p.logLines(t, "versions from before the fence"); len(lines) != 1 || !strings.Contains(lines[0], "old-version/4242/rollback") {
		t.Fatalf("want one warning naming the old version's session, got %q", lines)
	}
	// Something else may have moved it past that record: cleanup waits
	// for someone to look, as after the other warned starts.
	if hold := f.cleanupHold(t); !strings.Contains(hold, "from before the fence") {
		t.Fatalf("cleanup hold after the warned start: %q", hold)
	}
	w = outboxtest.NewWriter(f.conn, "outbox", f.shape, 66)
	writeTxns(t, w, 5)
	waitAll(t, c, w, time.Minute)
	p.terminate(t, time.Minute)

	// A slot moved by something else after this version's session (no
	// record of it): refused, as before.
	writeTxns(t, outboxtest.NewWriter(f.conn, "outbox", f.shape, 67), 3)
	if _, err := f.checkDB.Exec(ctx, "SELECT pg_replication_slot_advance($1, pg_current_wal_lsn())", f.slot); err != nil {
		t.Fatal(err)
	}
	stat = exec.Command(pgoutboxBinary(t), "status")
	stat.Env = f.environ()
	if out, err := stat.CombinedOutput(); err == nil || !strings.Contains(string(out), "was advanced while no pgoutbox session held it") {
		t.Fatalf("status with the slot moved by something else: %v\n%s", err, out)
	}
	startRefused(t, f, "fourth.log", "with the slot moved on while pgoutbox was stopped", f.slot, "was advanced while no pgoutbox session held it")
}
