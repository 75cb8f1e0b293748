package relay_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pgoutbox/pgoutbox/migrations"
	"github.com/pgoutbox/pgoutbox/pkg/outboxtest"
	"github.com/pgoutbox/pgoutbox/pkg/relay"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
	"github.com/pgoutbox/pgoutbox/replication"
)

// handoverFixture is a fixture whose outbox has the poll columns and
// whose slot has relayed the first events, with the WAL relay stopped.
func handoverFixture(t *testing.T, env *testenv.Env, pre func(*testing.T, *fixture), tables ...string) (*fixture, *testenv.Consumer, []string) {
	t.Helper()
	f := newFixture(t, env, 1)
	if pre != nil {
		pre(t, f)
	}
	for _, table := range tables {
		if err := outboxtest.Setup(context.Background(), f.conn, strings.TrimPrefix(table, "public.")); err != nil {
			t.Fatal(err)
		}
	}
	defaults := relay.DefaultConfig()
	p := migrations.PollParams{Table: "public.outbox", Notify: true, Channel: defaults.Poll.Channel("public.outbox")}
	if err := migrations.ApplyPoll(context.Background(), f.checkDB, p); err != nil {
		t.Fatal(err)
	}
	c := env.NewConsumer(t, f.topics[:1])
	cfg := f.config()
	cfg.Postgres.Tables = append(cfg.Postgres.Tables, tables...)
	w := runInProcess(t, cfg)
	f.waitStreaming(t)
	relayed := f.insertEvents(t, "0001", 3, nil)
	c.WaitFor(t, len(relayed), time.Minute)
	if err := w.stop(t); err != nil {
		t.Fatal(err)
	}
	return f, c, relayed
}

