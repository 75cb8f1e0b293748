package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func mustDedup(t *testing.T, cfg DedupConfig) *Dedup {
	t.Helper()
	d, err := NewDedup(cfg)
	if err != nil {
		t.Fatalf("NewDedup: %v", err)
	}
	return d
}

// processIn runs Process in a transaction of its own and commits or rolls
// it back.
func processIn(t *testing.T, conn testConn, d *Dedup, id string, commit bool) bool {
	t.Helper()
	ctx := testContext(t)
	tx, err := conn.begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	first, err := tx.process(ctx, d, id)
	if err != nil {
		t.Fatalf("process %s: %v", id, err)
	}
	if commit {
		err = tx.commit(ctx)
	} else {
		err = tx.rollback(ctx)
	}
	if err != nil {
		t.Fatal(err)
	}
	return first
}

func TestDedupSkipsAnEventProcessedInAnEarlierTransaction(t *testing.T) {
	for _, drv := range drivers {
		t.Run(drv.name, func(t *testing.T) {
			ctx := testContext(t)
			dsn, admin := newDatabase(t)
			d := mustDedup(t, DedupConfig{})
			for range 2 { // EnsureSchema is idempotent
				if drv.name == "pgx" {
					if err := d.EnsureSchema(ctx, admin); err != nil {
						t.Fatal(err)
					}
				} else {
					db, err := sql.Open(sqlDriverName, dsn)
					if err != nil {
						t.Fatal(err)
					}
					err = d.EnsureSchemaSQL(ctx, db)
					_ = db.Close()
					if err != nil {
						t.Fatal(err)
					}
				}
			}
			conn := drv.open(t, dsn)
			id := NewID()
			if !processIn(t, conn, d, id, true) {
				t.Fatal("first delivery: first = false")
			}
			if processIn(t, conn, d, id, true) {
				t.Fatal("second delivery: first = true")
			}

			// A transaction that rolls back records nothing.
			other := NewID()
			if !processIn(t, conn, d, other, false) {
				t.Fatal("first delivery of another event: first = false")
			}
			if !processIn(t, conn, d, other, true) {
				t.Fatal("delivery after a rollback: first = false")
			}

			// Another consumer processes the same event once too.
			d2 := mustDedup(t, DedupConfig{Consumer: "billing"})
			if !processIn(t, conn, d2, id, true) || processIn(t, conn, d2, id, true) {
				t.Fatal("a second consumer does not process the event exactly once")
			}

			var n int
			if err := admin.QueryRow(ctx, `SELECT count(*) FROM public.processed_events WHERE event_id = $1`, id).Scan(&n); err != nil || n != 2 {
				t.Fatalf("%d records of %s (%v), want one per consumer", n, id, err)
			}

			tx, err := conn.begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.process(ctx, d, ""); !errors.Is(err, ErrEmptyEventID) {
				t.Fatalf("empty id: %v", err)
			}
			_ = tx.rollback(ctx)
		})
	}
	var d Dedup
	if _, err := d.Process(context.Background(), nil, "x"); !errors.Is(err, ErrNoTx) {
		t.Fatalf("nil pgx.Tx: %v", err)
	}
	if _, err := d.ProcessSQL(context.Background(), nil, "x"); !errors.Is(err, ErrNoTx) {
		t.Fatalf("nil *sql.Tx: %v", err)
	}
}

// TestDedupConcurrentDuplicateDeliveryHasOneWinner delivers the same event
// to two consumers at once, each on its own connection, each holding its
// transaction open for a while after Process: exactly one applies the
// change, and the balance shows it was applied once per event.
func TestDedupConcurrentDuplicateDeliveryHasOneWinner(t *testing.T) {
	for _, drv := range drivers {
		t.Run(drv.name, func(t *testing.T) {
			ctx := testContext(t)
			dsn, admin := newDatabase(t)
			d := mustDedup(t, DedupConfig{Table: "processed"})
			if err := d.EnsureSchema(ctx, admin); err != nil {
				t.Fatal(err)
			}
			mustExec(t, admin, `CREATE TABLE balance (n int NOT NULL)`)
			mustExec(t, admin, `INSERT INTO balance VALUES (0)`)
			conns := []testConn{drv.open(t, dsn), drv.open(t, dsn)}

			const rounds = 10
			for round := range rounds {
				id := NewID()
				var (
					wg     sync.WaitGroup
					start  = make(chan struct{})
					firsts = make([]bool, len(conns))
					errs   = make([]error, len(conns))
				)
				for i, conn := range conns {
					wg.Add(1)
					go func() {
						defer wg.Done()
						<-start
						firsts[i], errs[i] = consume(ctx, conn, d, id)
					}()
				}
				close(start)
				wg.Wait()
				if err := errors.Join(errs...); err != nil {
					t.Fatalf("round %d: %v", round, err)
				}
				if firsts[0] == firsts[1] {
					t.Fatalf("round %d: first = %v for both deliveries, want exactly one true", round, firsts)
				}
			}
			var n int
			if err := admin.QueryRow(ctx, `SELECT n FROM balance`).Scan(&n); err != nil || n != rounds {
				t.Fatalf("balance %d (%v), want %d: a change was applied twice or not at all", n, err, rounds)
			}
		})
	}
}

