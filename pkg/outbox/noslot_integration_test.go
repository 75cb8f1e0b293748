package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

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

// TestDeleteAfterInsertRefusesATableNoSlotCouldDecode: a database with a
// logical slot passed the slot check whatever table a
// ModeTableDeleteAfterInsert write went to. A write to a table no
// publication carries (a second outbox table not yet added to the relay,
// a tenant schema's table of the same name, a publication of updates and
// deletes only) or to an unlogged table (its
// rows never reach the WAL, FOR ALL TABLES skips it) committed, deleted
// its rows, and its events were decoded by no slot, without a word. Now
// such a write fails with a *NotPublishedError naming the table, and the
// transaction with it; a table published by name, by schema, through its
// partitioned parent or FOR ALL TABLES is written to, and its inserts are
// in the slot; so is a partitioned table whose partitions are all
// published, and any table where a slot of another plugin decodes every
// table; a partitioned table with a partition unpublished or unlogged, and
// a view, are refused. Config.AssumeSlot leaves the check out.
func TestDeleteAfterInsertRefusesATableNoSlotCouldDecode(t *testing.T) {
	for _, drv := range drivers {
		t.Run(drv.name, func(t *testing.T) { testRefusesUnpublished(t, drv) })
	}
}

func testRefusesUnpublished(t *testing.T, drv dbDriver) {
	ctx := testContext(t)
	testenv.Require(t)
	dsn, admin := newDatabase(t)
	var database string
	if err := admin.QueryRow(ctx, `SELECT current_database()`).Scan(&database); err != nil {
		t.Fatal(err)
	}
	mustExec(t, admin, `CREATE TABLE orders (id int PRIMARY KEY)`)
	mustExec(t, admin, `CREATE SCHEMA tenant`)
	mustExec(t, admin, `CREATE SCHEMA events`)
	for _, table := range []string{"public.outbox", "public.outbox2", "tenant.outbox", "public.upd_only", "events.outbox"} {
		createOutboxTable(t, admin, table)
	}
	mustExec(t, admin, `CREATE TABLE public.parted (LIKE public.outbox INCLUDING DEFAULTS) PARTITION BY LIST (aggregatetype)`)
	mustExec(t, admin, `CREATE TABLE public.parted_order PARTITION OF public.parted FOR VALUES IN ('Order')`)
	mustExec(t, admin, `CREATE UNLOGGED TABLE public.unlogged (LIKE public.outbox INCLUDING ALL)`)
	slot := testenv.UniqueName(t, "s")
	createSlot(t, admin, "public.outbox", "pub_outbox", slot)
	mustExec(t, admin, `CREATE PUBLICATION pub_upd FOR TABLE public.upd_only WITH (publish = 'update, delete')`)
	mustExec(t, admin, `CREATE PUBLICATION pub_schema FOR TABLES IN SCHEMA events WITH (publish = 'insert')`)
	mustExec(t, admin, `CREATE PUBLICATION pub_parted FOR TABLE public.parted WITH (publish = 'insert')`)

	conn := drv.open(t, dsn)
	orders := 0
	write := func(cfg Config) error {
		t.Helper()
		cfg.Mode = ModeTableDeleteAfterInsert
		w := mustWriter(t, cfg)
		tx, err := conn.begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		orders++
		if err := tx.exec(ctx, `INSERT INTO orders VALUES ($1)`, orders); err != nil {
			t.Fatal(err)
		}
		ev := Event{AggregateType: "Order", AggregateID: "1", Type: "OrderCreated"}
		if _, err := tx.write(ctx, w, ev); err != nil {
			if cerr := tx.commit(ctx); !errors.Is(cerr, pgx.ErrTxCommitRollback) {
				t.Fatalf("Commit after the refused write returned %v, want pgx.ErrTxCommitRollback", cerr)
			}
			return err
		}
		return tx.commit(ctx)
	}
	refused := func(cfg Config, unlogged bool) {
		t.Helper()
		before := count(t, admin, "orders")
		err := write(cfg)
		var np *NotPublishedError
		if !errors.As(err, &np) || !errors.Is(err, ErrNotPublished) {
			t.Fatalf("delete-after-insert into %s: %v, want a *NotPublishedError", cfg.Table, err)
		}
		t.Logf("refused: %v", err)
		if np.Table != cfg.Table || np.Database != database || np.Unlogged != unlogged {
			t.Errorf("error = %+v, want table %s, database %s, unlogged %v", np, cfg.Table, database, unlogged)
		}
		for _, want := range []string{cfg.Table, "would be lost", "ModeTable"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not say %q", err, want)
			}
		}
		if n := count(t, admin, "orders"); n != before {
			t.Fatalf("the business change committed without its event (%d orders, %d before)", n, before)
		}
	}
	accepted := func(cfg Config) {
		t.Helper()
		if err := write(cfg); err != nil {
			t.Fatalf("delete-after-insert into %s: %v", cfg.Table, err)
		}
	}

	refused(Config{Table: "public.outbox2"}, false)
	refused(Config{Table: "tenant.outbox"}, false)
	refused(Config{Table: "public.upd_only"}, false)
	refused(Config{Table: "public.unlogged"}, true)
	accepted(Config{Table: "outbox"})
	accepted(Config{Table: "events.outbox"})
	accepted(Config{Table: "public.parted"})
	accepted(Config{Table: "public.parted_order"})
	accepted(Config{Table: "public.outbox2", AssumeSlot: true}) // no check: lost, as documented

	// What the accepted writes say the slot decodes, it does.
	got := map[string]int{}
	for _, it := range peekWAL(t, admin, slot, "pub_outbox,pub_schema,pub_parted") {
		if it.Kind == 'I' && it.Relation != "public.orders" {
			got[it.Relation]++
		}
	}
	want := map[string]int{"public.outbox": 1, "events.outbox": 1, "public.parted_order": 2}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("the slot decodes the inserts %v, want %v", got, want)
	}

	// No false refusal (an outage of the application): a partitioned
	// table whose partitions are all published, each on its own. No
	// false acceptance either: one partition left out, or unlogged, would
	// lose the rows that land there; a view is not judged, and refused.
	mustExec(t, admin, `CREATE TABLE public.leafpub (LIKE public.outbox INCLUDING DEFAULTS) PARTITION BY LIST (aggregatetype)`)
	mustExec(t, admin, `CREATE TABLE public.leafpub_order PARTITION OF public.leafpub FOR VALUES IN ('Order')`)
	mustExec(t, admin, `CREATE PUBLICATION pub_leaf FOR TABLE public.leafpub_order WITH (publish = 'insert')`)
	mustExec(t, admin, `CREATE VIEW public.outbox_view AS SELECT * FROM public.outbox`)
	accepted(Config{Table: "public.leafpub"})
	mustExec(t, admin, `CREATE TABLE public.leafpub_other PARTITION OF public.leafpub DEFAULT`)
	refused(Config{Table: "public.leafpub"}, false)
	mustExec(t, admin, `CREATE UNLOGGED TABLE public.parted_unlogged PARTITION OF public.parted FOR VALUES IN ('Unlogged')`)
	refused(Config{Table: "public.parted"}, false)
	mustExec(t, admin, `DROP TABLE public.parted_unlogged`)
	refused(Config{Table: "public.outbox_view"}, false)

	// A slot of another plugin than pgoutput (wal2json, decoderbufs,
	// test_decoding) takes no publication and decodes every table.
	other := testenv.UniqueName(t, "td")
	mustExec(t, admin, `SELECT pg_create_logical_replication_slot($1, 'test_decoding')`, other)
	accepted(Config{Table: "public.outbox2"})
	accepted(Config{Table: "public.leafpub"})
	refused(Config{Table: "public.unlogged"}, true)
	mustExec(t, admin, `SELECT pg_drop_replication_slot($1)`, other)
	refused(Config{Table: "public.outbox2"}, false)

	// FOR ALL TABLES publishes every permanent table, and no unlogged one.
	mustExec(t, admin, `CREATE PUBLICATION pub_all FOR ALL TABLES WITH (publish = 'insert')`)
	accepted(Config{Table: "public.outbox2"})
	refused(Config{Table: "public.unlogged"}, true)
}

