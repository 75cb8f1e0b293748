package relay_test

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/checkpoint"
	"github.com/pgoutbox/pgoutbox/pkg/outboxtest"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// waitAll waits until every committed event has arrived at least once and
// returns everything consumed so far.
func waitAll(t *testing.T, c *testenv.Consumer, w *outboxtest.Writer, timeout time.Duration) []testenv.Message {
	t.Helper()
	want := make(map[string]bool, len(w.Committed))
	for _, e := range w.Committed {
		want[e.ID] = true
	}
	var msgs []testenv.Message
	testenv.Eventually(t, timeout, 50*time.Millisecond, func() (bool, string) {
		msgs = c.Messages()
		seen := make(map[string]bool, len(want))
		for _, m := range msgs {
			if id, ok := m.Header("id"); ok && want[string(id)] {
				seen[string(id)] = true
			}
		}
		if len(seen) == len(want) {
			return true, ""
		}
		first, last := -1, -1
		for _, e := range w.Committed {
			if !seen[e.ID] {
				if first < 0 {
					first = e.Seq
				}
				last = e.Seq
			}
		}
		return false, fmt.Sprintf("%d of %d committed events delivered (%d records); missing seq %d..%d", len(seen), len(want), len(msgs), first, last)
	})
	return msgs
}

// drain waits until the consumer has read every record the test's topics
// hold (their high-water marks; the topics are the test's own, so they
// start at offset 0) and returns all of them.
func drain(t *testing.T, c *testenv.Consumer, f *fixture) []testenv.Message {
	t.Helper()
	var total int64
	for _, hw := range f.env.HighWater(t, f.topics) {
		total += hw
	}
	testenv.Eventually(t, time.Minute, 50*time.Millisecond, func() (bool, string) {
		return int64(c.Len()) >= total, fmt.Sprintf("read %d of %d records", c.Len(), total)
	})
	return c.Messages()
}

// slotReleased waits until the killed relay's walsender let go of the slot
// and returns the slot's confirmed position.
func slotReleased(t *testing.T, f *fixture) checkpoint.LSN {
	t.Helper()
	var confirmed checkpoint.LSN
	testenv.Eventually(t, 30*time.Second, 20*time.Millisecond, func() (bool, string) {
		var active bool
		confirmed, active = f.slotState(t)
		return !active, "slot still active"
	})
	return confirmed
}

// TestSIGKILLMidStreamLosesNothing kills the binary with SIGKILL five times
// while a writer is busy and restarts it each time: nothing may be lost, the
// first deliveries per key must be in commit order, and every duplicate must
// belong to a transaction the slot had not confirmed at the kill.
func TestSIGKILLMidStreamLosesNothing(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 3)
	w := outboxtest.NewWriter(f.conn, "outbox", f.shape, 3)
	c := env.NewConsumer(t, f.topics)
	p := startBinary(t, f, "pgoutbox-0.log")
	logs := []string{p.log}
	bw := startWriter(w, 3000)
	for kill := 1; kill <= 5; kill++ {
		// Kill once the relay is delivering, at a moment that moves with
		// each round.
		target := c.Len() + 1500 + 397*kill
		testenv.Eventually(t, 90*time.Second, 5*time.Millisecond, func() (bool, string) {
			return c.Len() >= target, fmt.Sprintf("round %d: %d records delivered, want %d (%d events written)", kill, c.Len(), target, bw.Events())
		})
		if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		p.wait(t, 30*time.Second)
		t.Logf("kill %d: slot confirmed at %s after %d records delivered", kill, slotReleased(t, f), c.Len())
		p = startBinary(t, f, fmt.Sprintf("pgoutbox-%d.log", kill))
		logs = append(logs, p.log)
	}
	bw.Stop(t)
	msgs := waitAll(t, c, w, 3*time.Minute)
	p.terminate(t, 60*time.Second)
	msgs = drain(t, c, f)
	// Duplicates are explained by each session's logged start: a produce
	// request of a killed relay may still be appended after the high-water
	// marks looked stable.
	rep := outboxtest.Check(w.Committed, w.RolledBack, delivered(msgs), sessionStarts(t, logs...))
	t.Logf("5 SIGKILLs: %s", rep)
	if !rep.OK() {
		t.Fatalf("after SIGKILLs: %s", rep)
	}
}