// TestHandoverRefusesPendingEventsAPollRelayCannotRelay: poll.handover.slot
// drops the WAL relay's slot once rows carry everything it has not
// relayed. Three kinds of pending events no row carries: a logical
// decoding message, an insert whose row its own transaction deleted (the
// delete-after-insert writer), an insert into another outbox table the
// WAL relay relayed. With any of them pending, the handover must stop the
// poll relay (fatal, naming it) and keep the slot, so that the WAL relay,
// run again, relays it; the next handover then goes through and every
// event reaches Kafka. (Before, the slot was dropped with them.)
func TestHandoverRefusesPendingEventsAPollRelayCannotRelay(t *testing.T) {
	env := testenv.Require(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		tables []string // the WAL relay's other outbox tables
		pre    func(t *testing.T, f *fixture)
		write  func(t *testing.T, f *fixture) string
		want   string
	}{
		{name: "message", want: "logical decoding messages", write: func(t *testing.T, f *fixture) string {
			id := "00000000-0000-4000-8000-000900000000"
			f.exec(t, "SELECT pg_logical_emit_message(true, 'outbox', $1)",
				fmt.Sprintf(`{"id":%q,"aggregatetype":%q,"aggregateid":"m1","type":"T","payload":{}}`, id, f.shape.AggregateTypes[0]))
			return id
		}},
		{name: "deleted-row", want: "whose rows are gone", write: func(t *testing.T, f *fixture) string {
			id := "00000000-0000-4000-8000-000900000001"
			tx, err := f.conn.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			// (Past the poll table's trigger, which keeps such rows: as
			// a writer did before pgoutbox migrate added it.)
			if _, err := tx.Exec(ctx, "SET LOCAL pgoutbox.delete_unpublished = on"); err != nil {
				t.Fatal(err)
			}
			for _, sql := range []string{
				`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, 'd1', 'T', '{}')`,
				`DELETE FROM outbox WHERE id = $1`,
			} {
				args := []any{id}
				if strings.HasPrefix(sql, "INSERT") {
					args = append(args, f.shape.AggregateTypes[0])
				}
				if _, err := tx.Exec(ctx, sql, args...); err != nil {
					t.Fatal(err)
				}
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			return id
		}},
		{name: "other-table", tables: []string{"public.outbox2"}, want: "tables this poll relay does not read", write: func(t *testing.T, f *fixture) string {
			id := "00000000-0000-4000-8000-000900000002"
			f.exec(t, `INSERT INTO outbox2 (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, 'o1', 'T', '{}')`, id, f.shape.AggregateTypes[0])
			return id
		}},
		// Reported under the partition's own name: the WAL relay's
		// record names the partitioned table.
		{name: "other-partitioned-table", tables: []string{"public.outbox2"}, want: "tables this poll relay does not read", pre: func(t *testing.T, f *fixture) {
			f.exec(t, `CREATE TABLE outbox2 (id uuid NOT NULL, aggregatetype varchar(255) NOT NULL, aggregateid varchar(255) NOT NULL,
				type varchar(255) NOT NULL, payload jsonb, created_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (id)) PARTITION BY HASH (id)`)
			f.exec(t, "CREATE TABLE outbox2_h0 PARTITION OF outbox2 FOR VALUES WITH (MODULUS 2, REMAINDER 0)")
			f.exec(t, "CREATE TABLE outbox2_h1 PARTITION OF outbox2 FOR VALUES WITH (MODULUS 2, REMAINDER 1)")
			f.exec(t, "CREATE PUBLICATION "+f.pub+" FOR TABLE outbox, outbox2 WITH (publish = 'insert')")
		}, write: func(t *testing.T, f *fixture) string {
			id := "00000000-0000-4000-8000-000900000003"
			f.exec(t, `INSERT INTO outbox2 (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, 'o1', 'T', '{}')`, id, f.shape.AggregateTypes[0])
			return id
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, c, relayed := handoverFixture(t, env, tc.pre, tc.tables...)
			// Pending in the slot: one event of the kind, one plain row.
			special := tc.write(t, f)
			plain := f.insertEvents(t, "0002", 1, nil)

			pcfg := f.pollConfig()
			pcfg.Poll.HandoverSlot = f.slot
			bad := runInProcess(t, pcfg)
			err := bad.exited(t, time.Minute)
			var fe *relay.FatalError
			if !errors.As(err, &fe) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("handover with a pending %s: %v, want a fatal error saying %q", tc.name, err, tc.want)
			}
			t.Logf("refused: %v", err)
			if confirmed, _ := f.slotState(t); confirmed == 0 {
				t.Fatal("the refused handover dropped the slot")
			}
			var published bool
			if err := f.checkDB.QueryRow(ctx, "SELECT published_at IS NOT NULL FROM outbox WHERE id = $1", plain[0]).Scan(&published); err != nil || published {
				t.Fatalf("the plain pending row after the refused handover: published %v (%v), want unpublished", published, err)
			}

			// The WAL relay relays what is pending; then the handover goes
			// through, and the plain row is not sent twice by the poll relay.
			cfg := f.config()
			cfg.Postgres.Tables = append(cfg.Postgres.Tables, tc.tables...)
			w := runInProcess(t, cfg)
			want := append(slices.Clone(relayed), special)
			want = append(want, plain...)
			msgs := c.WaitFor(t, len(want), time.Minute)
			if err := w.stop(t); err != nil {
				t.Fatal(err)
			}
			stop := runRelay(t, pcfg)
			testenv.Eventually(t, time.Minute, 50*time.Millisecond, func() (bool, string) {
				confirmed, _ := f.slotState(t)
				return confirmed == 0, "the handover did not drop the slot"
			})
			more := f.insertEvents(t, "0003", 2, nil)
			want = append(want, more...)
			msgs = c.WaitFor(t, len(want), time.Minute)
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			slices.Sort(want)
			if got := receivedIDs(msgs); !slices.Equal(got, want) {
				t.Fatalf("received %v, want %v", got, want)
			}
			if len(msgs) != len(want) {
				t.Errorf("%d records for %d events: the handover marked what the WAL relay had relayed, so none should repeat", len(msgs), len(want))
			}
		})
	}
}

