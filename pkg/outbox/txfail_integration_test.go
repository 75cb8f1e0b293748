package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// A call that fails without a database error (an invalid event refused
// before anything is sent, rows a trigger kept out) must still leave a
// transaction that cannot commit: an application that commits after the
// error (as our own snippets once showed) would otherwise keep its business
// change and lose the event, without a word.
func TestCommitAfterAFailedWriteFails(t *testing.T) {
	for _, drv := range drivers {
		t.Run(drv.name, func(t *testing.T) {
			ctx := testContext(t)
			dsn, admin := newDatabase(t)
			createOutboxTable(t, admin, "public.outbox")
			mustExec(t, admin, `CREATE TABLE orders (id int PRIMARY KEY)`)
			mustExec(t, admin, `CREATE FUNCTION public.skip() RETURNS trigger LANGUAGE plpgsql AS $$
				BEGIN IF NEW.aggregateid = 'skip' THEN RETURN NULL; END IF; RETURN NEW; END $$`)
			mustExec(t, admin, `CREATE TRIGGER skip BEFORE INSERT ON public.outbox FOR EACH ROW EXECUTE FUNCTION public.skip()`)
			d, err := NewDedup(DedupConfig{Consumer: "c"})
			if err != nil {
				t.Fatal(err)
			}
			if err := d.EnsureSchema(ctx, admin); err != nil {
				t.Fatal(err)
			}
			conn := drv.open(t, dsn)
			cancelled, cancel := context.WithCancel(ctx)
			cancel()
			cases := []struct {
				name string
				ctx  context.Context
				call func(ctx context.Context, tx testTx, w *Writer) error
			}{
				{"empty aggregate id", ctx, func(ctx context.Context, tx testTx, w *Writer) error {
					_, err := tx.write(ctx, w, Event{AggregateType: "Order"})
					return err
				}},
				{"payload not JSON, id with quotes and dollars", ctx, func(ctx context.Context, tx testTx, w *Writer) error {
					_, err := tx.write(ctx, w, Event{ID: `x'$pgoutbox$;%\`, AggregateType: "Order", AggregateID: "1", Payload: json.RawMessage(`{x`)})
					return err
				}},
				{"invalid event, context cancelled", cancelled, func(ctx context.Context, tx testTx, w *Writer) error {
					_, err := tx.write(ctx, w, Event{AggregateType: "Order", AggregateID: "1\xff"})
					return err
				}},
				{"row kept out by a trigger", ctx, func(ctx context.Context, tx testTx, w *Writer) error {
					_, err := tx.write(ctx, w, Event{AggregateType: "Order", AggregateID: "1"}, Event{AggregateType: "Order", AggregateID: "skip"})
					return err
				}},
				{"dedup with an empty id", ctx, func(ctx context.Context, tx testTx, w *Writer) error {
					_, err := tx.process(ctx, d, "")
					return err
				}},
			}
			order := 0
			for _, c := range cases {
				for _, mode := range []Mode{ModeTable, ModeMessage} {
					if c.name == "row kept out by a trigger" && mode == ModeMessage {
						continue
					}
					w := mustWriter(t, Config{Mode: mode})
					tx, err := conn.begin(ctx)
					if err != nil {
						t.Fatal(err)
					}
					order++
					if err := tx.exec(ctx, `INSERT INTO orders VALUES ($1)`, order); err != nil {
						t.Fatal(err)
					}
					if err := c.call(c.ctx, tx, w); err == nil {
						t.Fatalf("%s (%s): the call succeeded", c.name, mode)
					}
					// Both drivers (pgx, and database/sql through pgx's
					// stdlib) say so as pgx.ErrTxCommitRollback.
					if err := tx.commit(ctx); !errors.Is(err, pgx.ErrTxCommitRollback) {
						t.Errorf("%s (%s): Commit after the failed call returned %v, want pgx.ErrTxCommitRollback", c.name, mode, err)
					}
				}
			}
			if n := count(t, admin, "orders"); n != 0 {
				t.Fatalf("%d business changes committed without their event", n)
			}
			if n := count(t, admin, "public.outbox"); n != 0 {
				t.Fatalf("%d events committed by transactions whose Write failed", n)
			}
		})
	}
}

// The statement that makes a transaction fail raises its own SQLSTATE with
// the reason in its message, whatever characters the reason holds.
func TestFailTxStatementRaisesTheReason(t *testing.T) {
	ctx := testContext(t)
	_, admin := newDatabase(t)
	cause := errors.New("outbox: event 0 (id x'$pgoutbox$;%\\ \n ä'): payload is not valid JSON")
	_, err := admin.Exec(ctx, failTxStatement(cause))
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != SQLStateWriteFailed {
		t.Fatalf("error = %v, want SQLSTATE %s", err, SQLStateWriteFailed)
	}
	if !strings.Contains(pgErr.Message, "payload is not valid JSON") || !strings.Contains(pgErr.Message, "must not commit") {
		t.Fatalf("message %q does not name the reason", pgErr.Message)
	}
}
