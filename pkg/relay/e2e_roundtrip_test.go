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

	"github.com/pgoutbox/pgoutbox/migrations"
	"github.com/pgoutbox/pgoutbox/pkg/outboxtest"
	"github.com/pgoutbox/pgoutbox/pkg/relay"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
	"github.com/pgoutbox/pgoutbox/replication"
)

// migratePoll adds the poll columns and triggers to the fixture's outbox,
// as pgoutbox migrate with relay.source=poll does.
func migratePoll(t *testing.T, f *fixture) {
	t.Helper()
	defaults := relay.DefaultConfig()
	p := migrations.PollParams{Table: "public.outbox", Notify: true, Channel: defaults.Poll.Channel("public.outbox")}
	if err := migrations.ApplyPoll(context.Background(), f.checkDB, p); err != nil {
		t.Fatal(err)
	}
}

// awaiting reads the state row's awaiting_snapshot ("" when none or no row).
func awaiting(t *testing.T, f *fixture) string {
	t.Helper()
	var why string
	err := f.checkDB.QueryRow(context.Background(), "SELECT coalesce(max(to_jsonb(st) ->> 'awaiting_snapshot'), '') FROM pgoutbox_state st WHERE slot_name = $1", f.slot).Scan(&why)
	if err != nil {
		t.Fatal(err)
	}
	return why
}

// TestRoundTripFromWALToPollAndBackDeliversEachEventOnce moves WAL → poll →
// WAL with the same slot name, as the README's procedures say, while a
// writer runs throughout: the handover drops the slot and leaves its state
// row awaiting a snapshot; the WAL source, started again with
// snapshot.mode: initial and snapshot.rows: unpublished, publishes what the
// poll relays left unpublished and makes the slot. Every event arrives
// exactly once. (Before, the handover left the slot's state row as it was,
// the WAL source took the slot for lost and stopped (exit 1), and migrate
// --recreate-slot, as it advised, made the slot without the snapshot, so
// the rows the poll era left unpublished were never relayed.)
func TestRoundTripFromWALToPollAndBackDeliversEachEventOnce(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 3)
	f.shape.DeletePct = 0 // the poll source reads rows: writers must keep them
	w := outboxtest.NewWriter(f.conn, "outbox", f.shape, 61)
	c := env.NewConsumer(t, f.topics)

	// WAL.
	stop := runRelay(t, f.config())
	f.waitStreaming(t)
	bw := startWriterUntilCleanup(t, w, 100_000)
	progress(t, c, bw, 1000)
	migratePoll(t, f)
	progress(t, c, bw, 500)
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	// → poll.
	pcfg := f.pollConfig()
	pcfg.Poll.HandoverSlot = f.slot
	stops := []func() error{runRelay(t, pcfg), runRelay(t, pcfg)}
	progress(t, c, bw, 1000)
	if confirmed, _ := f.slotState(t); confirmed != 0 {
		t.Fatalf("the WAL source's slot is still there (confirmed %s)", confirmed)
	}
	if why := awaiting(t, f); !strings.Contains(why, "handed over") {
		t.Errorf("the slot's state row after the handover awaits %q, want it to say the slot was handed over", why)
	}
	for _, stop := range stops {
		if err := stop(); err != nil {
			t.Fatal(err)
		}
	}
	leftByPoll := f.unpublished(t)

	// → WAL again, the same slot name (writers go on while no relay runs).
	cfg := f.config()
	cfg.Snapshot.Mode, cfg.Snapshot.Rows = relay.SnapshotInitial, relay.SnapshotRowsUnpublished
	r := runInProcess(t, cfg)
	target := c.Len() + 1000
	testenv.Eventually(t, time.Minute, 10*time.Millisecond, func() (bool, string) {
		select {
		case err := <-r.done:
			r.done <- err
			t.Fatalf("the WAL source started again on the slot's name stopped: %v", err)
		default:
		}
		return c.Len() >= target, fmt.Sprintf("%d records, want %d", c.Len(), target)
	})
	bw.Stop(t)
	waitAll(t, c, w, 2*time.Minute)
	if err := r.stop(t); err != nil {
		t.Fatalf("the WAL source started again: %v", err)
	}
	if why := awaiting(t, f); why != "" {
		t.Fatalf("the state row still awaits a snapshot (%q) once the slot streams", why)
	}
	if confirmed, _ := f.slotState(t); confirmed == 0 {
		t.Fatal("no slot once the WAL source streams again")
	}
	t.Logf("%d rows left unpublished by the poll relays, %d events in all", leftByPoll, w.Events())
	exactlyOnce(t, c, f, w)
}

