package outbox

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/migrations"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// TestWALOnlyModesRefuseAWriteNothingDecodes: the events of ModeMessage and
// ModeTableDeleteAfterInsert exist only in the WAL, and in a database
// without a logical replication slot nothing ever decodes them (a slot
// made later starts after them). Such a write committed and its events
// were lost without a word; now it fails, naming the database, the mode
// and what to do, and so does the Commit after it. Slots that cannot
// decode this database's WAL do not count: a physical slot, a logical one
// of another database (other tests make them in the same cluster all the
// time), a temporary one. Once a logical slot exists the same writes
// succeed.
func TestWALOnlyModesRefuseAWriteNothingDecodes(t *testing.T) {
	for _, drv := range drivers {
		for _, mode := range []Mode{ModeMessage, ModeTableDeleteAfterInsert} {
			t.Run(drv.name+"/"+mode.String(), func(t *testing.T) {
				testRefusesWithoutSlot(t, drv, mode)
			})
		}
	}
}

func testRefusesWithoutSlot(t *testing.T, drv dbDriver, mode Mode) {
	ctx := testContext(t)
	env := testenv.Require(t)
	dsn, admin := newDatabase(t)
	createOutboxTable(t, admin, "public.outbox")
	mustExec(t, admin, `CREATE TABLE orders (id int PRIMARY KEY)`)
	var database string
	if err := admin.QueryRow(ctx, `SELECT current_database()`).Scan(&database); err != nil {
		t.Fatal(err)
	}

	// Slots that decode nothing of this database.
	physical := testenv.UniqueName(t, "phys")
	mustExec(t, admin, `SELECT pg_create_physical_replication_slot($1)`, physical)
	t.Cleanup(func() {
		if _, err := admin.Exec(context.Background(), `SELECT pg_drop_replication_slot($1)`, physical); err != nil {
			t.Errorf("drop slot %s: %v", physical, err)
		}
	})
	other := connect(t, env.NewDatabase(t)) // its slot goes with it
	mustExec(t, other, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, testenv.UniqueName(t, "other"))
	temporary := connect(t, dsn) // the slot goes with the session
	mustExec(t, temporary, `SELECT pg_create_logical_replication_slot($1, 'pgoutput', true)`, testenv.UniqueName(t, "temp"))

	w := mustWriter(t, Config{Mode: mode})
	conn := drv.open(t, dsn)
	write := func(order int) (testTx, error) {
		t.Helper()
		tx, err := conn.begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.exec(ctx, `INSERT INTO orders VALUES ($1)`, order); err != nil {
			t.Fatal(err)
		}
		ev := Event{AggregateType: "Order", AggregateID: "1", Type: "OrderCreated"}
		_, err = tx.write(ctx, w, ev, ev)
		return tx, err
	}

	tx, err := write(1)
	var noSlot *NoSlotError
	if !errors.As(err, &noSlot) || !errors.Is(err, ErrNoSlot) {
		_ = tx.rollback(ctx)
		t.Fatalf("write without a logical slot: %v, want a *NoSlotError", err)
	}
	t.Logf("refused: %v", err)
	if noSlot.Mode != mode || noSlot.Database != database || noSlot.WALLevel != "logical" {
		t.Errorf("error = %+v, want mode %s, database %s, wal_level logical", noSlot, mode, database)
	}
	for _, want := range []string{`database "` + database + `"`, "mode " + mode.String(), "no logical replication slot", "make the relay's slot first", "ModeTable"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if err := tx.commit(ctx); !errors.Is(err, pgx.ErrTxCommitRollback) {
		t.Fatalf("Commit after the refused write returned %v, want pgx.ErrTxCommitRollback", err)
	}
	if n := count(t, admin, "orders"); n != 0 {
		t.Fatalf("%d business changes committed without their events", n)
	}

	// With a logical slot of this database (any: the relay's, or another
	// consumer's) the same write goes through.
	slot := testenv.UniqueName(t, "s")
	createSlot(t, admin, "public.outbox", "outbox_pub", slot)
	tx, err = write(2)
	if err != nil {
		_ = tx.rollback(ctx)
		t.Fatalf("write with a logical slot: %v", err)
	}
	if err := tx.commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n := count(t, admin, "orders"); n != 1 {
		t.Fatalf("%d orders, want the one committed with a slot", n)
	}
	if n := count(t, admin, "public.outbox"); n != 0 {
		t.Fatalf("%d rows left in the outbox table", n)
	}
	if items := peekWAL(t, admin, slot, "outbox_pub"); len(items) != 2 {
		t.Fatalf("the slot has %d events, want the 2 written with it: %+v", len(items), items)
	}
}

// TestDeleteAfterInsertOnAPollTableNeedsNoSlot: the poll source's table
// keeps a row deleted before it is published (its keep trigger skips the
// delete), and the poll source reads it from there: a ModeTableDeleteAfterInsert
// write to it is safe without any slot and succeeds, its row kept. A row
// deleted past the trigger (pgoutbox.delete_unpublished = on) is gone,
// and without a slot that write is refused.
func TestDeleteAfterInsertOnAPollTableNeedsNoSlot(t *testing.T) {
	for _, drv := range drivers {
		t.Run(drv.name, func(t *testing.T) {
			ctx := testContext(t)
			dsn, admin := newDatabase(t)
			if err := migrations.ApplyPoll(ctx, admin, migrations.PollParams{Table: "public.outbox"}); err != nil {
				t.Fatal(err)
			}
			w := mustWriter(t, Config{Mode: ModeTableDeleteAfterInsert})
			conn := drv.open(t, dsn)

			tx, err := conn.begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			ids, err := tx.write(ctx, w, Event{AggregateType: "Order", AggregateID: "1"}, Event{AggregateType: "Order", AggregateID: "2"})
			if err != nil {
				_ = tx.rollback(ctx)
				t.Fatalf("write to the poll table without a slot: %v", err)
			}
			if err := tx.commit(ctx); err != nil {
				t.Fatal(err)
			}
			var kept int
			if err := admin.QueryRow(ctx, `SELECT count(*) FROM public.outbox WHERE id::text = ANY($1) AND published_at IS NULL`, ids).Scan(&kept); err != nil {
				t.Fatal(err)
			}
			if kept != 2 {
				t.Fatalf("%d of the 2 rows kept unpublished", kept)
			}

			tx, err = conn.begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := tx.exec(ctx, `SET LOCAL `+migrations.DeleteUnpublished+` = on`); err != nil {
				t.Fatal(err)
			}
			_, err = tx.write(ctx, w, Event{AggregateType: "Order", AggregateID: "3"})
			if !errors.Is(err, ErrNoSlot) {
				_ = tx.rollback(ctx)
				t.Fatalf("write whose row was deleted past the trigger, without a slot: %v, want ErrNoSlot", err)
			}
			if err := tx.commit(ctx); !errors.Is(err, pgx.ErrTxCommitRollback) {
				t.Fatalf("Commit after the refused write returned %v, want pgx.ErrTxCommitRollback", err)
			}
			if n := count(t, admin, "public.outbox"); n != 2 {
				t.Fatalf("%d rows in the poll table, want the 2 kept", n)
			}
		})
	}
}

// TestSlotCheckNeedsNoPrivilege: applications do not write as superusers;
// the check reads pg_replication_slots, which every role may read, so a
// role with no more than the table's privileges writes in both WAL-only
// modes.
func TestSlotCheckNeedsNoPrivilege(t *testing.T) {
	ctx := testContext(t)
	env := testenv.Require(t)
	role := testenv.UniqueName(t, "writer")
	super := connect(t, env.PGDSN)
	mustExec(t, super, `CREATE ROLE `+role+` NOLOGIN`)
	t.Cleanup(func() { // after the database (and the grants in it) is dropped
		if _, err := super.Exec(context.Background(), `DROP ROLE `+role); err != nil {
			t.Errorf("drop role %s: %v", role, err)
		}
	})
	dsn, admin := newDatabase(t)
	createOutboxTable(t, admin, "public.outbox")
	mustExec(t, admin, `GRANT SELECT, INSERT, DELETE ON public.outbox TO `+role)
	slot := testenv.UniqueName(t, "s")
	createSlot(t, admin, "public.outbox", "outbox_pub", slot)
	conn := connect(t, dsn)
	for _, mode := range []Mode{ModeMessage, ModeTableDeleteAfterInsert} {
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `SET LOCAL ROLE `+role); err != nil {
			t.Fatal(err)
		}
		if _, err := mustWriter(t, Config{Mode: mode}).Write(ctx, tx, Event{AggregateType: "Order", AggregateID: "1"}); err != nil {
			_ = tx.Rollback(ctx)
			t.Fatalf("%s: write as role %s: %v", mode, role, err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if items := peekWAL(t, admin, slot, "outbox_pub"); len(items) != 2 {
		t.Fatalf("the slot has %d events, want 2: %+v", len(items), items)
	}
}
