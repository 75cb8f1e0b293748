package relay_test

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/migrations"
	"github.com/pgoutbox/pgoutbox/pkg/outboxtest"
	"github.com/pgoutbox/pgoutbox/pkg/relay"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
	"github.com/pgoutbox/pgoutbox/poll"
	"github.com/pgoutbox/pgoutbox/replication"
)

// Moving between the sources, and the WAL source's initial snapshot. In
// each test a writer runs throughout: before the switch, while no relay
// runs or the new one starts, and after; every committed event must arrive
// exactly once.

// exactlyOnce checks what the consumer read against the writer.
func exactlyOnce(t *testing.T, c *testenv.Consumer, f *fixture, w *outboxtest.Writer) {
	t.Helper()
	rep := outboxtest.Check(w.Committed, w.RolledBack, delivered(drain(t, c, f)), nil)
	t.Logf("%d transactions: %s", w.Txns, rep)
	if !rep.OK() || rep.Duplicates != 0 || rep.Verified != w.Events() {
		t.Fatalf("want every event exactly once: %s", rep)
	}
}

// startWriterUntilCleanup is startWriter whose writer also stops at the
// end of the test, before the fixture's connections close, if the test
// failed before stopping it.
func startWriterUntilCleanup(t *testing.T, w *outboxtest.Writer, maxTxns int) *backgroundWriter {
	bw := startWriter(w, maxTxns)
	t.Cleanup(func() {
		select {
		case <-bw.stop:
		default:
			close(bw.stop)
		}
		<-bw.done
	})
	return bw
}

// progress waits until the consumer read n more records.
func progress(t *testing.T, c *testenv.Consumer, bw *backgroundWriter, n int) {
	t.Helper()
	target := c.Len() + n
	testenv.Eventually(t, time.Minute, 10*time.Millisecond, func() (bool, string) {
		return c.Len() >= target, fmt.Sprintf("%d records, want %d (%d events written)", c.Len(), target, bw.Events())
	})
}

// TestInitialSnapshotPublishesTheRowsBeforeTheSlotThenStreams writes rows
// before the relay exists, then starts the WAL source with
// snapshot.mode=initial while writing goes on: the rows that were there
// are published from the snapshot the new slot exported, the rest streamed
// from the slot, each once. In exactly-once mode with a transactional id
// of the user's, too: the snapshot's producer is an ordinary one (with the
// id, sarama refused every record sent outside a Kafka transaction).
func TestInitialSnapshotPublishesTheRowsBeforeTheSlotThenStreams(t *testing.T) {
	env := testenv.Require(t)
	for _, eos := range []bool{false, true} {
		t.Run(map[bool]string{false: "at-least-once", true: "exactly-once"}[eos], func(t *testing.T) {
			f := newFixture(t, env, 3)
			f.shape.DeletePct = 0 // a row deleted before any relay ran is gone for both
			w := outboxtest.NewWriter(f.conn, "outbox", f.shape, 51)
			writeEvents(t, w, 1000, 1000)
			cfg := f.config()
			cfg.Snapshot.Mode = relay.SnapshotInitial
			var opts []testenv.ConsumerOption
			if eos {
				cfg.Kafka.ExactlyOnce = true
				cfg.Kafka.TransactionalID = "pgoutbox-test-" + f.slot
				cfg.Kafka.OffsetsTopic = "pgoutbox.offsets." + f.slot
				opts = append(opts, testenv.ReadCommitted())
			}
			c := env.NewConsumer(t, f.topics, opts...)
			bw := startWriterUntilCleanup(t, w, 100_000)
			stop := runRelay(t, cfg)
			progress(t, c, bw, 3000)
			bw.Stop(t)
			waitAll(t, c, w, 2*time.Minute)
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			if !eos {
				exactlyOnce(t, c, f, w)
				return
			}
			// Transaction markers take offsets: read to the end instead.
			committed, _ := checkBothWays(t, env, f, w)
			requireExactlyOnce(t, committed)
		})
	}
}

