// Command outbox-consumer shows a consumer that applies each outbox event at
// most once with outbox.Dedup, although Kafka may deliver it more than once.
// It needs no Kafka: it simulates the same OrderCreated event (same "id"
// header) arriving twice and shows that the second delivery is skipped.
//
//	PGOUTBOX_POSTGRES_DSN=postgres://user:pass@localhost:5432/shipping go run ./examples/outbox-consumer
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/pkg/outbox"
)

// delivery is what a Kafka consumer would hand over: the record's "id"
// header and value.
type delivery struct {
	EventID string
	Value   []byte
}

type orderCreated struct {
	ID       int64  `json:"id"`
	Customer string `json:"customer"`
}

func main() {
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() error {
	dsn := os.Getenv("PGOUTBOX_POSTGRES_DSN")
	if dsn == "" {
		return fmt.Errorf("set PGOUTBOX_POSTGRES_DSN, e.g. postgres://user:pass@localhost:5432/shipping")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())

	d, err := outbox.NewDedup(outbox.DedupConfig{Consumer: "shipping"})
	if err != nil {
		return err
	}
	if err := d.EnsureSchema(ctx, conn); err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS shipments (
		order_id bigint PRIMARY KEY,
		customer text   NOT NULL
	)`); err != nil {
		return fmt.Errorf("create shipments: %w", err)
	}

	// One event, delivered twice (say the consumer crashed after its commit
	// but before committing its Kafka offset).
	value, _ := json.Marshal(orderCreated{ID: time.Now().UnixNano(), Customer: "alice"})
	ev := delivery{EventID: outbox.NewID(), Value: value}
	for i := 1; i <= 2; i++ {
		applied, err := handle(ctx, conn, d, ev)
		if err != nil {
			return err
		}
		if applied {
			fmt.Printf("delivery %d of event %s: shipment created\n", i, ev.EventID)
		} else {
			fmt.Printf("delivery %d of event %s: already processed, skipped\n", i, ev.EventID)
		}
	}
	return nil
}

// handle processes one delivery in one transaction: record the event id,
// and apply the change only if the id is new. Both commit together, so a
// crash in between leaves neither, and the redelivery is applied then.
// A real consumer commits its Kafka offset after handle returns nil.
func handle(ctx context.Context, conn *pgx.Conn, d *outbox.Dedup, m delivery) (applied bool, err error) {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer tx.Rollback(ctx) // a no-op after Commit

	first, err := d.Process(ctx, tx, m.EventID)
	if err != nil {
		return false, err
	}
	if !first {
		return false, tx.Commit(ctx)
	}
	var order orderCreated
	if err := json.Unmarshal(m.Value, &order); err != nil {
		return false, fmt.Errorf("event %s: %w", m.EventID, err)
	}
	// Without Dedup, the second delivery would fail here on the primary
	// key, or worse, apply a non-idempotent change twice.
	if _, err := tx.Exec(ctx, `INSERT INTO shipments (order_id, customer) VALUES ($1, $2)`, order.ID, order.Customer); err != nil {
		return false, fmt.Errorf("create shipment: %w", err)
	}
	return true, tx.Commit(ctx)
}
