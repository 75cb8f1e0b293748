// Command outbox-sql writes an order and its OrderCreated event in one
// database/sql transaction with package outbox, and prints the event's id.
//
//	PGOUTBOX_POSTGRES_DSN=postgres://user:pass@localhost:5432/shop go run -tags pgxstdlib ./examples/outbox-sql
//
// It uses pgx's database/sql driver, github.com/jackc/pgx/v5/stdlib, which
// needs modules (github.com/jackc/puddle/v2, golang.org/x/sync) that this
// repository's go.mod does not list yet; hence the pgxstdlib build tag. Any
// PostgreSQL driver for database/sql works the same way.
package main

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver

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
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() error {
	dsn := os.Getenv("PGOUTBOX_POSTGRES_DSN")
	if dsn == "" {
		return fmt.Errorf("set PGOUTBOX_POSTGRES_DSN, e.g. postgres://user:pass@localhost:5432/shop")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, schema); err != nil {
		return fmt.Errorf("create tables: %w", err)
	}

	// Insert and delete in the same transaction: the outbox table stays
	// empty, and the relay still sees the insert in the WAL. Only the WAL
	// holds the event, so the write is refused unless the database has a
	// logical replication slot (make the relay's first: pgoutbox migrate).
	w, err := outbox.NewWriter(outbox.Config{Mode: outbox.ModeTableDeleteAfterInsert})
	if err != nil {
		return err
	}

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() // a no-op after Commit

	var orderID int64
	err = tx.QueryRowContext(ctx, `INSERT INTO orders (customer, total) VALUES ($1, $2) RETURNING id`, "bob", 800).Scan(&orderID)
	if err != nil {
		return fmt.Errorf("insert order: %w", err)
	}
	ev, err := outbox.NewEvent("Order", fmt.Sprint(orderID), "OrderCreated", map[string]any{
		"id": orderID, "customer": "bob", "total": 800,
	})
	if err != nil {
		return err
	}
	ids, err := w.WriteSQL(ctx, tx, ev)
	if err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	fmt.Printf("order %d created; event %s goes to topic outbox.event.Order\n", orderID, ids[0])
	return nil
}
