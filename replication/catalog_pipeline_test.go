package replication_test

import (
	"context"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/pkg/testenv"
	"github.com/pgoutbox/pgoutbox/replication"
)

// countingConn counts the writes to a real server's socket: one per round
// trip the client starts.
type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c countingConn) Write(b []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(b)
}

// TestReadCatalogIsTwoRoundTripsAndOneSnapshot reads the catalog on a real
// server through a socket that counts writes: after the first read (which
// prepares the statements), a read takes two round trips however many
// tables are configured, the WAL position and then the transaction as one
// pipeline, and what it reads is the catalog as it is (a partitioned table
// with its partitions, a plain table, a table that does not exist, a
// publication that does not exist). A query that fails mid-pipeline (a
// lock held on pg_publication, with lock_timeout) fails the read by name and
// leaves the connection out of the transaction, usable for the next read.
func TestReadCatalogIsTwoRoundTripsAndOneSnapshot(t *testing.T) {
	env := testenv.Require(t)
	dsn := env.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin := connectStats(t, dsn)
	if _, err := admin.Exec(ctx, `CREATE TABLE outbox (id uuid, aggregatetype text, aggregateid text, payload jsonb, created_at timestamptz NOT NULL)
			PARTITION BY RANGE (created_at);
		CREATE TABLE outbox_a PARTITION OF outbox FOR VALUES FROM ('2026-01-01') TO ('2027-01-01');
		CREATE TABLE outbox_b PARTITION OF outbox FOR VALUES FROM ('2027-01-01') TO ('2028-01-01');
		CREATE TABLE events (id uuid, payload text);
		CREATE PUBLICATION pipe_pub FOR TABLE outbox, events`); err != nil {
		t.Fatal(err)
	}

	var writes atomic.Int64
	pcfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return countingConn{Conn: c, writes: &writes}, nil
	}
	conn, err := pgx.ConnectConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())

	cfg := replication.DefaultConfig()
	cfg.Publication, cfg.Tables = "pipe_pub", []string{"public.outbox", "public.events", "public.missing"}
	if _, err := replication.ReadCatalog(ctx, conn, cfg); err != nil {
		t.Fatal(err)
	}
	before := writes.Load()
	cat, err := replication.ReadCatalog(ctx, conn, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if n := writes.Load() - before; n != 2 {
		t.Errorf("a catalog read took %d round trips, want 2", n)
	}
	if cat.Publication == 0 || cat.CheckedAt == 0 || len(cat.Tables) != 3 {
		t.Fatalf("catalog %+v: want the publication, a WAL position and three tables", cat)
	}
	outbox, events, missing := cat.Tables[0], cat.Tables[1], cat.Tables[2]
	if outbox.Name != "public.outbox" || outbox.Kind != 'p' || !outbox.Published || len(outbox.Partitions) != 2 ||
		outbox.Partitions[0].Name != "public.outbox_a" && outbox.Partitions[1].Name != "public.outbox_a" {
		t.Errorf("partitioned table read as %+v", outbox)
	}
	if events.Name != "public.events" || events.Kind != 'r' || !events.Published || strings.Join(events.Columns, ",") != "id,payload" {
		t.Errorf("plain table read as %+v", events)
	}
	if missing.Name != "public.missing" || missing.OID != 0 || missing.Published {
		t.Errorf("missing table read as %+v", missing)
	}

	// A publication that does not exist: every table reads as unpublished.
	other := cfg
	other.Publication = "no_such_pub"
	if cat, err := replication.ReadCatalog(ctx, conn, other); err != nil || cat.Publication != 0 || cat.Tables[0].Published || cat.Tables[0].OID == 0 {
		t.Errorf("without the publication: %+v, %v; want the tables, unpublished", cat, err)
	}

	// A failure in the middle of the pipeline.
	if _, err := conn.Exec(ctx, "SET lock_timeout = '100ms'"); err != nil {
		t.Fatal(err)
	}
	locker, err := admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := locker.Exec(ctx, "LOCK TABLE pg_catalog.pg_publication IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	_, err = replication.ReadCatalog(ctx, conn, cfg)
	if err == nil || !strings.Contains(err.Error(), `read publication "pipe_pub"`) || !strings.Contains(err.Error(), "lock timeout") {
		t.Errorf("read with pg_publication locked: %v; want the lock timeout, naming the publication", err)
	}
	if s := conn.PgConn().TxStatus(); s != 'I' {
		t.Errorf("after the failed read the connection's transaction status is %q, want idle", s)
	}
	if err := locker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if cat, err := replication.ReadCatalog(ctx, conn, cfg); err != nil || len(cat.Tables) != 3 || !cat.Tables[0].Published {
		t.Errorf("the read after a failed one: %+v, %v", cat, err)
	}
}