// TestCutoverFromPollToWALDeliversEachEventOnce runs two poll relays,
// stops them, and starts the WAL source with snapshot.mode=initial and
// snapshot.rows=unpublished: the snapshot publishes what the poll relays
// left unpublished, the slot streams the rest.
func TestCutoverFromPollToWALDeliversEachEventOnce(t *testing.T) {
	env := testenv.Require(t)
	f := newPollFixture(t, env, 3)
	w := outboxtest.NewWriter(f.conn, "outbox", f.shape, 52)
	c := env.NewConsumer(t, f.topics)
	pcfg := f.pollConfig()
	stops := []func() error{runRelay(t, pcfg), runRelay(t, pcfg)}
	bw := startWriterUntilCleanup(t, w, 100_000)
	progress(t, c, bw, 2000)
	for _, stop := range stops {
		if err := stop(); err != nil {
			t.Fatal(err)
		}
	}
	written := bw.Events()
	cfg := f.config()
	cfg.Snapshot.Mode, cfg.Snapshot.Rows = relay.SnapshotInitial, relay.SnapshotRowsUnpublished
	stop := runRelay(t, cfg)
	progress(t, c, bw, 2000)
	bw.Stop(t)
	waitAll(t, c, w, 2*time.Minute)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d events written before the WAL source started, %d in all", written, w.Events())
	exactlyOnce(t, c, f, w)
}

// TestCutoverFromWALToPollDeliversEachEventOnce streams with the WAL
// source, adds the poll columns to its table while it runs (pgoutbox
// migrate with relay.source=poll), stops it, and starts two poll relays
// with poll.handover.slot: they mark what the slot relayed as published,
// drop the slot, and publish the rest.
func TestCutoverFromWALToPollDeliversEachEventOnce(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 3)
	f.shape.DeletePct = 0 // the poll source reads rows: writers must keep them
	w := outboxtest.NewWriter(f.conn, "outbox", f.shape, 53)
	c := env.NewConsumer(t, f.topics)
	stop := runRelay(t, f.config())
	f.waitStreaming(t)
	bw := startWriterUntilCleanup(t, w, 100_000)
	progress(t, c, bw, 2000)
	defaults := relay.DefaultConfig()
	p := migrations.PollParams{Table: "public.outbox", Notify: true, Channel: defaults.Poll.Channel("public.outbox")}
	if err := migrations.ApplyPoll(context.Background(), f.checkDB, p); err != nil {
		t.Fatal(err)
	}
	progress(t, c, bw, 1000)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	written := bw.Events()
	pcfg := f.pollConfig()
	pcfg.Poll.HandoverSlot = f.slot
	stops := []func() error{runRelay(t, pcfg), runRelay(t, pcfg)}
	progress(t, c, bw, 2000)
	bw.Stop(t)
	waitAll(t, c, w, 2*time.Minute)
	for _, stop := range stops {
		if err := stop(); err != nil {
			t.Fatal(err)
		}
	}
	if confirmed, _ := f.slotState(t); confirmed != 0 {
		t.Fatalf("the WAL source's slot is still there (confirmed %s)", confirmed)
	}
	t.Logf("%d events written before the poll source started, %d in all", written, w.Events())
	exactlyOnce(t, c, f, w)
}

