package relay_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/pgoutbox/pgoutbox/checkpoint"
	"github.com/pgoutbox/pgoutbox/pkg/outboxtest"
	"github.com/pgoutbox/pgoutbox/pkg/relay"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// TestExactlyOnceRefusesNewTransactionsOfADatabasePutBack: exactly-once
// mode skips, at its start, every transaction that commits before the
// position Kafka holds for the slot, as one Kafka has already. A database
// put back to an earlier point (a disk snapshot restored: same system
// identifier, same timeline, its slot from then) and written past that
// position again before pgoutbox starts holds new transactions there, and
// the end of its WAL no longer shows the restore. The real servers: events
// relayed, the data directory saved, more events relayed (Kafka's position
// moves on), the saved directory put back, new outbox transactions written
// before and after Kafka's position and the WAL pushed past it. The start
// must stop with ErrTimelineForked naming the first new transaction, with
// the slot confirmed no further than before it (though the session could
// have confirmed Kafka's position long before it met the transaction) and
// none of the new events in Kafka; removing the slot's record from the
// offsets topic (a tombstone), the way the error names, then resends from
// the slot and every new event arrives.
func TestExactlyOnceRefusesNewTransactionsOfADatabasePutBack(t *testing.T) {
	env := testenv.Require(t)
	srv := env.NewServer(t)
	srv.CreateDatabase(t, "app")
	f := fixtureOn(t, env, srv.ServerDSN(srv.PrimaryPort, "app"), 1)
	cfg := f.config()
	cfg.Kafka.ExactlyOnce = true
	cfg.Kafka.OffsetsTopic = "pgoutbox.offsets." + f.slot
	c := env.NewConsumer(t, f.topics, testenv.ReadCommitted())
	ctx := context.Background()

	relayedExactlyOnce(t, f, c, cfg, 71, 3)
	// Before the snapshot, after what the slot can have confirmed: a large
	// transaction of the other table, which the next sessions read (and
	// send nothing of) for a second or so. The session on the restored
	// database has then long been able to confirm the position Kafka
	// holds by the time it meets the first new transaction: unless the
	// slot is confirmed no further than the stream was read, the server
	// would skip that transaction at the next start.
	f.exec(t, "INSERT INTO outbox_other (note) SELECT 'filler' FROM generate_series(1, 300000)")
	srv.StopPrimary(t)
	srv.SaveData(t, "snapshot")
	srv.StartPrimary(t)
	f.reconnect(t)
	relayedExactlyOnce(t, f, c, cfg, 72, 20)
	key, stored, storedAt := storedOffset(t, env, cfg.Kafka.OffsetsTopic)
	srv.StopPrimary(t)
	putBack(t, srv, "snapshot")
	srv.StartPrimary(t)
	f.reconnect(t)

	slotAt, _ := f.slotState(t)
	if slotAt == 0 || slotAt >= stored {
		t.Fatalf("the restored slot is confirmed at %s, not before %s, the position Kafka holds: the test did not make its case", slotAt, stored)
	}
	// Commit times are compared with the offsets record's time, allowing
	// a second for clocks: the new transactions commit after it.
	testenv.Eventually(t, 30*time.Second, 50*time.Millisecond, func() (bool, string) {
		var now time.Time
		if err := f.checkDB.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&now); err != nil {
			return false, err.Error()
		}
		return now.After(storedAt.Add(1100 * time.Millisecond)), fmt.Sprintf("the server's clock says %s, not yet a second past %s", now, storedAt)
	})
	shape := f.shape
	shape.DeletePct = 0 // the rows stay, to name their transaction
	w := outboxtest.NewWriter(f.conn, "outbox", shape, 73)
	writeUntil(t, w, func() bool { return w.Events() > 0 })
	first := w.Committed[0]
	if first.TxnLow <= slotAt || first.TxnHigh >= stored {
		t.Fatalf("the first new transaction committed within (%s, %s], not between the restored slot's %s and Kafka's %s: the test did not make its case",
			first.TxnLow, first.TxnHigh, slotAt, stored)
	}
	before := w.Events()
	for i := 0; f.queryLSN(t, "SELECT pg_current_wal_insert_lsn()::text") <= stored; i++ {
		if i == 10 {
			t.Fatalf("the WAL does not pass %s after %d switches", stored, i)
		}
		f.exec(t, "SELECT pg_switch_wal()")
		f.exec(t, "INSERT INTO outbox_other (note) VALUES ('filler')")
	}
	writeUntil(t, w, func() bool { return w.Events() > before })
	var after []string // new events committed past Kafka's position
	for _, e := range w.Committed[before:] {
		if e.TxnLow <= stored {
			t.Fatalf("event %s committed within (%s, %s], not past %s", e.ID, e.TxnLow, e.TxnHigh, stored)
		}
		after = append(after, e.ID)
	}
	var xid string
	if err := f.checkDB.QueryRow(ctx, "SELECT xmin::text FROM outbox WHERE id = $1", first.ID).Scan(&xid); err != nil {
		t.Fatal(err)
	}
	t.Logf("restored slot at %s; Kafka holds %s, written at %s; new transaction %s committed within (%s, %s]; %d new events before %s, %d after",
		slotAt, stored, storedAt.Format(time.RFC3339Nano), xid, first.TxnLow, first.TxnHigh, before, stored, len(after))

	// The start refuses, naming the first new transaction.
	refused := runInProcess(t, cfg)
	stopped, err := exitedOrRelayed(t, refused, c, after)
	confirmed, _ := f.slotState(t)
	if !stopped {
		_ = refused.stop(t)
		confirmed, _ = f.slotState(t)
		inKafka := map[string]bool{}
		for _, id := range receivedIDs(readToEnd(t, env, f.topics, sarama.ReadCommitted)) {
			inKafka[id] = true
		}
		var skipped []string
		for _, e := range w.Committed[:before] {
			if !inKafka[e.ID] {
				skipped = append(skipped, e.ID)
			}
		}
		t.Fatalf("the relay did not stop: it relayed the %d new events committed past %s, and %d of the %d new events committed before it are not in Kafka, skipped silently as Kafka's (first: %v); the slot is confirmed at %s",
			len(after), stored, len(skipped), before, skipped[:min(len(skipped), 3)], confirmed)
	}
	var fe *relay.FatalError
	if !errors.As(err, &fe) || !errors.Is(err, relay.ErrTimelineForked) || !strings.Contains(err.Error(), "transaction "+xid+" ") ||
		!strings.Contains(err.Error(), "remove the slot's record") {
		t.Fatalf("the start on the database put back returned %v; want a fatal ErrTimelineForked naming transaction %s and the way on", err, xid)
	}
	t.Logf("refused, the slot confirmed at %s: %v", confirmed, err)
	if confirmed > first.TxnLow {
		t.Errorf("the slot is confirmed at %s, past %s, before the new transaction's commit: PostgreSQL would skip it at the next start", confirmed, first.TxnLow)
	}
	newIDs := map[string]bool{}
	for _, e := range w.Committed {
		newIDs[e.ID] = true
	}
	for _, id := range receivedIDs(readToEnd(t, env, f.topics, sarama.ReadCommitted)) {
		if newIDs[id] {
			t.Errorf("new event %s is in Kafka, read_committed, after the refusal", id)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	// The way on: without the slot's record, the relay resends from the
	// slot's position, old events again, and every new one.
	env.Tombstone(t, cfg.Kafka.OffsetsTopic, key)
	resent := runInProcess(t, cfg)
	waitAll(t, c, w, time.Minute)
	if err := resent.stop(t); err != nil {
		t.Fatal(err)
	}
	var mine []testenv.Message
	for _, m := range readToEnd(t, env, f.topics, sarama.ReadCommitted) {
		if id, _ := m.Header("id"); newIDs[string(id)] {
			mine = append(mine, m)
		}
	}
	requireNoLoss(t, "after the slot's record was removed", w.Check(delivered(mine), nil))
}

// relayedExactlyOnce runs the relay in the test's process with cfg (in
// exactly-once mode), writes n transactions with the writer of seed, waits
// until c (read_committed) has their events and stops the relay, which
// must stop cleanly.
func relayedExactlyOnce(t *testing.T, f *fixture, c *testenv.Consumer, cfg relay.Config, seed uint64, n int) {
	t.Helper()
	w := outboxtest.NewWriter(f.conn, "outbox", f.shape, seed)
	p := runInProcess(t, cfg)
	f.waitStreaming(t)
	for range n {
		if err := w.Txn(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	waitAll(t, c, w, time.Minute)
	if err := p.stop(t); err != nil {
		t.Fatalf("stop: %v", err)
	}
}

// storedOffset reads the last committed record of the offsets topic (the
// test's own: one slot's): its key, its position and its time.
func storedOffset(t *testing.T, env *testenv.Env, topic string) (key []byte, lsn checkpoint.LSN, at time.Time) {
	t.Helper()
	msgs := readToEnd(t, env, []string{topic}, sarama.ReadCommitted)
	if len(msgs) == 0 || msgs[len(msgs)-1].Value == nil {
		t.Fatalf("the offsets topic %q holds no position (%d records)", topic, len(msgs))
	}
	m := msgs[len(msgs)-1]
	var v struct {
		LSN string `json:"lsn"`
		At  string `json:"at"`
	}
	if err := json.Unmarshal(m.Value, &v); err != nil {
		t.Fatalf("offsets record %s: %v", m.Value, err)
	}
	lsn, err := parseLSN(v.LSN)
	if err != nil {
		t.Fatal(err)
	}
	if at, err = time.Parse(time.RFC3339Nano, v.At); err != nil {
		t.Fatalf("offsets record %s: no time: %v", m.Value, err)
	}
	return m.Key, lsn, at
}

// putBack puts the copy SaveData saved under name back in place of the
// stopped primary's data directory, slots included: a disk snapshot
// restored.
func putBack(t *testing.T, srv *testenv.Pair, name string) {
	t.Helper()
	primary := filepath.Join(srv.Dir, "primary")
	if err := os.Rename(primary, filepath.Join(srv.Dir, "replaced")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(srv.Dir, name), primary); err != nil {
		t.Fatal(err)
	}
}

// writeUntil runs w's transactions until done (at most 50: some roll back
// or touch only the other table).
func writeUntil(t *testing.T, w *outboxtest.Writer, done func() bool) {
	t.Helper()
	for i := 0; !done(); i++ {
		if i == 50 {
			t.Fatalf("%d transactions written, and not yet the one wanted", i)
		}
		if err := w.Txn(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// exitedOrRelayed waits up to a minute until p stops by itself (true, its
// error), or until c has every one of ids: it relayed past them without
// stopping (false, nil).
func exitedOrRelayed(t *testing.T, p *inproc, c *testenv.Consumer, ids []string) (exited bool, err error) {
	t.Helper()
	testenv.Eventually(t, time.Minute, 50*time.Millisecond, func() (bool, string) {
		select {
		case err = <-p.done:
			p.done <- err // for its cleanup
			exited = true
			return true, ""
		default:
		}
		got := map[string]bool{}
		for _, id := range receivedIDs(c.Messages()) {
			got[id] = true
		}
		for _, id := range ids {
			if !got[id] {
				return false, fmt.Sprintf("the relay neither stopped nor relayed new event %s", id)
			}
		}
		return true, ""
	})
	return exited, err
}
