package relay_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/pgoutbox/pgoutbox/checkpoint"
	"github.com/pgoutbox/pgoutbox/pkg/outboxtest"
	"github.com/pgoutbox/pgoutbox/pkg/relay"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// runRelay runs an in-process relay until the test ends; it returns a
// function that stops it and reports Run's result.
func runRelay(t *testing.T, cfg relay.Config, opts ...relay.Option) (stop func() error) {
	t.Helper()
	return runRelayLog(t, cfg, zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)), opts...)
}

// runRelayLog is runRelay with the relay's logger given.
func runRelayLog(t *testing.T, cfg relay.Config, log *zap.Logger, opts ...relay.Option) (stop func() error) {
	t.Helper()
	r, err := relay.New(cfg, log, opts...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var stopped bool
	var result error
	stop = func() error {
		if !stopped {
			stopped = true
			cancel()
			select {
			case result = <-done:
			case <-time.After(60 * time.Second):
				t.Fatal("relay did not stop within 60s")
			}
		}
		return result
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

// TestDeliversEveryCommittedEventInCommitOrderPerKey writes 10,000 events in
// transactions of 1-50 rows over 100 aggregates, with transactions that
// delete their rows before commit, roll back, or touch only another table,
// and checks every committed event arrives once with the right topic, key,
// value and id header, in commit order per key, and nothing rolled back.
func TestDeliversEveryCommittedEventInCommitOrderPerKey(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 3)
	stop := runRelay(t, f.config())
	f.waitStreaming(t)

	const want = 10000
	w := outboxtest.NewWriter(f.conn, "outbox", f.shape, 1)
	ctx := context.Background()
	for i := 0; i < 5000 && w.Events() < want; i++ {
		if err := w.Txn(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if w.Events() < want {
		t.Fatalf("writer produced only %d events in 5000 transactions", w.Events())
	}
	if len(w.RolledBack) == 0 {
		t.Fatal("the workload rolled nothing back; the test would not show that rolled-back events are dropped")
	}

	c := env.NewConsumer(t, f.topics)
	msgs := waitAll(t, c, w, 3*time.Minute)
	if err := stop(); err != nil {
		t.Fatalf("relay stopped with %v", err)
	}
	// Anything extra (a duplicate or a rolled-back event) was produced before
	// the stop returned: read what has arrived since.
	msgs = drain(t, c, f)
	rep := outboxtest.Check(w.Committed, w.RolledBack, delivered(msgs), nil)
	t.Logf("%d transactions: %s", w.Txns, rep)
	if !rep.OK() || rep.Duplicates != 0 || rep.Verified != w.Events() {
		t.Fatalf("delivery check failed: %s", rep)
	}
}

// TestIdleOutboxDoesNotPinWAL writes 50 MB of WAL to a table outside the
// publication while the outbox is idle; the slot's confirmed position must
// follow the WAL to within 1 MB of its end, or an idle outbox would make
// PostgreSQL keep WAL forever.
func TestIdleOutboxDoesNotPinWAL(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 1)
	runRelay(t, f.config())
	f.waitStreaming(t)
	ctx := context.Background()
	_, err := f.conn.Exec(ctx, "INSERT INTO outbox_other (note) SELECT repeat(md5(g::text), 16) FROM generate_series(1, 70000) g")
	if err != nil {
		t.Fatal(err)
	}
	var before, after checkpoint.LSN
	var written int64
	if err := f.checkDB.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan((*lsnScan)(&after)); err != nil {
		t.Fatal(err)
	}
	before, _ = f.slotState(t)
	written = int64(after - before)
	if written < 50<<20 {
		// Top up to 50 MB of WAL.
		n := (50<<20-written)/600 + 1
		if _, err := f.conn.Exec(ctx, "INSERT INTO outbox_other (note) SELECT repeat(md5(g::text), 16) FROM generate_series(1, $1::bigint) g", n); err != nil {
			t.Fatal(err)
		}
		if err := f.checkDB.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan((*lsnScan)(&after)); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("wrote %d MB of WAL outside the publication", (after-before)>>20)
	if after-before < 50<<20 {
		t.Fatalf("only %d bytes of WAL written", after-before)
	}
	// The target is the end of this test's own WAL, not the server's
	// current end, which tests running alongside keep moving. The bound is
	// generous for a loaded machine; without the idle confirmation the slot
	// never gets there at all.
	testenv.Eventually(t, time.Minute, 100*time.Millisecond, func() (bool, string) {
		confirmed, _ := f.slotState(t)
		lag := int64(after) - int64(confirmed)
		return lag <= 1<<20, fmt.Sprintf("confirmed_flush_lsn %s is %d bytes behind the end of the test's WAL %s", confirmed, lag, after)
	})
}

type lsnScan checkpoint.LSN

func (l *lsnScan) Scan(src any) error {
	s, ok := src.(string)
	if !ok {
		return fmt.Errorf("want text, got %T", src)
	}
	v, err := outboxtest.ParseLSN(s)
	*l = lsnScan(v)
	return err
}

// TestSIGTERMUnderLoadExitsZeroAndRestartHasNoDuplicates stops the binary
// with SIGTERM while a writer is busy, restarts it, and checks every event
// arrived exactly once.
func TestSIGTERMUnderLoadExitsZeroAndRestartHasNoDuplicates(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 3)
	w := outboxtest.NewWriter(f.conn, "outbox", f.shape, 2)
	c := env.NewConsumer(t, f.topics)

	p := startBinary(t, f, "pgoutbox-1.log")
	bw := startWriter(w, 2000)
	// Stop once the relay is visibly streaming under load.
	testenv.Eventually(t, 60*time.Second, 20*time.Millisecond, func() (bool, string) {
		return c.Len() >= 1000, fmt.Sprintf("%d records delivered, %d events written", c.Len(), bw.Events())
	})
	p.terminate(t, 60*time.Second)
	bw.Stop(t)
	p2 := startBinary(t, f, "pgoutbox-2.log")
	msgs := waitAll(t, c, w, 2*time.Minute)
	p2.terminate(t, 60*time.Second)
	msgs = drain(t, c, f)
	rep := outboxtest.Check(w.Committed, w.RolledBack, delivered(msgs), nil)
	t.Logf("%s", rep)
	if !rep.OK() || rep.Duplicates != 0 {
		t.Fatalf("after SIGTERM and restart: %s", rep)
	}
	// A clean stop confirms every event: it says nothing of events left
	// unconfirmed (it once did after every stop, for WAL without events
	// past the fence).
	for _, p := range []*process{p, p2} {
		if lines := p.logLines(t, "not confirmed"); len(lines) > 0 {
			t.Errorf("a clean stop warned of unconfirmed events:\n%s", strings.Join(lines, "\n"))
		}
	}
}
