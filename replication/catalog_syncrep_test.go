package replication_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/pgoutbox/pkg/testenv"
	"github.com/pgoutbox/pgoutbox/replication"
)

// TestReadCatalogWaitsForCommittedTransactionsNotYetVisible holds a DDL
// between its commit and its visibility the way synchronous replication
// does, on a server of its own (synchronous_standby_names names a standby
// that never connects, so a commit waits for it for good): the DDL takes
// the outbox table out of the publication, its commit record is in WAL
// (before any WAL position read after it), and a new snapshot still counts
// it as running. A catalog read then must not report the table as
// published as of a position past that commit: it waits, and when its
// context ends it fails naming the transaction. Once the wait is released,
// the read sees the DDL. (The test's role is a superuser: it sees other
// sessions' waits.)
func TestReadCatalogWaitsForCommittedTransactionsNotYetVisible(t *testing.T) {
	env := testenv.Require(t)
	p := env.NewPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dsn := p.ServerDSN(p.PrimaryPort, "postgres")
	connect := func() *pgx.Conn {
		c, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
		return c
	}
	admin := connect()
	if _, err := admin.Exec(ctx, `CREATE TABLE outbox (id uuid, payload text); CREATE TABLE probe (n int);
		CREATE PUBLICATION sync_pub FOR TABLE outbox`); err != nil {
		t.Fatal(err)
	}
	cfg := replication.DefaultConfig()
	cfg.Publication, cfg.Tables = "sync_pub", []string{"public.outbox"}
	reader := connect()
	if cat, err := replication.ReadCatalog(ctx, reader, cfg); err != nil || !cat.Tables[0].Published {
		t.Fatalf("before: %+v, %v; want the table published", cat, err)
	}

	if _, err := admin.Exec(ctx, "ALTER SYSTEM SET synchronous_standby_names = 'phantom'"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	released := false
	release := func() {
		if released {
			return
		}
		released = true
		if _, err := admin.Exec(ctx, "ALTER SYSTEM RESET synchronous_standby_names"); err != nil {
			t.Error(err)
		}
		if _, err := admin.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
			t.Error(err)
		}
	}
	defer func() { release(); wg.Wait() }() // before the connections are closed
	// waitsForStandby says whether the backend pid waits for the standby.
	waitsForStandby := func(pid uint32) bool {
		var n int
		err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event = 'SyncRep'", pid).Scan(&n)
		return err == nil && n == 1
	}
	// Commits wait once the server has taken the setting in: probe with
	// inserts until one waits (the ones before it commit at once).
	var probes []chan error
	testenv.Eventually(t, time.Minute, 50*time.Millisecond, func() (bool, string) {
		c := connect()
		done := make(chan error, 1)
		pid := c.PgConn().PID()
		wg.Add(1)
		go func() { defer wg.Done(); _, err := c.Exec(ctx, "INSERT INTO probe VALUES (1)"); done <- err }()
		for i := 0; i < 20; i++ {
			select {
			case <-done:
				return false, "a commit did not wait for the synchronous standby"
			case <-time.After(10 * time.Millisecond):
			}
			if waitsForStandby(pid) {
				probes = append(probes, done)
				return true, ""
			}
		}
		return false, "a commit neither ended nor waited for the standby"
	})

	ddl := connect()
	ddlDone := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, err := ddl.Exec(ctx, "ALTER PUBLICATION sync_pub DROP TABLE outbox")
		ddlDone <- err
	}()
	testenv.Eventually(t, 30*time.Second, 10*time.Millisecond, func() (bool, string) {
		return waitsForStandby(ddl.PgConn().PID()), "the DDL's commit does not wait for the standby"
	})
	// The DDL's commit record is in WAL (it waits for the standby to
	// confirm it): the position a read takes now is past it.

	rctx, rcancel := context.WithTimeout(ctx, time.Second)
	cat, err := replication.ReadCatalog(rctx, reader, cfg)
	rcancel()
	if err == nil {
		t.Fatalf("a catalog read while the DDL's commit was invisible passed: %+v (published %v as of %s, past the DDL's commit)",
			cat.Tables[0], cat.Tables[0].Published, cat.CheckedAt)
	}
	if !strings.Contains(err.Error(), "not visible yet") || !strings.Contains(err.Error(), "synchronous_standby_names") {
		t.Errorf("the read failed with %v; want it to say which transactions are not visible yet, and why", err)
	}

	release()
	for _, ch := range append(probes, ddlDone) {
		select {
		case err := <-ch:
			if err != nil {
				t.Fatal(err)
			}
		case <-ctx.Done():
			t.Fatal("a commit still waits after synchronous_standby_names was reset")
		}
	}
	cat, err = replication.ReadCatalog(ctx, reader, cfg)
	if err != nil || cat.Tables[0].Published {
		t.Fatalf("after the DDL is visible: %s, %v; want the table unpublished", fmt.Sprintf("%+v", cat.Tables[0]), err)
	}
	if cat.SyncStandby != "" {
		t.Errorf("no walsender streams from slot %q, yet the catalog says it is a synchronous standby: %q", cfg.Slot, cat.SyncStandby)
	}

	// A replication connection on the slot that synchronous_standby_names
	// takes in: every commit would wait for it, and a check for them.
	cfg.Slot = "sync_slot"
	if _, err := admin.Exec(ctx, "SELECT pg_create_logical_replication_slot('sync_slot', 'pgoutput')"); err != nil {
		t.Fatal(err)
	}
	rconn, err := pgconn.Connect(ctx, dsn+"&replication=database&application_name=relay_sync")
	if err != nil {
		t.Fatal(err)
	}
	defer rconn.Close(context.Background())
	if err := pglogrepl.StartReplication(ctx, rconn, "sync_slot", 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names 'sync_pub'"}}); err != nil {
		t.Fatal(err)
	}
	// A walsender that never reported a flush position counts as
	// asynchronous: report the slot's, as pgoutbox does.
	var confirmed string
	if err := admin.QueryRow(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'sync_slot'").Scan(&confirmed); err != nil {
		t.Fatal(err)
	}
	lsn, err := pglogrepl.ParseLSN(confirmed)
	if err != nil {
		t.Fatal(err)
	}
	if err := pglogrepl.SendStandbyStatusUpdate(ctx, rconn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: lsn, WALFlushPosition: lsn, WALApplyPosition: lsn}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, "ALTER SYSTEM SET synchronous_standby_names = 'relay_sync'"); err != nil {
		t.Fatal(err)
	}
	released = false
	if _, err := admin.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, 20*time.Millisecond, func() (bool, string) {
		cat, err = replication.ReadCatalog(ctx, reader, cfg)
		return err == nil && cat.SyncStandby != "", fmt.Sprintf("the catalog does not say the slot's walsender is a synchronous standby (%q, %v)", cat.SyncStandby, err)
	})
	if p := strings.Join(cat.Problems(cfg), "; "); !strings.Contains(p, `slot "sync_slot" is a synchronous standby (relay_sync `) {
		t.Errorf("problems %q; want the synchronous standby named", p)
	}
}