// TestHandoverKeepsThePendingInsertsOfPartitions: poll.handover.slot marks
// published only the rows the slot relayed, found as those its pending
// inserts do not name. With a publication that reports each partition under
// its own name (no publish_via_partition_root, as Debezium's and many
// hand-made ones), the pending inserts are the partitions', and they must
// still count as the table's: else every row the WAL relay had not relayed
// yet would be marked published and never reach Kafka. And a publication
// that cannot show the pending inserts (here: none of that name, which
// PostgreSQL 18 only warns about) stops the handover loudly.
func TestHandoverKeepsThePendingInsertsOfPartitions(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 1)
	f.exec(t, "DROP TABLE outbox")
	// The poll columns by hand: before PostgreSQL 17 a partitioned table
	// has no identity column (pgoutbox migrate's seq), a sequence does.
	f.exec(t, "CREATE SEQUENCE outbox_seq")
	f.exec(t, `CREATE TABLE outbox (id uuid NOT NULL, aggregatetype varchar(255) NOT NULL, aggregateid varchar(255) NOT NULL,
		type varchar(255) NOT NULL, payload jsonb, created_at timestamptz NOT NULL DEFAULT now(),
		seq bigint NOT NULL DEFAULT nextval('outbox_seq'), published_at timestamptz, attempts integer NOT NULL DEFAULT 0, last_error text,
		PRIMARY KEY (id)) PARTITION BY HASH (id)`)
	f.exec(t, "CREATE TABLE outbox_h0 PARTITION OF outbox FOR VALUES WITH (MODULUS 2, REMAINDER 0)")
	f.exec(t, "CREATE TABLE outbox_h1 PARTITION OF outbox FOR VALUES WITH (MODULUS 2, REMAINDER 1)")
	f.exec(t, "CREATE PUBLICATION "+f.pub+" FOR TABLE outbox WITH (publish = 'insert')")
	c := env.NewConsumer(t, f.topics[:1])
	p := runInProcess(t, f.config())
	f.waitStreaming(t)
	want := f.insertEvents(t, "0001", 6, nil)
	c.WaitFor(t, len(want), time.Minute)
	if err := p.stop(t); err != nil {
		t.Fatal(err)
	}
	// Written while no relay runs: pending in the slot, unpublished.
	pending := f.insertEvents(t, "0002", 6, nil)
	want = append(want, pending...)
	// The poll source's keep triggers, as pgoutbox migrate adds them to a
	// table made by hand (the columns stay as they are).
	defaults := relay.DefaultConfig()
	pp := migrations.PollParams{Table: "public.outbox", Notify: true, Channel: defaults.Poll.Channel("public.outbox")}
	if err := migrations.ApplyPoll(context.Background(), f.checkDB, pp); err != nil {
		t.Fatal(err)
	}

	wrong := f.pollConfig()
	wrong.Poll.HandoverSlot = f.slot
	wrong.Postgres.Publication = f.pub + "_none"
	// Without the WAL relay's state row, which names its publication (the
	// handover then reads through that one).
	wrong.Postgres.StateTable = ""
	bad := runInProcess(t, wrong)
	err := bad.exited(t, time.Minute)
	var fe *relay.FatalError
	if !errors.As(err, &fe) || !strings.Contains(err.Error(), "cannot show them all") || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("handover through a missing publication: %v, want a fatal error saying so", err)
	}
	if n := f.unpublished(t); n != len(want) {
		t.Fatalf("%d rows unpublished after the refused handover, want all %d: it marked some", n, len(want))
	}

	pcfg := f.pollConfig()
	pcfg.Poll.HandoverSlot = f.slot
	stop := runRelay(t, pcfg)
	msgs := c.WaitFor(t, len(want), time.Minute)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	slices.Sort(want)
	if got := receivedIDs(msgs); !slices.Equal(got, want) {
		t.Fatalf("received %d distinct events %v, want %d: the pending inserts of the partitions were marked published", len(got), got, len(want))
	}
	if confirmed, _ := f.slotState(t); confirmed != 0 {
		t.Fatalf("the WAL source's slot is still there (confirmed %s)", confirmed)
	}
}