// TestHandoverCountsTheMessagesOfTheWALRelaysPrefix: the handover refuses
// while the slot holds messages it has not relayed, counted with a prefix.
// A poll configuration keeps the default messages.prefix; the WAL relay
// here used another. Its state row records it, and the handover counts
// with it; a row from an earlier version records none, and the handover
// refuses on pending messages of any other prefix. Either way the slot is
// kept, and once the WAL relay has relayed the message the handover goes
// through: both messages reach Kafka. (Before, the handover counted the
// prefix "outbox" only, took over, and dropped the slot with m2 in it.)
func TestHandoverCountsTheMessagesOfTheWALRelaysPrefix(t *testing.T) {
	env := testenv.Require(t)
	ctx := context.Background()
	for _, recorded := range []bool{true, false} {
		t.Run(map[bool]string{true: "recorded", false: "earlier_version"}[recorded], func(t *testing.T) {
			f := newFixture(t, env, 1)
			c := env.NewConsumer(t, f.topics[:1])
			cfg := f.config()
			cfg.Messages.Prefix = "evt"
			emit := func(n int) string {
				id := fmt.Sprintf("00000000-0000-4000-8000-0009000000%02d", n)
				f.exec(t, "SELECT pg_logical_emit_message(true, 'evt', $1)",
					fmt.Sprintf(`{"id":%q,"aggregatetype":%q,"aggregateid":"m","type":"T","payload":{}}`, id, f.shape.AggregateTypes[0]))
				return id
			}
			w := runInProcess(t, cfg)
			f.waitStreaming(t)
			m1 := emit(1)
			c.WaitFor(t, 1, time.Minute)
			migratePoll(t, f)
			if err := w.stop(t); err != nil {
				t.Fatal(err)
			}
			if !recorded {
				f.exec(t, "UPDATE pgoutbox_state SET messages_prefix = NULL WHERE slot_name = $1", f.slot)
			}
			m2 := emit(2)

			pcfg := f.pollConfig()
			pcfg.Poll.HandoverSlot = f.slot
			err := runInProcess(t, pcfg).exited(t, time.Minute)
			want := `1 logical decoding messages with prefix "evt"`
			if !recorded {
				want = `other than "outbox" (messages.prefix): "evt" (1)`
			}
			var fe *relay.FatalError
			if !errors.As(err, &fe) || !strings.Contains(err.Error(), want) {
				t.Fatalf("handover with a message of the WAL relay's prefix pending: %v, want a fatal error saying %q", err, want)
			}
			t.Logf("refused: %v", err)
			if confirmed, _ := f.slotState(t); confirmed == 0 {
				t.Fatal("the refused handover dropped the slot")
			}

			w = runInProcess(t, cfg)
			c.WaitFor(t, 2, time.Minute)
			if err := w.stop(t); err != nil {
				t.Fatal(err)
			}
			stop := runRelay(t, pcfg)
			testenv.Eventually(t, time.Minute, 50*time.Millisecond, func() (bool, string) {
				confirmed, _ := f.slotState(t)
				return confirmed == 0, "the handover did not drop the slot"
			})
			rows := f.insertEvents(t, "0003", 2, nil)
			msgs := c.WaitFor(t, 4, time.Minute)
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			want2 := append([]string{m1, m2}, rows...)
			slices.Sort(want2)
			if got := receivedIDs(msgs); !slices.Equal(got, want2) {
				t.Fatalf("received %v, want %v", got, want2)
			}
			var prefix *string
			if err := f.checkDB.QueryRow(ctx, "SELECT messages_prefix FROM pgoutbox_state WHERE slot_name = $1", f.slot).Scan(&prefix); err != nil || prefix != nil {
				t.Fatalf("the handed-over slot's state row records prefix %v (%v), want none: it awaits a snapshot", prefix, err)
			}
		})
	}
}

