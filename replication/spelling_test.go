package replication_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/pgoutbox/pgoutbox/pkg/testenv"
	"github.com/pgoutbox/pgoutbox/replication"
)

// TestOutboxTableSpeltInAnotherCaseIsNamed: Debezium matches
// table.include.list in either case, and a real Debezium 3.6.1 relayed
// table public.r41a_o1 listed as public.R41A_O1. pgoutbox names tables as
// they are spelt and refused it, saying to create the outbox table: a
// second one, for a table that exists (a black-box review). The refusal
// now names the table spelt otherwise, when pgoutbox makes the
// publication and when it finds one.
func TestOutboxTableSpeltInAnotherCaseIsNamed(t *testing.T) {
	env := testenv.Require(t)
	dsn := env.NewDatabase(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `CREATE TABLE orders_outbox (id uuid PRIMARY KEY, aggregatetype text, aggregateid text, type text, payload jsonb)`); err != nil {
		t.Fatal(err)
	}
	for _, existing := range []bool{false, true} {
		pub := "spelt_new"
		if existing {
			pub = "spelt_existing"
			if _, err := conn.Exec(ctx, `CREATE PUBLICATION spelt_existing FOR TABLE orders_outbox`); err != nil {
				t.Fatal(err)
			}
		}
		cfg := replication.DefaultConfig()
		cfg.DSN, cfg.Slot, cfg.Publication, cfg.Tables = dsn, "spelt", pub, []string{"public.Orders_Outbox"}
		_, err := replication.Prepare(ctx, cfg, zap.NewNop())
		if err == nil || !strings.Contains(err.Error(), "public.Orders_Outbox names no table, and public.orders_outbox is spelt otherwise") {
			t.Fatalf("publication existing %v: %v; want the refusal to name public.orders_outbox", existing, err)
		}
	}
}