// TestInitialSnapshotKeepsOneTransactionsRowsOfAKeyInOrder: without a seq
// column the snapshot orders rows by created_at, which is their
// transaction's start (now()) and the same for all of them. PostgreSQL's
// sort is not stable: of 1,500 keys each written twice by a transaction of
// its own, many had their events published second first. The row's place in
// the table now breaks the tie: every key's events arrive in the order
// written.
func TestInitialSnapshotKeepsOneTransactionsRowsOfAKeyInOrder(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 1)
	const keys = 1500
	// Each key's two events share a created_at, as one transaction's do;
	// the keys' created_at values are out of the table's order, as
	// concurrent transactions leave them, so the sort has work to do.
	f.exec(t, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, created_at)
		SELECT ('00000000-0000-4000-8000-' || lpad(g::text, 12, '0'))::uuid, $1, 'k' || (g % $2), 'T', json_build_object('n', g),
			'2026-01-01'::timestamptz + ((g % $2) * 7919 % 1000) * interval '1 ms'
		FROM generate_series(0, 2 * $2 - 1) g ORDER BY g`, f.shape.AggregateTypes[0], keys)
	cfg := f.config()
	cfg.Snapshot.Mode = relay.SnapshotInitial
	stop := runRelay(t, cfg)
	msgs := env.ConsumeAll(t, f.topics[:1], time.Minute, func(n int) bool { return n >= 2*keys })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	last := map[string]string{}
	wrong := 0
	for _, m := range msgs {
		id, _ := m.Header("id")
		if prev, ok := last[string(m.Key)]; ok && string(id) < prev {
			wrong++
		}
		last[string(m.Key)] = string(id)
	}
	if wrong > 0 || len(last) != keys {
		t.Fatalf("%d of %d keys had their events out of the order written (%d records)", wrong, len(last), len(msgs))
	}
}

// TestInitialSnapshotTriedAgainKeepsWhatOnlyWALHeld: a snapshot attempt
// that fails half-way (here its SQL connection is ended) is tried again.
// The retry took a new temporary slot, starting later: a table-less
// message committed between the two starting points was in neither slot
// nor snapshot, and was lost without a word. The retry now publishes again
// in the same snapshot, from the same temporary slot, which the failure
// left open: the message arrives, and every row.
func TestInitialSnapshotTriedAgainKeepsWhatOnlyWALHeld(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 1)
	ctx := context.Background()
	const rows = 20000
	cfg := snapshotOf(t, f, rows, 20)
	c := env.NewConsumer(t, f.topics[:1])
	stop := runRelay(t, cfg)
	c.WaitFor(t, 1, time.Minute)
	const message = "00000000-0000-4000-8000-000900000099"
	f.emitEvent(t, message)
	if n, err := endBackends(ctx, f.checkDB, "pgoutbox-snapshot"); err != nil || n != 1 {
		t.Fatalf("ended %d snapshot connections (%v), want 1: the snapshot was over before the test could end it", n, err)
	}
	waitForRowsAndEvent(t, c, rows, message)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// TestInitialSnapshotStartedOverKeepsWhatOnlyWALHeld: an attempt whose
// temporary slot is gone (its replication connection ended, or the process
// stopped) starts over from a new snapshot, starting later. A table-less
// message committed between the two starting points was in neither, lost
// (with an error within one process, without a word across two). The first
// attempt's starting point is now kept by a permanent anchor slot, and the
// slot is made as its copy: the message arrives, every row too, and the
// anchor is gone once the slot is made.
func TestInitialSnapshotStartedOverKeepsWhatOnlyWALHeld(t *testing.T) {
	for _, how := range []string{"replication connection ended", "process stopped"} {
		t.Run(how, func(t *testing.T) {
			env := testenv.Require(t)
			f := newFixture(t, env, 1)
			ctx := context.Background()
			const rows = 20000
			cfg := snapshotOf(t, f, rows, 20)
			c := env.NewConsumer(t, f.topics[:1])
			stop := runRelay(t, cfg)
			c.WaitFor(t, 1, time.Minute)
			const message = "00000000-0000-4000-8000-000900000098"
			f.emitEvent(t, message)
			if how == "process stopped" {
				if err := stop(); err != nil {
					t.Fatal(err)
				}
				noSlotYet(t, f, cfg)
				stop = runRelay(t, cfg)
			} else {
				// The temporary slot's walsender: its snapshot goes with it.
				var ended int
				if err := f.checkDB.QueryRow(ctx, `SELECT count(pg_terminate_backend(active_pid)) FROM pg_replication_slots
					WHERE temporary AND slot_name LIKE $1 || '%' AND active_pid IS NOT NULL`, cfg.Postgres.Slot[:min(len(cfg.Postgres.Slot), 50)]+"_snap_").Scan(&ended); err != nil || ended != 1 {
					t.Fatalf("ended %d temporary slots' connections (%v), want 1: the snapshot was over before the test could end it", ended, err)
				}
			}
			waitForRowsAndEvent(t, c, rows, message)
			noAnchorLeft(t, f, cfg)
			if err := stop(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestInitialSnapshotStartedOverInAnotherProcessKeepsKeyOrder: a snapshot
// stopped with the process is started over by the next one from a new
// snapshot, and the slot starts where the first one's anchor kept. A key's
// row committed in between (kept) is in the new snapshot, and an event of
// that key committed before it only WAL held (gone, a row deleted by its
// own transaction) comes from the slot. The new snapshot published kept,
// and the slot then sent gone and kept: kept, gone, kept. Now the rows the
// slot streams are left out of the new snapshot: gone, kept, once each.
func TestInitialSnapshotStartedOverInAnotherProcessKeepsKeyOrder(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 1)
	ctx := context.Background()
	const rows = 20000
	cfg := snapshotOf(t, f, rows, 20)
	c := env.NewConsumer(t, f.topics[:1])
	stop := runRelay(t, cfg)
	c.WaitFor(t, 1, time.Minute) // the anchor is made before the first row
	const gone, kept = "00000000-0000-4000-8000-000900000011", "00000000-0000-4000-8000-000900000012"
	row := `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, '` + f.shape.AggregateTypes[0] + `', 'kx', 'T', '{}')`
	writer, err := pgx.Connect(ctx, f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Close(context.Background())
	if _, err := writer.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	if _, err := writer.Exec(ctx, row, gone); err != nil {
		t.Fatal(err)
	}
	if _, err := writer.Exec(ctx, "DELETE FROM outbox WHERE id = $1", gone); err != nil {
		t.Fatal(err)
	}
	if _, err := writer.Exec(ctx, "COMMIT"); err != nil {
		t.Fatal(err)
	}
	if _, err := writer.Exec(ctx, row, kept); err != nil {
		t.Fatal(err)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	noSlotYet(t, f, cfg)
	stop = runRelay(t, cfg)
	var kx []string
	distinct := map[string]bool{}
	testenv.Eventually(t, 2*time.Minute, 50*time.Millisecond, func() (bool, string) {
		for _, m := range c.Poll() {
			id, _ := m.Header("id")
			distinct[string(id)] = true
			if string(m.Key) == "kx" {
				kx = append(kx, string(id))
			}
		}
		return distinct[kept] && len(distinct) == rows+2, fmt.Sprintf("%d distinct events (want %d), key kx: %v", len(distinct), rows+2, kx)
	})
	noAnchorLeft(t, f, cfg)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(kx, []string{gone, kept}) {
		t.Fatalf("key kx got %v; want %s then %s, once each: the slot streams both, and the new snapshot leaves kept to it", kx, gone, kept)
	}
}

// TestInitialSnapshotStopsOnASlotMadeMeanwhileUntilItIsDropped: a slot
// made by something else while the snapshot is read (here by SQL, which
// does not wait for the snapshot's lock) starts after the snapshot's
// consistent point, and a table-less message committed before it is in
// neither. The snapshot stops on it; so does every start after (a
// supervisor's restart streamed from that slot, skipping the message);
// once the slot is dropped, as the error says, the next start makes it
// where the anchor kept the first attempt's point: the message arrives,
// and every row.
func TestInitialSnapshotStopsOnASlotMadeMeanwhileUntilItIsDropped(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 1)
	const rows = 20000
	cfg := snapshotOf(t, f, rows, 20)
	c := env.NewConsumer(t, f.topics[:1])
	p := runInProcess(t, cfg)
	c.WaitFor(t, 1, time.Minute)
	const message = "00000000-0000-4000-8000-000900000097"
	f.emitEvent(t, message)
	f.exec(t, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", cfg.Postgres.Slot)
	for i, what := range []string{"the snapshot", "the start after it"} {
		if i > 0 {
			p = runInProcess(t, cfg)
		}
		err := p.exited(t, 2*time.Minute)
		var fe *relay.FatalError
		if !errors.As(err, &fe) || !strings.Contains(err.Error(), cfg.Postgres.Slot) || !strings.Contains(err.Error(), "drop") {
			t.Fatalf("%s returned %v; want a fatal error naming the slot made meanwhile and saying to drop it", what, err)
		}
		t.Logf("%s: %v", what, err)
	}
	f.exec(t, "SELECT pg_drop_replication_slot($1)", cfg.Postgres.Slot)
	p = runInProcess(t, cfg)
	waitForRowsAndEvent(t, c, rows, message)
	noAnchorLeft(t, f, cfg)
	if err := p.stop(t); err != nil {
		t.Fatal(err)
	}
}

// TestInitialSnapshotFailingToMakeTheSlotDoesNotPublishAgain: an attempt
// that published every row and failed only to make the slot (a connection
// lost then; here a fault injected at that point, which a real server
// cannot be made to produce on demand) is tried again. The retry took a
// new snapshot and published every row again, and the slot still started
// at the anchor: a key's event only WAL held in between (a row deleted by
// its own transaction) reached Kafka after a later event of that key from
// the new snapshot. The retry now only makes the slot: each event once,
// in commit order.
func TestInitialSnapshotFailingToMakeTheSlotDoesNotPublishAgain(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 1)
	ctx := context.Background()
	const rows = 200
	cfg := snapshotOf(t, f, rows, 0)
	writer, err := pgx.Connect(ctx, f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Close(context.Background())
	const gone, kept = "00000000-0000-4000-8000-000900000001", "00000000-0000-4000-8000-000900000002"
	faults := 0
	fault := func() error {
		faults++
		if faults > 1 {
			return nil
		}
		row := `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, '` + f.shape.AggregateTypes[0] + `', 'kx', 'T', '{}')`
		if _, err := writer.Exec(ctx, "BEGIN"); err != nil {
			return err
		}
		if _, err := writer.Exec(ctx, row, gone); err != nil {
			return err
		}
		if _, err := writer.Exec(ctx, "DELETE FROM outbox WHERE id = $1", gone); err != nil {
			return err
		}
		if _, err := writer.Exec(ctx, "COMMIT"); err != nil {
			return err
		}
		if _, err := writer.Exec(ctx, row, kept); err != nil {
			return err
		}
		return errors.New("test: the connection was lost as the slot was being made")
	}
	c := env.NewConsumer(t, f.topics[:1])
	stop := runRelay(t, cfg, relay.WithSnapshotPersistFault(fault))
	var kx []string
	total := 0
	testenv.Eventually(t, 2*time.Minute, 50*time.Millisecond, func() (bool, string) {
		for _, m := range c.Poll() {
			total++
			if string(m.Key) == "kx" {
				id, _ := m.Header("id")
				kx = append(kx, string(id))
			}
		}
		return len(kx) >= 2 && total >= rows+2, fmt.Sprintf("%d records, key kx: %v", total, kx)
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if faults < 2 {
		t.Fatalf("the slot was made %d times after the fault; want the retry to make it", faults-1)
	}
	if !slices.Equal(kx, []string{gone, kept}) || total != rows+2 {
		t.Fatalf("key kx got %v (want %s then %s, once each) and %d records in all (want %d: no row published again)", kx, gone, kept, total, rows+2)
	}
}

// snapshotOf fills the outbox with rows rows over 50 keys and returns a
// configuration that publishes them in an initial snapshot, batch rows at
// a time (0: the default).
func snapshotOf(t *testing.T, f *fixture, rows, batch int) relay.Config {
	t.Helper()
	f.exec(t, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
		SELECT ('00000000-0000-4000-8000-' || lpad(g::text, 12, '0'))::uuid, $1, 'k' || (g % 50), 'T', json_build_object('n', g)
		FROM generate_series(1, $2) g`, f.shape.AggregateTypes[0], rows)
	cfg := f.config()
	cfg.Snapshot.Mode = relay.SnapshotInitial
	cfg.Relay.RestartBackoff = 50 * time.Millisecond // retries are what these tests watch
	if batch > 0 {
		cfg.Snapshot.BatchSize = batch
	}
	return cfg
}

