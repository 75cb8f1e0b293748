// Command pgoutbox-demo writes sample orders through the outbox and prints
// the records pgoutbox delivered to Kafka. scripts/demo.sh drives it.
//
//	pgoutbox-demo topics --brokers B                  create the demo's topics
//	pgoutbox-demo orders --dsn D --brokers B [-n 20]  write orders, print the records
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/pkg/kafka"
	"github.com/pgoutbox/pgoutbox/pkg/kafka/kafkatest"
	"github.com/pgoutbox/pgoutbox/pkg/outboxtest"
)

var topics = []string{"outbox.event.Order", "outbox.event.Customer"}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: pgoutbox-demo topics|orders [flags]")
		os.Exit(2)
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	dsn := fs.String("dsn", os.Getenv("PGOUTBOX_POSTGRES_DSN"), "PostgreSQL connection string")
	brokers := fs.String("brokers", os.Getenv("PGOUTBOX_KAFKA_BROKERS"), "Kafka bootstrap servers")
	n := fs.Int("n", 20, "orders to write")
	_ = fs.Parse(os.Args[2:])
	kcfg := kafka.Config{Brokers: strings.Split(*brokers, ",")}
	var err error
	switch os.Args[1] {
	case "topics":
		err = kafka.CreateTopics(kcfg, topics, 3, 1)
		if err == nil {
			fmt.Printf("topics ready: %s\n", strings.Join(topics, ", "))
		}
	case "orders":
		err = orders(*dsn, kcfg, *n)
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "pgoutbox-demo: %v\n", err)
		os.Exit(1)
	}
}

// orders writes n orders, each in a transaction that also inserts its
// outbox event (every third also a customer event), then prints what Kafka
// holds until every event has arrived.
func orders(dsn string, kcfg kafka.Config, n int) error {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS orders (id bigserial PRIMARY KEY, customer text NOT NULL, total numeric NOT NULL)`); err != nil {
		return err
	}
	want := map[string]bool{}
	for i := 1; i <= n; i++ {
		tx, err := conn.Begin(ctx)
		if err != nil {
			return err
		}
		customer := fmt.Sprintf("customer-%d", i%4)
		var orderID int64
		if err := tx.QueryRow(ctx, "INSERT INTO orders (customer, total) VALUES ($1, $2) RETURNING id", customer, 10*i).Scan(&orderID); err != nil {
			return err
		}
		payload, _ := json.Marshal(map[string]any{"orderId": orderID, "customer": customer, "total": 10 * i})
		id := outboxtest.NewID()
		want[id] = true
		if _, err := tx.Exec(ctx, "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, 'Order', $2, 'OrderCreated', $3)", id, fmt.Sprint(orderID), payload); err != nil {
			return err
		}
		if i%3 == 0 {
			id := outboxtest.NewID()
			want[id] = true
			p, _ := json.Marshal(map[string]any{"customer": customer, "lastOrder": orderID})
			if _, err := tx.Exec(ctx, "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, 'Customer', $2, 'CustomerOrdered', $3)", id, customer, p); err != nil {
				return err
			}
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
	}
	// A rolled-back order never reaches Kafka.
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, 'Order', 'rolled-back', 'OrderCreated', '{}')", outboxtest.NewID()); err != nil {
		return err
	}
	_ = tx.Rollback(ctx)
	fmt.Printf("wrote %d orders (%d events) in %d transactions, and rolled one back\n\n", n, len(want), n)

	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	got := 0
	err = kafkatest.Tail(ctx, kcfg, topics, func(r kafkatest.Record) bool {
		if !want[r.Headers["id"]] {
			return true
		}
		delete(want, r.Headers["id"])
		got++
		fmt.Printf("%-22s p%d@%-4d key=%-12s id=%s value=%s\n", r.Topic, r.Partition, r.Offset, r.Key, r.Headers["id"], r.Value)
		return len(want) > 0
	})
	if err != nil {
		return err
	}
	if len(want) > 0 {
		return fmt.Errorf("only %d events arrived within 60 s; %d missing", got, len(want))
	}
	fmt.Printf("\nall %d events arrived in Kafka\n", got)
	return nil
}