// TestRecreateSlotWithInitialSnapshotRelaysTheGap: a slot lost while
// pgoutbox was stopped, with snapshot.mode: initial. The start refuses
// (the slot is gone, not handed over), naming migrate --recreate-slot;
// migrate --recreate-slot with that configuration makes no slot, says so
// once, records the hold and leaves the slot to the next start, whose
// snapshot publishes the rows of the gap. (Before, migrate made the slot
// at once, printed that it had and that it had not, and the gap's rows
// were never relayed.)
func TestRecreateSlotWithInitialSnapshotRelaysTheGap(t *testing.T) {
	env := testenv.Require(t)
	ctx := context.Background()
	f := newFixture(t, env, 1)
	c := env.NewConsumer(t, f.topics[:1])
	w := runInProcess(t, f.config())
	f.waitStreaming(t)
	before := f.insertEvents(t, "0001", 3, nil)
	c.WaitFor(t, len(before), time.Minute)
	if err := w.stop(t); err != nil {
		t.Fatal(err)
	}
	f.exec(t, "SELECT pg_drop_replication_slot($1)", f.slot)
	gap := f.insertEvents(t, "0002", 3, nil)

	cfg := f.config()
	cfg.Snapshot.Mode = relay.SnapshotInitial
	err := runInProcess(t, cfg).exited(t, time.Minute)
	if !errors.Is(err, replication.ErrSlotVanished) || !strings.Contains(err.Error(), "--recreate-slot") {
		t.Fatalf("a start with the slot lost: %v, want ErrSlotVanished naming migrate --recreate-slot", err)
	}

	cmd := exec.Command(pgoutboxBinary(t), "migrate", "--recreate-slot")
	cmd.Env = append(f.environ(), "PGOUTBOX_SNAPSHOT_MODE=initial")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("migrate --recreate-slot: %v\n%s", err, out)
	}
	t.Logf("migrate --recreate-slot:\n%s", out)
	if strings.Contains(string(out), "created again") || strings.Count(string(out), "not created") != 1 {
		t.Errorf("migrate --recreate-slot with snapshot.mode=initial must say once that it left the slot to the snapshot:\n%s", out)
	}
	if confirmed, _ := f.slotState(t); confirmed != 0 {
		t.Errorf("migrate --recreate-slot made the slot (at %s) before the snapshot", confirmed)
	}
	if why := awaiting(t, f); !strings.Contains(why, "recreate-slot") {
		t.Errorf("the state row awaits %q, want the recreation", why)
	}
	more := f.insertEvents(t, "0003", 2, nil)

	stop := runRelay(t, cfg)
	want := append(append(slices.Clone(before), gap...), more...)
	msgs := c.WaitFor(t, len(want)+len(before), time.Minute) // the snapshot sends the rows relayed before again
	after := f.insertEvents(t, "0004", 2, nil)
	want = append(want, after...)
	msgs = c.WaitFor(t, len(msgs)+len(after), time.Minute)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	slices.Sort(want)
	if got := receivedIDs(msgs); !slices.Equal(got, want) {
		t.Fatalf("received %v, want %v: the gap's rows were not relayed", got, want)
	}
	var hold string
	if err := f.checkDB.QueryRow(ctx, "SELECT coalesce(cleanup_hold, '') FROM pgoutbox_state WHERE slot_name = $1", f.slot).Scan(&hold); err != nil || !strings.Contains(hold, "recreate-slot") {
		t.Fatalf("cleanup hold %q (%v) once the snapshot made the slot, want the recreation's, until released", hold, err)
	}
}