// emitEvent writes a table-less event with id id: only WAL holds it.
func (f *fixture) emitEvent(t *testing.T, id string) {
	t.Helper()
	f.exec(t, "SELECT pg_logical_emit_message(true, 'outbox', $1)",
		fmt.Sprintf(`{"id":%q,"aggregatetype":%q,"aggregateid":"m1","type":"T","payload":{}}`, id, f.shape.AggregateTypes[0]))
}

// waitForRowsAndEvent waits until c read the rows rows of snapshotOf and
// the event with id id, each at least once.
func waitForRowsAndEvent(t *testing.T, c *testenv.Consumer, rows int, id string) {
	t.Helper()
	got := map[string]bool{}
	testenv.Eventually(t, 2*time.Minute, 50*time.Millisecond, func() (bool, string) {
		for _, m := range c.Poll() {
			h, _ := m.Header("id")
			got[string(h)] = true
		}
		return got[id] && len(got) == rows+1, fmt.Sprintf("%d distinct events, %s among them: %v; want %d and it", len(got), id, got[id], rows+1)
	})
}

// noAnchorLeft checks that the snapshot's anchor slot is gone once the
// slot streams.
// noSlotYet fails t unless the slot of cfg is still missing: the
// snapshot was stopped before it made it.
func noSlotYet(t *testing.T, f *fixture, cfg relay.Config) {
	t.Helper()
	var slots int
	if err := f.checkDB.QueryRow(context.Background(), "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1", cfg.Postgres.Slot).Scan(&slots); err != nil || slots != 0 {
		t.Fatalf("%d slots named %q (%v): the snapshot was over before the test could stop it", slots, cfg.Postgres.Slot, err)
	}
}

