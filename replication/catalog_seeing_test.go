package replication_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/pkg/testenv"
	"github.com/pgoutbox/pgoutbox/replication"
)

// TestReadCatalogSeeingWaitsForTheTransaction: the relay asks a catalog
// check to see the transaction a relation it cannot classify came in (the
// stream carried it, so it committed; a check that read a WAL position
// past its commit may still have a snapshot without it). A transaction
// still running stands in here for one committed but not yet visible,
// which a real server cannot hold on demand: the read must not return
// before its snapshot sees it, and must then see what it changed.
func TestReadCatalogSeeingWaitsForTheTransaction(t *testing.T) {
	env := testenv.Require(t)
	ctx := context.Background()
	dsn := env.NewDatabase(t)
	connect := func() *pgx.Conn { return testenv.ConnectPG(t, dsn) }
	conn, ddl := connect(), connect()
	if _, err := conn.Exec(ctx, "CREATE TABLE outbox (id uuid PRIMARY KEY, payload jsonb); CREATE PUBLICATION seeing FOR TABLE outbox"); err != nil {
		t.Fatal(err)
	}
	cfg := replication.DefaultConfig()
	cfg.Publication, cfg.Tables = "seeing", []string{"public.outbox"}
	tx, err := ddl.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	if _, err := tx.Exec(ctx, "ALTER PUBLICATION seeing DROP TABLE outbox"); err != nil {
		t.Fatal(err)
	}
	var xid uint32
	if err := tx.QueryRow(ctx, "SELECT pg_current_xact_id()::text::bigint").Scan(&xid); err != nil {
		t.Fatal(err)
	}
	type result struct {
		cat replication.Catalog
		err error
	}
	done := make(chan result, 1)
	go func() {
		cat, err := replication.ReadCatalogSeeing(ctx, conn, cfg, xid)
		done <- result{cat, err}
	}()
	// While the transaction runs the read must wait: for a bounded look
	// it must not return (nothing waits on a sleep to go on; the read may
	// only return after the commit).
	deadline := time.Now().Add(300 * time.Millisecond)
	for time.Now().Before(deadline) {
		select {
		case r := <-done:
			t.Fatalf("the read returned before transaction %d was visible: published %v, err %v", xid, r.cat.Tables[0].Published, r.err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.err != nil || len(r.cat.Tables) != 1 || r.cat.Tables[0].Published {
			t.Fatalf("after the commit: %+v, %v; want the table unpublished", r.cat.Tables, r.err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the read did not return 30 s after the transaction committed")
	}
}
