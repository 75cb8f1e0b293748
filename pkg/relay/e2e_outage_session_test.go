package relay_test

import (
	"context"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/pkg/outboxtest"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// TestSessionEndedDuringAKafkaOutageKeepsOrderPerKey: Kafka stops with
// records in flight, the relay's walsender is ended (a PostgreSQL restart
// or failover does the same), and Kafka starts again. The old session's
// producer, closed the usual way, kept retrying; once Kafka was back,
// sarama failed some of a partition's records (ErrShuttingDown) and
// delivered later ones, and the next session's resends of the failed ones
// came after later events of their keys: 2 to 6 keys out of order per
// round in a chaos prober's runs, nothing lost. Now the session's end
// aborts its producer, which delivers nothing more, and the next session
// sends everything from the slot in order. The oracle is the workload's
// own checker over what a consumer read: every committed event, in commit
// order per key (real PostgreSQL and Kafka; stops Kafka, so exclusive).
func TestSessionEndedDuringAKafkaOutageKeepsOrderPerKey(t *testing.T) {
	env := testenv.RequireExclusive(t)
	f := newFixture(t, env, 3)
	w := outboxtest.NewWriter(f.conn, "outbox", f.shape, 81)
	c := env.NewConsumer(t, f.topics)
	p := startBinary(t, f, "pgoutbox.log")
	ctx := context.Background()
	writeTxns(t, w, 200)
	waitAll(t, c, w, time.Minute)
	for round := range 2 {
		env.KafkaStop(t, "TERM")
		// Records in flight, retried by sarama (a write rate, not
		// synchronisation).
		tick := time.NewTicker(10 * time.Millisecond)
		for start := time.Now(); time.Since(start) < 3*time.Second; {
			<-tick.C
			if err := w.Txn(ctx); err != nil {
				t.Fatal(err)
			}
		}
		var ended int
		if err := f.checkDB.QueryRow(ctx, "SELECT count(pg_terminate_backend(active_pid)) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL", f.slot).Scan(&ended); err != nil || ended != 1 {
			t.Fatalf("round %d: end the walsender: %d ended, %v", round, ended, err)
		}
		for start := time.Now(); time.Since(start) < 3*time.Second; {
			<-tick.C
			if err := w.Txn(ctx); err != nil {
				t.Fatal(err)
			}
		}
		tick.Stop()
		env.KafkaStart(t)
		waitAll(t, c, w, 3*time.Minute)
	}
	p.terminate(t, time.Minute)
	msgs := drain(t, c, f)
	rep := outboxtest.Check(w.Committed, w.RolledBack, delivered(msgs), nil)
	t.Logf("%s", rep)
	requireNoLoss(t, "after sessions ended during Kafka outages", rep)
}