// endBackends ends the server sessions of the current database named app
// (application_name), and says how many it ended.
func endBackends(ctx context.Context, conn *pgx.Conn, app string) (int, error) {
	var n int
	err := conn.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name = $1`, app).Scan(&n)
	return n, err
}

func noAnchorLeft(t *testing.T, f *fixture, cfg relay.Config) {
	t.Helper()
	var anchors int
	if err := f.checkDB.QueryRow(context.Background(), "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1", replication.AnchorSlot(cfg.Postgres.Slot)).Scan(&anchors); err != nil || anchors != 0 {
		t.Fatalf("%d anchor slots left once the slot streams (%v)", anchors, err)
	}
}

// TestInitialSnapshotKeptAcrossAnAnchorDroppedPublishesWhatItLeftOut: a
// started-over snapshot leaves out the rows the anchor slot will stream.
// When an attempt with that snapshot fails (its SQL connection ended) and
// the anchor is gone by the retry (dropped by someone, as validate's
// warning about an anchor left behind invites), the retry made a new anchor
// at the kept snapshot's own point and still left those rows out: the slot
// started after them, and they reached neither path (a reviewer lost 50 of
// 50). The retry now takes a new snapshot, judged against the anchor there
// is, and every row arrives.
func TestInitialSnapshotKeptAcrossAnAnchorDroppedPublishesWhatItLeftOut(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 1)
	ctx := context.Background()
	const rows = 20000
	cfg := snapshotOf(t, f, rows, 20)
	c := env.NewConsumer(t, f.topics[:1])
	stop := runRelay(t, cfg)
	c.WaitFor(t, 1, time.Minute) // the anchor is made before the first row
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	f.exec(t, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
		SELECT ('00000000-0000-4000-8000-' || lpad((900000 + g)::text, 12, '0'))::uuid, $1, 'gap', 'T', '{}' FROM generate_series(1, 50) g`, f.shape.AggregateTypes[0])
	topic := f.topics[0] + "/0"
	before := env.HighWater(t, f.topics[:1])[topic]
	stop = runRelay(t, cfg)
	// The new snapshot, which leaves the 50 to the slot, publishes.
	testenv.Eventually(t, time.Minute, 20*time.Millisecond, func() (bool, string) {
		now := env.HighWater(t, f.topics[:1])[topic]
		return now > before+40, fmt.Sprintf("%d records since the second start", now-before)
	})
	f.exec(t, "SELECT pg_drop_replication_slot($1)", replication.AnchorSlot(cfg.Postgres.Slot))
	if n, err := endBackends(ctx, f.checkDB, "pgoutbox-snapshot"); err != nil || n != 1 {
		t.Fatalf("ended %d snapshot connections (%v), want 1: the snapshot was over before the test could end it", n, err)
	}
	got := map[string]bool{}
	testenv.Eventually(t, 2*time.Minute, 50*time.Millisecond, func() (bool, string) {
		for _, m := range c.Poll() {
			h, _ := m.Header("id")
			got[string(h)] = true
		}
		return len(got) >= rows+50, fmt.Sprintf("%d distinct events, want %d", len(got), rows+50)
	})
	f.waitStreaming(t)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// TestWALStartOverThePollSourcesUnpublishedRowsIsRefused: a move from the
