package relay_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pgoutbox/pgoutbox/pkg/outboxtest"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
	"github.com/pgoutbox/pgoutbox/replication"
)

// Tests of what differs between the PostgreSQL versions pgoutbox supports
// (15 to 18). CI runs them on each version (make test on 15 and 18, make
// test-pg-others on 16 and 17); see scripts/testenv.sh.

// TestServerIsThePostgresVersionAsked names the server's version in the
// test output and fails when it is not the major version the environment
// was made for (testenv checks that in every NewDatabase too), so that a
// misconfigured run cannot test PostgreSQL 15 in the name of 18.
func TestServerIsThePostgresVersionAsked(t *testing.T) {
	env := testenv.Require(t)
	major, version := env.ServerVersion(t)
	if env.PGMajor == 0 {
		t.Logf("PostgreSQL %s (the environment does not say which major version it was made for)", version)
		return
	}
	t.Logf("PostgreSQL %s, environment made for PostgreSQL %d", version, env.PGMajor)
	if major != env.PGMajor {
		t.Fatalf("server is PostgreSQL %s, environment was made for %d", version, env.PGMajor)
	}
}

// logCapture returns a test logger that also records every entry, debug
// ones included.
func logCapture(t *testing.T) (*zap.Logger, *observer.ObservedLogs) {
	core, logs := observer.New(zap.DebugLevel)
	log := zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel), zaptest.WrapOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		return zapcore.NewTee(c, core)
	})))
	return log, logs
}

