package relay_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/pgoutbox/pgoutbox/pkg/outboxtest"
	"github.com/pgoutbox/pgoutbox/pkg/relay"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

func (f *fixture) activePID(t testing.TB) int {
	t.Helper()
	var pid *int
	err := f.checkDB.QueryRow(context.Background(), "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1", f.slot).Scan(&pid)
	if err != nil || pid == nil {
		return 0
	}
	return *pid
}

// TestStandbyTakesOverWithinTenSeconds starts two instances for one slot:
// the second waits as a standby and takes over within 10 s of the first
// one's death, with nothing lost.
func TestStandbyTakesOverWithinTenSeconds(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 3)
	w := outboxtest.NewWriter(f.conn, "outbox", f.shape, 7)
	c := env.NewConsumer(t, f.topics)
	active := startBinary(t, f, "active.log")
	standby := startBinary(t, f, "standby.log")
	testenv.Eventually(t, 30*time.Second, 50*time.Millisecond, func() (bool, string) {
		data, _ := os.ReadFile(standby.log)
		return strings.Contains(string(data), "standby"), "the second instance has not logged that it is a standby"
	})
	ctx := context.Background()
	for i := 0; i < 50; i++ {
		if err := w.Txn(ctx); err != nil {
			t.Fatal(err)
		}
	}
	waitAll(t, c, w, time.Minute)
	before := f.activePID(t)
	if err := active.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	active.wait(t, 30*time.Second)
	killed := time.Now()
	testenv.Eventually(t, 15*time.Second, 20*time.Millisecond, func() (bool, string) {
		pid := f.activePID(t)
		return pid != 0 && pid != before, "no instance took the slot over"
	})
	took := time.Since(killed)
	t.Logf("standby took over %s after the kill", took.Round(time.Millisecond))
	if took > 10*time.Second {
		t.Fatalf("standby took %s to take over", took)
	}
	for i := 0; i < 50; i++ {
		if err := w.Txn(ctx); err != nil {
			t.Fatal(err)
		}
	}
	waitAll(t, c, w, time.Minute)
	standby.terminate(t, time.Minute)
	// Duplicates are explained by the sessions' starts as logged (the
	// standby may take the slot before any high-water mark could be read).
	rep := outboxtest.Check(w.Committed, w.RolledBack, delivered(drain(t, c, f)), sessionStarts(t, active.log, standby.log))
	if !rep.OK() {
		t.Fatalf("after takeover: %s", rep)
	}
}

// TestSlotDroppedUnderTheRelayIsFatal drops the relay's slot while it is
// disconnected and recreates it: the relay must stop with an error naming
// the slot instead of streaming from the new slot and skipping what was
// written in between.
func TestSlotDroppedUnderTheRelayIsFatal(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 1)
	cfg := f.config()
	cfg.Relay.RestartBackoff = 2 * time.Second
	cfg.Relay.RestartBackoffMax = 4 * time.Second
	r, err := relay.New(cfg, zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	f.waitStreaming(t)
	ctx := context.Background()
	if _, err := f.checkDB.Exec(ctx, "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1", f.slot); err != nil {
		t.Fatal(err)
	}
	// Drop the slot as soon as the walsender is gone, write an event the
	// new slot will never see, and recreate the slot.
	testenv.Eventually(t, 10*time.Second, 10*time.Millisecond, func() (bool, string) {
		_, err := f.checkDB.Exec(ctx, "SELECT pg_drop_replication_slot($1)", f.slot)
		return err == nil, fmt.Sprint("drop slot: ", err)
	})
	w := outboxtest.NewWriter(f.conn, "outbox", f.shape, 8)
	if err := w.Txn(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := f.checkDB.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", f.slot); err != nil {
		t.Fatal(err)
	}
	select {
	case err = <-done:
	case <-time.After(time.Minute):
		t.Fatal("relay did not stop by itself within a minute")
	}
	var fe *relay.FatalError
	if !errors.As(err, &fe) || !strings.Contains(err.Error(), f.slot) {
		t.Fatalf("want a fatal error naming slot %s, got %v", f.slot, err)
	}
	t.Logf("relay stopped with: %v", err)
}

// TestLostSlotAtStartUpIsFatal invalidates the relay's slot for real
// (max_slot_wal_keep_size exceeded while nothing streams) and starts the
// binary: it must exit non-zero at once with a last line naming the slot
// and saying it is lost, and must neither stream from it nor recreate it.
// It changes a server setting, so it runs alone.
func TestLostSlotAtStartUpIsFatal(t *testing.T) {
	env := testenv.RequireExclusive(t)
	f := newFixture(t, env, 1)
	ctx := context.Background()
	if _, err := f.checkDB.Exec(ctx, "CREATE PUBLICATION "+f.pub+" FOR TABLE outbox"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.checkDB.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", f.slot); err != nil {
		t.Fatal(err)
	}
	env.LoseSlot(t, f.dsn, f.slot)

	logPath := filepath.Join(t.TempDir(), "lost.log")
	lf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	p := startProcess(t, pgoutboxBinary(t), []string{"run"}, f.environ(), lf, logPath)
	code := p.wait(t, time.Minute)
	out, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	last := lines[len(lines)-1]
	t.Logf("exit %d: %s", code, last)
	if code == 0 {
		t.Fatalf("exit 0 with a lost slot")
	}
	for _, w := range []string{"pgoutbox: ", f.slot, "lost", "drop and recreate the slot deliberately"} {
		if !strings.Contains(last, w) {
			t.Errorf("last line %q lacks %q", last, w)
		}
	}
	if strings.Contains(string(out), "replication started") {
		t.Errorf("the relay streamed from a lost slot:\n%s", out)
	}
	var n int
	var status string
	if err := f.checkDB.QueryRow(ctx, "SELECT count(*), min(wal_status) FROM pg_replication_slots WHERE slot_name = $1", f.slot).Scan(&n, &status); err != nil {
		t.Fatal(err)
	}
	if n != 1 || status != "lost" {
		t.Errorf("after the exit: %d slots named %s, wal_status %q; want the lost slot left as it was", n, f.slot, status)
	}
}