// TestKafkaDownHoldsTheSlotAndRecovers stops Kafka for 30 s mid-stream. The
// slot must not be confirmed past the first transaction Kafka did not
// acknowledge, the relay's memory stays bounded by its in-flight caps, and
// after Kafka returns everything arrives without help.
func TestKafkaDownHoldsTheSlotAndRecovers(t *testing.T) {
	env := testenv.RequireExclusive(t)
	f := newFixture(t, env, 3)
	w := outboxtest.NewWriter(f.conn, "outbox", f.shape, 4)
	c := env.NewConsumer(t, f.topics)
	p := startBinary(t, f, "pgoutbox.log")
	ctx := context.Background()
	for i := 0; i < 3000 && c.Len() < 2000; i++ {
		if err := w.Txn(ctx); err != nil {
			t.Fatal(err)
		}
	}
	waitAll(t, c, w, 2*time.Minute)

	env.KafkaStop(t, "TERM")
	downAt := len(w.Committed)
	stopped := time.Now()
	// The first transaction written while Kafka is down cannot have been
	// acknowledged; the slot must stay below its commit.
	var firstDown checkpoint.LSN
	var maxRSS int64
	tick := time.NewTicker(20 * time.Millisecond) // a write rate, not synchronisation
	defer tick.Stop()
	for time.Since(stopped) < 30*time.Second {
		<-tick.C
		if err := w.Txn(ctx); err != nil {
			t.Fatal(err)
		}
		if firstDown == 0 && len(w.Committed) > downAt {
			firstDown = w.Committed[downAt].TxnHigh
		}
		if confirmed, _ := f.slotState(t); firstDown != 0 && confirmed >= firstDown {
			t.Fatalf("slot confirmed %s, at or past the first unacknowledged transaction (commit end <= %s)", confirmed, firstDown)
		}
		maxRSS = max(maxRSS, p.peakRSS())
		if w.Txns > 100000 {
			break
		}
	}
	// 5,000 records or 8 MiB in flight by default, plus the process itself.
	if maxRSS > 128<<20 {
		t.Fatalf("peak RSS %d MB while Kafka was down", maxRSS>>20)
	}
	t.Logf("Kafka down %s; %d events written meanwhile; peak RSS %d MB", time.Since(stopped).Round(time.Second), len(w.Committed)-downAt, maxRSS>>20)
	env.KafkaStart(t)
	msgs := waitAll(t, c, w, 3*time.Minute)
	p.terminate(t, 60*time.Second)
	msgs = drain(t, c, f)
	rep := outboxtest.Check(w.Committed, w.RolledBack, delivered(msgs), nil)
	t.Logf("%s", rep)
	// A resend after the outage may duplicate what Kafka had appended but not
	// acknowledged; nothing may be missing or out of order.
	if len(rep.Missing)+len(rep.Unexpected)+len(rep.Mismatched)+len(rep.OutOfOrder) > 0 {
		t.Fatalf("after Kafka outage: %s", rep)
	}
}

// TestDatabaseFastShutdownIsNotHeldUpByTheRelay stops PostgreSQL with
// pg_ctl stop -m fast while the relay is connected: the walsender waits for
// its client to confirm the end of WAL, so a relay that never confirms idle
// keepalives would hold the shutdown up. Then the relay must reconnect by
// itself once the server is back.
func TestDatabaseFastShutdownIsNotHeldUpByTheRelay(t *testing.T) {
	env := testenv.RequireExclusive(t)
	f := newFixture(t, env, 1)
	w := outboxtest.NewWriter(f.conn, "outbox", f.shape, 5)
	c := env.NewConsumer(t, f.topics)
	p := startBinary(t, f, "pgoutbox.log")
	ctx := context.Background()
	for i := 0; i < 20; i++ {
		if err := w.Txn(ctx); err != nil {
			t.Fatal(err)
		}
	}
	waitAll(t, c, w, time.Minute)
	start := time.Now()
	env.PGCtl(t, "stop", "-m", "fast", "-t", "30")
	took := time.Since(start)
	t.Logf("pg_ctl stop -m fast took %s", took)
	if took > 10*time.Second {
		t.Fatalf("pg_ctl stop -m fast took %s with the relay connected", took)
	}
	env.PGCtl(t, "start", "-w", "-t", "60")
	// The writer's connection died with the server.
	f.reconnect(t)
	w2 := outboxtest.NewWriter(f.conn, "outbox", f.shape, 6)
	for i := 0; i < 20; i++ {
		if err := w2.Txn(ctx); err != nil {
			t.Fatal(err)
		}
	}
	waitAll(t, c, w2, 2*time.Minute)
	p.terminate(t, 60*time.Second)
}
