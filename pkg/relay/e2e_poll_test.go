package relay_test

import (
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/pkg/outboxtest"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// TestPollDeliversEveryCommittedEventWithFourInstances runs four relays on
// the poll source at once while 10,000 events are written in transactions
// of 1-50 rows over 100 aggregates (some rolling back, some touching only
// another table): every committed event arrives exactly once with the
// right topic, key, value and id, in commit order per key, nothing rolled
// back, every row marked published, and the buckets are shared out.
func TestPollDeliversEveryCommittedEventWithFourInstances(t *testing.T) {
	env := testenv.Require(t)
	f := newPollFixture(t, env, 3)
	cfg := f.pollConfig()
	var stops []func() error
	for range 4 {
		stops = append(stops, runRelay(t, cfg))
	}
	f.waitBalanced(t, 4, cfg.Poll.Buckets)

	w := outboxtest.NewWriter(f.conn, "outbox", f.shape, 21)
	writeEvents(t, w, 10000, 5000)
	if len(w.RolledBack) == 0 {
		t.Fatal("the workload rolled nothing back")
	}
	c := env.NewConsumer(t, f.topics)
	waitAll(t, c, w, 3*time.Minute)
	for i, stop := range stops {
		if err := stop(); err != nil {
			t.Fatalf("relay %d stopped with %v", i, err)
		}
	}
	msgs := drain(t, c, f)
	rep := outboxtest.Check(w.Committed, w.RolledBack, delivered(msgs), nil)
	t.Logf("%d transactions: %s", w.Txns, rep)
	if !rep.OK() || rep.Duplicates != 0 || rep.Verified != w.Events() {
		t.Fatalf("delivery check failed: %s", rep)
	}
	if n := f.unpublished(t); n != 0 {
		t.Fatalf("%d rows still unpublished", n)
	}
}