// TestAbortedTransactionsDecodedLateAreSkipped writes, while no relay reads
// the slot, transactions larger than the walsender's
// logical_decoding_work_mem (64 kB here): one that rolls back after a
// released savepoint with rows in it, and one that commits with a large
// savepoint rolled back inside it; then starts the relay. PostgreSQL 18
// answers the first with stray Stream Abort messages on the protocol v1
// stream (15 to 17 send none). Every committed row must arrive once,
// nothing rolled back may arrive, and the relay must keep streaming without
// a restart. On PostgreSQL 18 the test also checks that a stream abort did
// arrive, so that it keeps testing what it is for.
func TestAbortedTransactionsDecodedLateAreSkipped(t *testing.T) {
	env := testenv.Require(t)
	major, version := env.ServerVersion(t)
	f := newFixture(t, env, 1)
	cfg := f.config()
	cfg.Postgres.DSN = f.dsn + "&options=" + "-c%20logical_decoding_work_mem%3D64kB"
	ctx := context.Background()
	// The slot and publication first, with nothing reading the slot: the
	// walsender then decodes the transactions below after they ended.
	if _, err := replication.Prepare(ctx, cfg.Postgres, zaptest.NewLogger(t)); err != nil {
		t.Fatal(err)
	}

	aggType := f.shape.AggregateTypes[0]
	var want []string
	// insert adds n outbox rows with ~300-byte payloads and returns their ids.
	insert := func(tx pgx.Tx, n int, agg string) []string {
		t.Helper()
		ids := make([]string, n)
		for i := range ids {
			ids[i] = outboxtest.NewID()
		}
		_, err := tx.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
			SELECT id, $2, $3, 'Created', jsonb_build_object('pad', repeat('x', 300), 'n', n)
			FROM unnest($1::uuid[]) WITH ORDINALITY AS u(id, n)`, ids, aggType, agg)
		if err != nil {
			t.Fatalf("insert %d rows: %v", n, err)
		}
		return ids
	}
	exec := func(tx pgx.Tx, sql string) {
		t.Helper()
		if _, err := tx.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	txn := func(body func(tx pgx.Tx), commit bool) {
		t.Helper()
		tx, err := f.conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		body(tx)
		if commit {
			err = tx.Commit(ctx)
		} else {
			err = tx.Rollback(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
	}

	txn(func(tx pgx.Tx) { want = append(want, insert(tx, 3, "before")...) }, true)
	// Rolled back: the released subtransaction's rows are what PostgreSQL 18
	// marks as streamed when it discards the aborted transaction.
	txn(func(tx pgx.Tx) {
		exec(tx, "SAVEPOINT s")
		insert(tx, 2, "rolled-back")
		exec(tx, "RELEASE SAVEPOINT s")
		insert(tx, 3000, "rolled-back")
	}, false)
	// Committed, with a large savepoint rolled back inside.
	txn(func(tx pgx.Tx) {
		want = append(want, insert(tx, 1, "kept")...)
		exec(tx, "SAVEPOINT s")
		insert(tx, 3000, "rolled-back")
		exec(tx, "ROLLBACK TO SAVEPOINT s")
		want = append(want, insert(tx, 1, "kept")...)
	}, true)
	txn(func(tx pgx.Tx) { want = append(want, insert(tx, 3, "after")...) }, true)

	log, logs := logCapture(t)
	stop := runRelayLog(t, cfg, log)
	c := env.NewConsumer(t, f.topics)
	waitIDs(t, c, want, time.Minute)
	// The relay keeps streaming after the aborts.
	txn(func(tx pgx.Tx) { want = append(want, insert(tx, 2, "later")...) }, true)
	waitIDs(t, c, want, time.Minute)
	if err := stop(); err != nil {
		t.Fatalf("relay stopped with %v", err)
	}

	got := map[string]int{}
	for _, d := range delivered(drain(t, c, f)) {
		got[d.ID]++
	}
	for _, id := range want {
		if got[id] != 1 {
			t.Errorf("committed event %s delivered %d times", id, got[id])
		}
		delete(got, id)
	}
	for id, n := range got {
		t.Errorf("event %s, which was rolled back, delivered %d times", id, n)
	}
	aborts := logs.FilterMessage("skipping a stream abort of a transaction that was never sent").Len()
	restarts := logs.FilterMessage("stream stopped; restarting from the slot's confirmed position").Len()
	t.Logf("PostgreSQL %s sent %d stream abort(s) on the v1 stream; %d events delivered", version, aborts, len(want))
	if restarts != 0 {
		t.Errorf("the relay restarted its stream %d times", restarts)
	}
	if major >= 18 && aborts == 0 {
		t.Errorf("PostgreSQL %s sent no stray stream abort: the test no longer exercises what it was written for", version)
	}
}

// waitIDs waits until the consumer has read every id.
func waitIDs(t *testing.T, c *testenv.Consumer, ids []string, timeout time.Duration) {
	t.Helper()
	testenv.Eventually(t, timeout, 50*time.Millisecond, func() (bool, string) {
		seen := map[string]bool{}
		for _, m := range c.Messages() {
			if id, ok := m.Header("id"); ok {
				seen[string(id)] = true
			}
		}
		missing := 0
		for _, id := range ids {
			if !seen[id] {
				missing++
			}
		}
		return missing == 0, fmt.Sprintf("%d of %d events not delivered", missing, len(ids))
	})
}

// TestRelayStreamsFromAFailoverSlot: PostgreSQL 17 added failover slots
// (synchronised to standbys) and four columns to pg_replication_slots
// (failover, synced, inactive_since, invalidation_reason). A relay given a
// slot created with failover = true must use it like any other, confirm
// progress on it, and leave it a failover slot.
func TestRelayStreamsFromAFailoverSlot(t *testing.T) {
	env := testenv.Require(t)
	if major, version := env.ServerVersion(t); major < 17 {
		t.Skipf("PostgreSQL %s has no failover slots (they came with 17)", version)
	}
	f := newFixture(t, env, 3)
	ctx := context.Background()
	// The publication first: a slot made before it cannot decode the
	// changes in between with it (the relay refuses to make it then).
	f.exec(t, "CREATE PUBLICATION "+f.pub+" FOR TABLE outbox WITH (publish = 'insert', publish_via_partition_root = true)")
	if _, err := f.checkDB.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput', false, false, true)", f.slot); err != nil {
		t.Fatal(err)
	}
	before, _ := f.slotState(t)
	stop := runRelay(t, f.config())
	f.waitStreaming(t)
	w := outboxtest.NewWriter(f.conn, "outbox", f.shape, 7)
	for i := 0; i < 50; i++ {
		if err := w.Txn(ctx); err != nil {
			t.Fatal(err)
		}
	}
	c := env.NewConsumer(t, f.topics)
	waitAll(t, c, w, time.Minute)
	// The relay confirms what Kafka acknowledged: the slot moves past the
	// last commit.
	last := w.Committed[len(w.Committed)-1].TxnHigh
	testenv.Eventually(t, 30*time.Second, 50*time.Millisecond, func() (bool, string) {
		confirmed, _ := f.slotState(t)
		return confirmed >= last, fmt.Sprintf("slot confirmed %s (was %s), last commit ends by %s", confirmed, before, last)
	})
	if err := stop(); err != nil {
		t.Fatalf("relay stopped with %v", err)
	}
	rep := w.Check(delivered(drain(t, c, f)), nil)
	if !rep.OK() || rep.Duplicates != 0 {
		t.Fatalf("delivery check failed: %s", rep)
	}
	var failover, synced bool
	var invalidation *string
	err := f.checkDB.QueryRow(ctx, "SELECT failover, synced, invalidation_reason FROM pg_replication_slots WHERE slot_name = $1", f.slot).
		Scan(&failover, &synced, &invalidation)
	if err != nil {
		t.Fatal(err)
	}
	if !failover || synced || invalidation != nil {
		t.Fatalf("slot after the run: failover %v, synced %v, invalidation_reason %v; want a valid failover slot", failover, synced, invalidation)
	}
	if s, err := replication.ReadSlot(ctx, f.checkDB, f.slot); err != nil || !s.Failover || s.InvalidationReason != "" {
		t.Fatalf("ReadSlot: %+v, %v; want a valid failover slot", s, err)
	}
}
