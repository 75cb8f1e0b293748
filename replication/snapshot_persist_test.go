package replication_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/pgoutbox/pkg/testenv"
	"github.com/pgoutbox/pgoutbox/replication"
)

// TestPersistOverASlotMadeMeanwhileIsDuplicateObject: a slot made by
// something else while an initial snapshot was read starts after the
// snapshot's consistent point. Persist must fail on it with PostgreSQL's
// duplicate_object (42710), which the relay turns into a stop: it must not
// go on to stream from that slot, which would skip what was committed in
// between.
func TestPersistOverASlotMadeMeanwhileIsDuplicateObject(t *testing.T) {
	env := testenv.Require(t)
	ctx := context.Background()
	dsn := env.NewDatabase(t)
	conn := testenv.ConnectPG(t, dsn)
	cfg := replication.DefaultConfig()
	cfg.DSN, cfg.Slot = dsn, strings.ToLower(testenv.UniqueName(t, "p"))
	snap, err := replication.CreateSnapshotSlot(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer snap.Close(ctx)
	if _, err := conn.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", cfg.Slot); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = conn.Exec(context.Background(), "SELECT pg_drop_replication_slot($1)", cfg.Slot) })
	_, err = replication.Persist(ctx, conn, snap.Name, snap.ConsistentPoint, cfg.Slot)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "42710" {
		t.Fatalf("Persist over an existing slot: %v; want PostgreSQL's 42710", err)
	}
}