// poll source to the WAL source without snapshot.mode: initial. The WAL
// source made its slot at the present and never relayed the rows the poll
// relays had left unpublished (a prober lost 20 of 50 so), with no word;
// migrate with the WAL source dropped the keep triggers and made the slot
// too. Now the start, migrate and validate refuse while the poll source's
// table (its keep trigger on) holds such rows and the slot does not
// exist, and make nothing (not beside a running poll relay, which is no
// move); with snapshot.mode: initial and snapshot.rows:
// unpublished, the way the refusal names, every event arrives.
func TestWALStartOverThePollSourcesUnpublishedRowsIsRefused(t *testing.T) {
	env := testenv.Require(t)
	ctx := context.Background()
	f := newPollFixture(t, env, 1)
	w := outboxtest.NewWriter(f.conn, "outbox", f.shape, 61)
	c := env.NewConsumer(t, f.topics)
	stop := runRelay(t, f.pollConfig())
	writeEvents(t, w, 5, 50)
	waitAll(t, c, w, time.Minute)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	writeEvents(t, w, w.Events()+3, 50) // left unpublished
	left := f.unpublished(t)
	if left == 0 {
		t.Fatal("no unpublished rows")
	}
	noSlot := func(what string) {
		t.Helper()
		if confirmed, _ := f.slotState(t); confirmed != 0 {
			t.Fatalf("%s made the slot", what)
		}
		missing, err := poll.MissingKeepTriggers(ctx, f.checkDB, "public.outbox")
		if err != nil || len(missing) > 0 {
			t.Fatalf("%s: keep triggers missing %v (%v)", what, missing, err)
		}
	}
	err := runInProcess(t, f.config()).exited(t, time.Minute)
	var fe *relay.FatalError
	if !errors.As(err, &fe) || !errors.Is(err, replication.ErrPollRowsUnpublished) || !strings.Contains(err.Error(), fmt.Sprintf("public.outbox (%d rows)", left)) || !strings.Contains(err.Error(), "snapshot.rows: unpublished") {
		t.Fatalf("WAL start over %d unpublished rows: %v, want a fatal error naming the table, the count and the way", left, err)
	}
	noSlot("the refused start")
	bin := pgoutboxBinary(t)
	for _, cmd := range []string{"migrate", "validate"} {
		run := exec.Command(bin, cmd)
		run.Env = f.environ()
		out, err := run.CombinedOutput()
		if err == nil || !strings.Contains(string(out), "published_at NULL") {
			t.Fatalf("%s over unpublished rows: %v\n%s", cmd, err, out)
		}
		noSlot(cmd)
	}
	// With a poll relay running on the table, a WAL relay starting beside
	// it (another deployment's, publishing elsewhere: "a WAL slot beside
	// the poll source") is no move, and not refused (a review found it
	// refused whenever the table held unpublished rows).
	member, err := pgx.Connect(ctx, f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	pc := f.pollConfig()
	if _, err := poll.JoinTo(ctx, member, "public.outbox", pc.Poll.Buckets, pc.PollDestination("public.outbox")); err != nil {
		t.Fatal(err)
	}
	if err := relay.PollRowsRefusal(ctx, f.checkDB, f.slot, []string{"public.outbox"}); err != nil {
		t.Fatalf("beside a running poll relay: %v", err)
	}
	member.Close(ctx)
	if err := relay.PollRowsRefusal(ctx, f.checkDB, f.slot, []string{"public.outbox"}); !errors.Is(err, replication.ErrPollRowsUnpublished) {
		t.Fatalf("once the poll relay left: %v, want the refusal", err)
	}

	cfg := f.config()
	cfg.Snapshot.Mode, cfg.Snapshot.Rows = relay.SnapshotInitial, relay.SnapshotRowsUnpublished
	stop = runRelay(t, cfg)
	writeEvents(t, w, w.Events()+3, 50)
	waitAll(t, c, w, time.Minute)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}