// consume is a consumer's handling of one delivery: record the id, apply
// the change if it is new, commit.
func consume(ctx context.Context, conn testConn, d *Dedup, id string) (bool, error) {
	tx, err := conn.begin(ctx)
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.rollback(ctx) }()
	first, err := tx.process(ctx, d, id)
	if err != nil {
		return false, err
	}
	if first {
		if err := tx.exec(ctx, `UPDATE balance SET n = n + 1`); err != nil {
			return false, err
		}
	}
	// Hold the transaction open so that the other delivery's Process
	// arrives while this one is undecided.
	time.Sleep(30 * time.Millisecond)
	return first, tx.commit(ctx)
}

func TestDedupEnsureSchemaIsSafeFromSeveralSessionsAtOnce(t *testing.T) {
	dsn, _ := newDatabase(t)
	ctx := testContext(t)
	const sessions = 4
	conns := make([]*pgx.Conn, sessions)
	for i := range conns {
		conns[i] = connect(t, dsn)
	}
	for round := range 5 {
		d := mustDedup(t, DedupConfig{Table: fmt.Sprintf("public.processed_%d", round)})
		var wg sync.WaitGroup
		errs := make([]error, sessions)
		start := make(chan struct{})
		for i, conn := range conns {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				errs[i] = d.EnsureSchema(ctx, conn)
			}()
		}
		close(start)
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
	}
}

func TestDedupPruneDeletesOnlyOldRecordsOfItsConsumer(t *testing.T) {
	ctx := testContext(t)
	dsn, admin := newDatabase(t)
	a := mustDedup(t, DedupConfig{Consumer: "a"})
	b := mustDedup(t, DedupConfig{Consumer: "b"})
	if err := a.EnsureSchema(ctx, admin); err != nil {
		t.Fatal(err)
	}
	conn := openPgx(t, dsn)
	id := NewID()
	processIn(t, conn, a, id, true)
	processIn(t, conn, b, id, true)

	if n, err := a.Prune(ctx, admin, time.Now().Add(-time.Hour)); err != nil || n != 0 {
		t.Fatalf("prune before an hour ago: %d, %v; want 0", n, err)
	}
	if n, err := a.Prune(ctx, admin, time.Now().Add(time.Hour)); err != nil || n != 1 {
		t.Fatalf("prune consumer a: %d, %v; want 1", n, err)
	}
	db, err := sql.Open(sqlDriverName, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if n, err := b.PruneSQL(ctx, db, time.Now().Add(time.Hour)); err != nil || n != 1 {
		t.Fatalf("prune consumer b: %d, %v; want 1", n, err)
	}
	if !processIn(t, conn, a, id, true) {
		t.Fatal("after pruning, the event is not new again")
	}
}

// TestDedupConflictOnAnotherIndexIsAnError: EnsureSchema keeps a table
// that already exists, whatever its shape. Process inserted with a bare ON
// CONFLICT DO NOTHING, which any unique index satisfies: with a table
// keyed on event_id alone, consumer "shipping" was told that an event
// consumer "billing" had processed was processed already, and skipped it
// without a word (found by a review). The conflict is now the
// (consumer, event_id) key's only: such a table is an error, and each
// consumer is told an event is new once.
func TestDedupConflictOnAnotherIndexIsAnError(t *testing.T) {
	dsn, admin := newDatabase(t)
	ctx := testContext(t)
	mustExec(t, admin, `CREATE TABLE public.keyed_by_event (consumer text NOT NULL, event_id text PRIMARY KEY, processed_at timestamptz NOT NULL DEFAULT now())`)
	conn := openPgx(t, dsn)
	billing := mustDedup(t, DedupConfig{Table: "public.keyed_by_event", Consumer: "billing"})
	shipping := mustDedup(t, DedupConfig{Table: "public.keyed_by_event", Consumer: "shipping"})
	if err := billing.EnsureSchema(ctx, admin); err != nil {
		t.Fatal(err)
	}
	// Billing, then shipping, process E-100: on such a table shipping's
	// insert conflicts on event_id alone, and it was told "not first".
	for _, d := range []*Dedup{billing, shipping} {
		tx, err := conn.begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		first, err := tx.process(ctx, d, "E-100")
		if err == nil {
			_ = tx.commit(ctx)
			t.Fatalf("%s on a table keyed on event_id alone: first = %v and no error; want an error (an event is skipped where first is false)", d.cfg.Consumer, first)
		}
		_ = tx.rollback(ctx)
		t.Logf("refused: %v", err)
	}

	// With the table EnsureSchema makes, both consumers process it.
	ok := mustDedup(t, DedupConfig{Table: "public.processed_ok", Consumer: "billing"})
	okShipping := mustDedup(t, DedupConfig{Table: "public.processed_ok", Consumer: "shipping"})
	if err := ok.EnsureSchema(ctx, admin); err != nil {
		t.Fatal(err)
	}
	if !processIn(t, conn, ok, "E-100", true) || !processIn(t, conn, okShipping, "E-100", true) {
		t.Fatal("a consumer was told E-100 was processed before it processed it")
	}
	if processIn(t, conn, okShipping, "E-100", true) {
		t.Fatal("shipping was told E-100 was new twice")
	}
}
