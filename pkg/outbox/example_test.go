package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/pkg/outbox"
)

// Write an order and its OrderCreated event in one pgx transaction.
func ExampleWriter_Write() {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, os.Getenv("PGOUTBOX_POSTGRES_DSN"))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close(ctx)

	// One Writer serves the whole program; the zero Config inserts into
	// public.outbox with Debezium's column names.
	w, err := outbox.NewWriter(outbox.Config{})
	if err != nil {
		log.Fatal(err)
	}

	tx, err := conn.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx) // a no-op after Commit

	if _, err := tx.Exec(ctx, "INSERT INTO orders (id, total) VALUES ($1, $2)", 42, 1200); err != nil {
		log.Fatal(err)
	}
	ev, err := outbox.NewEvent("Order", "42", "OrderCreated", map[string]any{"id": 42, "total": 1200})
	if err != nil {
		log.Fatal(err)
	}
	ids, err := w.Write(ctx, tx, ev)
	if err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("event", ids[0], "goes to topic outbox.event.Order with key 42")
}

// Write with database/sql, here through pgx's driver (import
// _ "github.com/jackc/pgx/v5/stdlib"), as a table-less outbox: the events
// are logical decoding messages, and no outbox table is needed.
func ExampleWriter_WriteSQL() {
	ctx := context.Background()
	db, err := sql.Open("pgx", os.Getenv("PGOUTBOX_POSTGRES_DSN"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	w, err := outbox.NewWriter(outbox.Config{Mode: outbox.ModeMessage})
	if err != nil {
		log.Fatal(err)
	}

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()

	if _, err := tx.ExecContext(ctx, "UPDATE orders SET status = 'shipped' WHERE id = $1", 42); err != nil {
		log.Fatal(err)
	}
	// Several events in one call take one statement.
	shipped, _ := outbox.NewEvent("Order", "42", "OrderShipped", map[string]any{"carrier": "DHL"})
	notified, _ := outbox.NewEvent("Customer", "7", "CustomerNotified", map[string]any{"order": 42})
	ids, err := w.WriteSQL(ctx, tx, shipped, notified)
	if err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
	fmt.Println("events", ids)
}

// A consumer applies each event at most once: it records the event id in
// the same transaction as its own change, and skips ids recorded before.
func ExampleDedup() {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, os.Getenv("PGOUTBOX_POSTGRES_DSN"))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close(ctx)

	d, err := outbox.NewDedup(outbox.DedupConfig{Consumer: "shipping"})
	if err != nil {
		log.Fatal(err)
	}
	if err := d.EnsureSchema(ctx, conn); err != nil {
		log.Fatal(err)
	}

	// handle is called for every delivered record; eventID is its "id"
	// header. Commit the Kafka offset only after handle returns nil.
	handle := func(eventID string, orderID int) error {
		tx, err := conn.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx)
		first, err := d.Process(ctx, tx, eventID)
		if err != nil {
			return err
		}
		if !first {
			return nil // processed before: skip
		}
		if _, err := tx.Exec(ctx, "INSERT INTO shipments (order_id) VALUES ($1)", orderID); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}

	id := outbox.NewID()
	for range 2 { // the same event delivered twice creates one shipment
		if err := handle(id, 42); err != nil {
			log.Fatal(err)
		}
	}
}

func ExampleNewEvent() {
	type orderCreated struct {
		ID    int    `json:"id"`
		Total int    `json:"total"`
		Note  string `json:"note,omitempty"`
	}
	ev, err := outbox.NewEvent("Order", "42", "OrderCreated", orderCreated{ID: 42, Total: 1200})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s %s %s %s\n", ev.AggregateType, ev.AggregateID, ev.Type, ev.Payload)
	// Output: Order 42 OrderCreated {"id":42,"total":1200}
}