// TestSlotStillBeingMadeDoesNotCount: a logical slot is listed in
// pg_replication_slots (not temporary, wal_status reserved) from the moment
// its creation starts, and its creation waits for every transaction that
// has a transaction id to end; those transactions, and every write that
// commits meanwhile, come before the slot's start and no slot decodes
// them. The writers' check counted such a slot, and a write while
// pgoutbox migrate (or the relay's first start) made the slot committed
// an event lost without a word (found by a review). Now the check wants a
// slot that is made (confirmed_flush_lsn set): such a write fails with a
// *NoSlotError, and the same write once the slot is made succeeds.
func TestSlotStillBeingMadeDoesNotCount(t *testing.T) {
	for _, mode := range []Mode{ModeMessage, ModeTableDeleteAfterInsert} {
		t.Run(mode.String(), func(t *testing.T) {
			ctx := testContext(t)
			dsn, admin := newDatabase(t)
			createOutboxTable(t, admin, "public.outbox")
			mustExec(t, admin, `CREATE TABLE orders (id int PRIMARY KEY)`)
			mustExec(t, admin, `CREATE PUBLICATION outbox_pub FOR TABLE public.outbox WITH (publish = 'insert')`)

			// A transaction with an id holds the slot's creation back.
			holder := connect(t, dsn)
			htx, err := holder.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := htx.Exec(ctx, `INSERT INTO orders VALUES (0)`); err != nil {
				t.Fatal(err)
			}
			slot := testenv.UniqueName(t, "s")
			maker := connect(t, dsn)
			made := make(chan error, 1)
			go func() {
				_, err := maker.Exec(context.Background(), `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot)
				made <- err
			}()
			testenv.Eventually(t, 10*time.Second, 10*time.Millisecond, func() (bool, string) {
				var n int
				if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n == 1, "the slot being made is not listed"
			})

			w := mustWriter(t, Config{Mode: mode})
			conn := connect(t, dsn)
			write := func(order int) error {
				t.Helper()
				tx, err := conn.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback(context.Background()) //nolint:errcheck // after Commit: a no-op
				if _, err := tx.Exec(ctx, `INSERT INTO orders VALUES ($1)`, order); err != nil {
					t.Fatal(err)
				}
				if _, err := w.Write(ctx, tx, Event{AggregateType: "Order", AggregateID: "1", Type: "OrderCreated"}); err != nil {
					return err
				}
				return tx.Commit(ctx)
			}
			if err := write(1); !errors.Is(err, ErrNoSlot) {
				t.Fatalf("write while the slot is being made: %v, want a *NoSlotError", err)
			}
			select {
			case err := <-made:
				t.Fatalf("the slot was made while a transaction held it back: %v", err)
			default:
			}

			if err := htx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-made:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the slot was not made within 10 s of the holding transaction's end")
			}
			if err := write(2); err != nil {
				t.Fatalf("write once the slot is made: %v", err)
			}
			if items := peekWAL(t, admin, slot, "outbox_pub"); len(items) != 1 {
				t.Fatalf("the slot has %d events, want the one written once it was made: %+v", len(items), items)
			}
		})
	}
}