// TestHandoverWaitsForAsynchronousCommitsToBeFlushed: a transaction
// committed with synchronous_commit=off is visible at once, but its commit
// record reaches disk only when the WAL writer flushes it, and a slot's
// peek decodes flushed WAL only. A handover that read it then would see
// the row, not find it among the slot's pending inserts, and mark it
// published: an event never relayed. The WAL writer is held (SIGSTOP, so
// that the window stays open on demand: a real server cannot be made to
// hold it otherwise) while the row is written and the handover starts; it
// must wait for the flush, and the row must reach Kafka.
func TestHandoverWaitsForAsynchronousCommitsToBeFlushed(t *testing.T) {
	env := testenv.RequireExclusive(t)
	f, c, relayed := handoverFixture(t, env, nil)
	ctx := context.Background()
	var pid int
	if err := f.checkDB.QueryRow(ctx, "SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("hold the WAL writer (pid %d): %v", pid, err)
	}
	held := true
	resume := func() {
		if held {
			held = false
			if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
				t.Errorf("resume the WAL writer (pid %d): %v", pid, err)
			}
		}
	}
	defer resume()
	f.exec(t, "SET synchronous_commit = off")
	async := f.insertEvents(t, "0004", 3, nil)
	f.exec(t, "RESET synchronous_commit")
	var unflushed bool
	if err := f.checkDB.QueryRow(ctx, "SELECT pg_current_wal_flush_lsn() < pg_current_wal_insert_lsn()").Scan(&unflushed); err != nil {
		t.Fatal(err)
	}
	if !unflushed {
		t.Fatal("the asynchronous commits were flushed with the WAL writer held: the test cannot open the window")
	}

	core, logs := observer.New(zapcore.InfoLevel)
	log := zap.New(zapcore.NewTee(core, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)).Core()))
	pcfg := f.pollConfig()
	pcfg.Poll.HandoverSlot = f.slot
	stop := runRelayLog(t, pcfg, log)
	testenv.Eventually(t, 30*time.Second, 20*time.Millisecond, func() (bool, string) {
		var marked int
		if err := f.checkDB.QueryRow(ctx, "SELECT count(*) FROM outbox WHERE id = ANY($1::uuid[]) AND published_at IS NOT NULL", async).Scan(&marked); err != nil {
			t.Fatal(err)
		}
		if marked > 0 {
			t.Fatalf("the handover marked %d of the %d asynchronously committed rows published, which the slot had not relayed: their events are lost", marked, len(async))
		}
		return logs.FilterMessageSnippet("waiting for the server to flush its WAL").Len() > 0,
			"the handover did not wait for the WAL to be flushed"
	})
	resume()
	want := append(slices.Clone(relayed), async...)
	msgs := c.WaitFor(t, len(want), time.Minute)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	slices.Sort(want)
	if got := receivedIDs(msgs); !slices.Equal(got, want) {
		t.Fatalf("received %v, want %v: the asynchronously committed rows were marked published", got, want)
	}
	if confirmed, _ := f.slotState(t); confirmed != 0 {
		t.Fatalf("the WAL source's slot is still there (confirmed %s)", confirmed)
	}
}

// TestHandoverRefusesASlotMovedPastItsFence: the handover takes every row
// committed before the slot's position for relayed. A slot moved on while
// the WAL relay was stopped (pg_replication_slot_advance, another client)
// says nothing of the rows in between, which never reached Kafka: the
// handover must refuse (fatal), mark nothing and keep the slot, as cleanup
// refuses to delete by it. The WAL relay, started as the error says,
// refuses too and holds cleanup; the handover then refuses while the hold
// stands. (Before, the three rows were marked published and never sent.)
func TestHandoverRefusesASlotMovedPastItsFence(t *testing.T) {
	env := testenv.Require(t)
	ctx := context.Background()
	f, _, _ := handoverFixture(t, env, nil)
	skipped := f.insertEvents(t, "0002", 3, nil)
	f.exec(t, "SELECT pg_replication_slot_advance($1, pg_current_wal_lsn())", f.slot)
	unpublished := func(when string) {
		t.Helper()
		var n int
		if err := f.checkDB.QueryRow(ctx, "SELECT count(*) FROM outbox WHERE id = ANY($1) AND published_at IS NULL", skipped).Scan(&n); err != nil || n != len(skipped) {
			t.Fatalf("%s: %d of the %d skipped rows unpublished (%v)", when, n, len(skipped), err)
		}
		if confirmed, _ := f.slotState(t); confirmed == 0 {
			t.Fatalf("%s: the slot was dropped", when)
		}
	}
	pcfg := f.pollConfig()
	pcfg.Poll.HandoverSlot = f.slot
	handover := func(want string) {
		t.Helper()
		err := runInProcess(t, pcfg).exited(t, time.Minute)
		var fe *relay.FatalError
		if !errors.As(err, &fe) || !strings.Contains(err.Error(), want) {
			t.Fatalf("handover from a slot moved past its fence: %v, want a fatal error saying %q", err, want)
		}
		t.Logf("refused: %v", err)
	}
	handover("past")
	unpublished("after the first refused handover")

	err := runInProcess(t, f.config()).exited(t, time.Minute)
	if !errors.Is(err, replication.ErrSlotAdvanced) {
		t.Fatalf("the WAL relay on the moved slot: %v, want ErrSlotAdvanced", err)
	}
	handover("is held")
	unpublished("after the second refused handover")
}

