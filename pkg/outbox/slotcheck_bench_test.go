package outbox

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// BenchmarkSlotCheck measures what the check for a logical slot (and, in
// ModeTableDeleteAfterInsert, for a publication of the table) costs the
// statements of ModeMessage and ModeTableDeleteAfterInsert, against the
// real server: each iteration runs two transactions of a business insert
// and one event, as an application writes, one with the writer's
// statements and one with the same statements without the check, in
// alternating order so that the machine's other load falls on both alike.
// It reports each one's mean time (check-ns/txn, none-ns/txn) and the
// difference (extra-%). synchronous_commit is off so that the flush does
// not hide the difference. pgx caches the prepared statements, as it does
// by default, so this is the cost of executing the check, not of planning
// it (a driver that plans every statement pays that too).
//
//	PGOUTBOX_REQUIRE_INTEGRATION=1 go test -run '^$' -bench SlotCheck -benchtime 5000x ./pkg/outbox/
func BenchmarkSlotCheck(b *testing.B) {
	env := testenv.Require(b)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, env.NewDatabase(b))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = conn.Close(context.Background()) })
	for _, sql := range []string{
		`CREATE TABLE public.outbox (id uuid PRIMARY KEY, aggregatetype varchar(255) NOT NULL, aggregateid varchar(255) NOT NULL,
			type varchar(255) NOT NULL, payload jsonb, created_at timestamptz NOT NULL DEFAULT now())`,
		`CREATE TABLE orders (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, total int NOT NULL)`,
		`CREATE PUBLICATION bench_pub FOR TABLE public.outbox WITH (publish = 'insert')`,
		`SET synchronous_commit = off`,
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			b.Fatal(err)
		}
	}
	// (NewDatabase's cleanup drops the slot with the database.)
	if _, err := conn.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, testenv.UniqueName(b, "bench")); err != nil {
		b.Fatal(err)
	}
	ev := Event{AggregateType: "Order", AggregateID: "42", Type: "OrderCreated", Payload: []byte(`{"total":12,"customer":"customer-42"}`)}
	for _, mode := range []Mode{ModeMessage, ModeTableDeleteAfterInsert} {
		w := mustWriter(b, Config{Mode: mode})
		// txn runs one transaction, with the check or without, and
		// returns how long it took.
		txn := func(check bool) time.Duration {
			start := time.Now()
			id := NewID()
			tx, err := conn.Begin(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO orders (total) VALUES (12)`); err != nil {
				b.Fatal(err)
			}
			var queries []string
			var args [][]any
			if mode == ModeMessage {
				q, a := w.messageStatement([]Event{ev}, []string{id})
				if !check {
					q = strings.TrimSuffix(q, " WHERE "+logicalSlotExists)
				}
				queries, args = append(queries, q), append(args, a)
			} else {
				q, a := w.insertStatement([]Event{ev}, []string{id})
				queries, args = append(queries, q), append(args, a)
				q, a = w.deleteStatement([]string{id})
				if !check {
					q, a = "DELETE FROM "+w.table+` WHERE "id" IN ($1)`, a[:1]
				}
				queries, args = append(queries, q), append(args, a)
			}
			for i, q := range queries {
				tag, err := tx.Exec(ctx, q, args[i]...)
				if err != nil {
					b.Fatal(err)
				}
				if tag.RowsAffected() == 0 {
					b.Fatalf("%s: no row (the slot lost?)", q)
				}
			}
			if err := tx.Commit(ctx); err != nil {
				b.Fatal(err)
			}
			return time.Since(start)
		}
		b.Run(mode.String(), func(b *testing.B) {
			var with, without time.Duration
			i := 0
			for b.Loop() {
				if i%2 == 0 {
					with += txn(true)
					without += txn(false)
				} else {
					without += txn(false)
					with += txn(true)
				}
				i++
			}
			b.ReportMetric(float64(with.Nanoseconds())/float64(i), "check-ns/txn")
			b.ReportMetric(float64(without.Nanoseconds())/float64(i), "none-ns/txn")
			b.ReportMetric(100*(float64(with)/float64(without)-1), "extra-%")
		})
	}
}
