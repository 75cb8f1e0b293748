// Command outbox-pgx writes an order and its OrderCreated event in one pgx
// transaction with package outbox, and prints the event's id.
//
//	PGOUTBOX_POSTGRES_DSN=postgres://user:pass@localhost:5432/shop go run ./examples/outbox-pgx
//	go run ./examples/outbox-pgx -mode message
//
// It creates its orders table and the outbox table in Debezium's shape, in
// every mode (-mode message writes no row to the latter; `pgoutbox migrate`
// creates it, with the publication, in a real deployment). In the modes
// whose events only the WAL holds (-mode message and
// -mode table-delete-after-insert) the write is refused unless the
// database has a logical replication slot, such as the one `pgoutbox
// migrate` makes: make it first.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/pkg/outbox"
)

const schema = `
CREATE TABLE IF NOT EXISTS orders (
    id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    customer text   NOT NULL,
    total    bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS public.outbox (
    id            uuid         PRIMARY KEY,
    aggregatetype varchar(255) NOT NULL,
    aggregateid   varchar(255) NOT NULL,
    type          varchar(255) NOT NULL,
    payload       jsonb,
    created_at    timestamptz  NOT NULL DEFAULT now()
);`

func main() {
	mode := outbox.ModeTable
	flag.TextVar(&mode, "mode", outbox.ModeTable, "how to record the event: table, table-delete-after-insert or message")
	flag.Parse()
	if err := run(mode); err != nil {
		log.Fatal(err)
	}
}

func run(mode outbox.Mode) error {
	dsn := os.Getenv("PGOUTBOX_POSTGRES_DSN")
	if dsn == "" {
		return fmt.Errorf("set PGOUTBOX_POSTGRES_DSN, e.g. postgres://user:pass@localhost:5432/shop")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, schema); err != nil {
		return fmt.Errorf("create tables: %w", err)
	}

	w, err := outbox.NewWriter(outbox.Config{Mode: mode})
	if err != nil {
		return err
	}

	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) // a no-op after Commit

	// The business change...
	var orderID int64
	err = tx.QueryRow(ctx, `INSERT INTO orders (customer, total) VALUES ($1, $2) RETURNING id`, "alice", 1200).Scan(&orderID)
	if err != nil {
		return fmt.Errorf("insert order: %w", err)
	}
	// ...and its event, in the same transaction: both commit or neither.
	ev, err := outbox.NewEvent("Order", fmt.Sprint(orderID), "OrderCreated", map[string]any{
		"id": orderID, "customer": "alice", "total": 1200,
	})
	if err != nil {
		return err
	}
	ids, err := w.Write(ctx, tx, ev)
	if err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	fmt.Printf("order %d created; event %s (%s) goes to topic outbox.event.Order\n", orderID, ids[0], mode)
	return nil
}
