package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/pkg/relay"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
	"github.com/pgoutbox/pgoutbox/replication"
)

// TestSharedMessagePrefixIsWarnedOf: table-less messages belong to no
// table, and every slot of the database decodes them, so a second team's
// relay with the default messages.prefix put the first team's messages in
// its own topics, without a word (a reviewer showed it). run's audit and
// validate warn when another slot's last session, through another
// publication, relayed the same prefix; slots of one publication (regions
// relaying the same events) are not named.
func TestSharedMessagePrefixIsWarnedOf(t *testing.T) {
	env := testenv.Require(t)
	ctx := context.Background()
	dsn := env.NewDatabase(t)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	const table = "public.pgoutbox_state"
	if err := replication.EnsureStateTable(ctx, conn, table); err != nil {
		t.Fatal(err)
	}
	record := func(slot, publication, prefix string) {
		t.Helper()
		if _, err := conn.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", slot); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = conn.Exec(context.Background(), "SELECT pg_drop_replication_slot($1)", slot) })
		st := replication.State{Slot: slot, SystemIdentifier: "1", Database: "db", Timeline: 1, ConfirmedAt: time.Now(), SessionStartedAt: time.Now(),
			Publication: publication, MessagesPrefix: prefix, MessagesRecorded: true}
		if err := replication.WriteState(ctx, conn, table, st); err != nil {
			t.Fatal(err)
		}
	}
	record("billing", "billing_pub", "outbox")
	record("billing_eu", "orders_pub", "outbox") // the same publication as the relay checked: a region
	record("audit", "audit_pub", "audit")
	cfg := relay.DefaultConfig()
	cfg.Postgres.Slot, cfg.Postgres.Publication, cfg.Postgres.StateTable = "orders", "orders_pub", table
	r, ok := checkSharedPrefix(ctx, conn, cfg)
	if !ok || r.Status != checkWarn || !strings.Contains(r.Detail, `"billing" (publication "billing_pub")`) ||
		strings.Contains(r.Detail, "billing_eu") || strings.Contains(r.Detail, "audit") || !strings.Contains(r.Fix, "messages.prefix") {
		t.Fatalf("check: %v %+v; want a warning naming slot billing alone, with the fix", ok, r)
	}
	cfg.Messages.Prefix = "orders"
	if r, ok := checkSharedPrefix(ctx, conn, cfg); ok {
		t.Fatalf("a prefix of its own: %+v", r)
	}
	cfg.Messages.Prefix = "outbox"
	if _, err := conn.Exec(ctx, "SELECT pg_drop_replication_slot('billing')"); err != nil {
		t.Fatal(err)
	}
	if r, ok := checkSharedPrefix(ctx, conn, cfg); ok {
		t.Fatalf("the other slot dropped: %+v", r)
	}
}