// TestHandoverReadsThroughAPublicationThatCarriedTheTableAllAlong: the
// handover names the slot's pending inserts by decoding them through a
// publication, and decoding judges each change by the publication as it
// was when the change was written. The poll relay's
// postgres.publication.name may be another than the WAL relay's: one
// given the table after the pending inserts (as the handover's own
// refusal of a publication without the table advised) passed the catalog
// check, named none of them, and they were marked published without ever
// being relayed. With the WAL relay's state row, the handover now reads
// through the publication it recorded, and the pending row is published;
// without one, a publication that took the table in after what the slot
// still holds is refused, and nothing is marked.
func TestHandoverReadsThroughAPublicationThatCarriedTheTableAllAlong(t *testing.T) {
	env := testenv.Require(t)
	ctx := context.Background()
	for _, recorded := range []bool{true, false} {
		t.Run(map[bool]string{true: "state_row", false: "no_state_row"}[recorded], func(t *testing.T) {
			f, c, relayed := handoverFixture(t, env, nil)
			pending := f.insertEvents(t, "0002", 2, nil)
			late := "late_" + f.pub[len(f.pub)-10:]
			f.exec(t, "CREATE PUBLICATION "+late+" FOR TABLE outbox WITH (publish = 'insert')")

			pcfg := f.pollConfig()
			pcfg.Poll.HandoverSlot = f.slot
			pcfg.Postgres.Publication = late
			if !recorded {
				pcfg.Postgres.StateTable = ""
				bad := runInProcess(t, pcfg)
				err := bad.exited(t, time.Minute)
				var fe *relay.FatalError
				if !errors.As(err, &fe) || !strings.Contains(err.Error(), "after the oldest change slot") {
					t.Fatalf("handover through a publication that took the table in later: %v, want a fatal error saying so", err)
				}
				// Nothing marked: the relayed rows too stay unpublished.
				if n, want := f.unpublished(t), len(relayed)+len(pending); n != want {
					t.Fatalf("%d unpublished rows after the refused handover, want %d", n, want)
				}
				if confirmed, _ := f.slotState(t); confirmed == 0 {
					t.Fatal("the refused handover dropped the slot")
				}
				return
			}
			stop := runRelay(t, pcfg)
			testenv.Eventually(t, time.Minute, 50*time.Millisecond, func() (bool, string) {
				confirmed, _ := f.slotState(t)
				return confirmed == 0, "the handover did not drop the slot"
			})
			want := append(slices.Clone(relayed), pending...)
			msgs := c.WaitFor(t, len(want), time.Minute)
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			slices.Sort(want)
			if got := receivedIDs(msgs); !slices.Equal(got, want) {
				t.Fatalf("received %v, want %v: the pending rows must be published, not marked", got, want)
			}
			var unpublished int
			if err := f.checkDB.QueryRow(ctx, "SELECT count(*) FROM outbox WHERE published_at IS NULL").Scan(&unpublished); err != nil || unpublished != 0 {
				t.Fatalf("%d rows unpublished (%v)", unpublished, err)
			}
		})
	}
}

// TestPollStartWithoutHandoverWhileTheWALSlotIsLeftIsRefused: a move
// from the WAL source to the poll source without poll.handover.slot. The
// poll relay started and published the rows, but the events only the WAL
// relay's slot held (here a row its own transaction deleted) never
// reached Kafka, without a word (a prober lost 20 of 50 so), and the slot
// kept WAL. Now the poll relay refuses to start (fatal, naming the slot
// and poll.handover.slot) while that slot exists; a slot of another
// Kafka cluster (a region's) does not stop it.
func TestPollStartWithoutHandoverWhileTheWALSlotIsLeftIsRefused(t *testing.T) {
	env := testenv.Require(t)
	ctx := context.Background()
	f, c, relayed := handoverFixture(t, env, nil)
	deleted := "00000000-0000-4000-8000-000900000010"
	tx, err := f.conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{"SET LOCAL pgoutbox.delete_unpublished = on",
		`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ('` + deleted + `', '` + f.shape.AggregateTypes[0] + `', 'd1', 'T', '{}')`,
		`DELETE FROM outbox WHERE id = '` + deleted + `'`} {
		if _, err := tx.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	plain := f.insertEvents(t, "0002", 1, nil)

	pcfg := f.pollConfig()
	err = runInProcess(t, pcfg).exited(t, time.Minute)
	var fe *relay.FatalError
	if !errors.As(err, &fe) || !errors.Is(err, replication.ErrSlotLeftBehind) || !strings.Contains(err.Error(), "poll.handover.slot: "+f.slot) {
		t.Fatalf("poll start without poll.handover.slot beside the WAL relay's slot: %v, want a fatal error naming the slot and the setting", err)
	}
	if n := f.unpublished(t); n != len(relayed)+1 {
		t.Fatalf("%d unpublished rows after the refusal, want %d: the poll relay published some", n, len(relayed)+1)
	}
	// The same slot recorded as publishing to another Kafka cluster is
	// another deployment's: it does not stop the poll source.
	var dest string
	if err := f.checkDB.QueryRow(ctx, "SELECT destination FROM pgoutbox_state WHERE slot_name = $1", f.slot).Scan(&dest); err != nil {
		t.Fatal(err)
	}
	f.exec(t, "UPDATE pgoutbox_state SET destination = regexp_replace(destination, 'kafka=-?[0-9]+', 'kafka=12345') WHERE slot_name = $1", f.slot)
	// (Here that cluster is this one: the rows the WAL relay relayed are
	// published again, 3+4 records so far.)
	stop := runRelay(t, pcfg)
	testenv.Eventually(t, time.Minute, 50*time.Millisecond, func() (bool, string) {
		return f.unpublished(t) == 0, "the poll relay beside another cluster's slot published nothing"
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	c.WaitFor(t, 2*len(relayed)+1, time.Minute)
	f.exec(t, "UPDATE pgoutbox_state SET destination = $2 WHERE slot_name = $1", f.slot, dest)

	// The way on: the WAL relay relays what only its slot holds (the
	// deleted row and the plain one), and the handover takes over.
	w := runInProcess(t, f.config())
	want := append(slices.Clone(relayed), deleted)
	want = append(want, plain...)
	c.WaitFor(t, 2*len(relayed)+3, time.Minute)
	if err := w.stop(t); err != nil {
		t.Fatal(err)
	}
	pcfg.Poll.HandoverSlot = f.slot
	stop = runRelay(t, pcfg)
	testenv.Eventually(t, time.Minute, 50*time.Millisecond, func() (bool, string) {
		confirmed, _ := f.slotState(t)
		return confirmed == 0, "the handover did not drop the slot"
	})
	more := f.insertEvents(t, "0003", 2, nil)
	want = append(want, more...)
	msgs := c.WaitFor(t, 2*len(relayed)+5, time.Minute)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	slices.Sort(want)
	if got := receivedIDs(msgs); !slices.Equal(got, want) {
		t.Fatalf("received %v, want %v", got, want)
	}
}
