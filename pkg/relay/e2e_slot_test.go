package relay_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/pgoutbox/pgoutbox/pkg/outboxtest"
	"github.com/pgoutbox/pgoutbox/pkg/relay"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
	"github.com/pgoutbox/pgoutbox/replication"
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

// startBinaryWith is startBinary with extra environment, not waiting for it
// to stream.
func startBinaryWith(t *testing.T, f *fixture, logName string, extra ...string) *process {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), logName)
	lf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	return startProcess(t, pgoutboxBinary(t), []string{"run"}, append(f.environ(), extra...), lf, logPath)
}

// TestInstanceThatLostTheSlotBecomesTheStandby: when the active instance's
// connection drops and the standby takes the slot over and moves it on, the
// first instance must become the standby, not stop with "slot advanced by
// someone else"; and when the second one dies, the first takes over again.
func TestInstanceThatLostTheSlotBecomesTheStandby(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 3)
	w := outboxtest.NewWriter(f.conn, "outbox", f.shape, 11)
	c := env.NewConsumer(t, f.topics)
	ctx := context.Background()
	// a comes back slowly after losing its connection, so that b, polling
	// every ~2 s, takes the slot first.
	a := startBinaryWith(t, f, "a.log", "PGOUTBOX_RELAY_RESTART_BACKOFF=8s", "PGOUTBOX_RELAY_RESTART_BACKOFF_MAX=8s")
	f.waitStreaming(t)
	b := startBinaryWith(t, f, "b.log")
	testenv.Eventually(t, 30*time.Second, 50*time.Millisecond, func() (bool, string) {
		data, _ := os.ReadFile(b.log)
		return strings.Contains(string(data), "standby"), "b has not logged that it is a standby"
	})
	write := func(n int) {
		t.Helper()
		for i := 0; i < n; i++ {
			if err := w.Txn(ctx); err != nil {
				t.Fatal(err)
			}
		}
		waitAll(t, c, w, time.Minute)
	}
	write(20)
	aPID := f.activePID(t)
	if _, err := f.checkDB.Exec(ctx, "SELECT pg_terminate_backend($1)", aPID); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, 20*time.Millisecond, func() (bool, string) {
		pid := f.activePID(t)
		return pid != 0 && pid != aPID, "b did not take the slot over"
	})
	write(20) // b moves the slot on
	// a comes back, finds the slot busy, and waits as the standby.
	testenv.Eventually(t, 60*time.Second, 100*time.Millisecond, func() (bool, string) {
		data, _ := os.ReadFile(a.log)
		return strings.Count(string(data), "standby: the slot is in use") >= 1, "a has not become the standby"
	})
	select {
	case <-a.done:
		data, _ := os.ReadFile(a.log)
		t.Fatalf("a exited after losing the slot to b: %v\n%s", a.err, data)
	default:
	}
	bPID := f.activePID(t)
	if err := b.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	b.wait(t, 30*time.Second)
	testenv.Eventually(t, 60*time.Second, 50*time.Millisecond, func() (bool, string) {
		pid := f.activePID(t)
		return pid != 0 && pid != bPID, "a did not take the slot back"
	})
	write(20)
	a.terminate(t, time.Minute)
	rep := outboxtest.Check(w.Committed, w.RolledBack, delivered(drain(t, c, f)), sessionStarts(t, a.log, b.log))
	if !rep.OK() {
		t.Fatalf("after two takeovers: %s", rep)
	}
}

// lastLine returns the last line a process wrote to its log.
func lastLine(t *testing.T, p *process) string {
	t.Helper()
	out, err := os.ReadFile(p.log)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1]
}

// startRefused starts the binary, which must exit non-zero (why says on
// what) with a last log line that holds every one of wants.
func startRefused(t *testing.T, f *fixture, logName, why string, wants ...string) {
	t.Helper()
	p := startBinaryWith(t, f, logName)
	if code := p.wait(t, time.Minute); code == 0 {
		t.Fatal("exit 0 " + why)
	}
	last := lastLine(t, p)
	for _, want := range wants {
		if !strings.Contains(last, want) {
			t.Errorf("last line %q lacks %q", last, want)
		}
	}
}

// relayed starts the binary (its log logName), writes n transactions with
// the writer of seed, waits until c has them all and stops it.
func relayed(t *testing.T, f *fixture, c *testenv.Consumer, logName string, seed uint64, n int) {
	t.Helper()
	w := outboxtest.NewWriter(f.conn, "outbox", f.shape, seed)
	p := startBinary(t, f, logName)
	for range n {
		if err := w.Txn(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	waitAll(t, c, w, time.Minute)
	p.terminate(t, time.Minute)
}

// TestSlotDroppedWhileStoppedIsNotReplacedSilently: a slot dropped while
// pgoutbox was stopped (a DBA cleaning up inactive slots; every failover
// before PostgreSQL 17) is found out at the next start from the state
// table, and pgoutbox stops instead of creating a new slot and skipping the
// events in between; `migrate --recreate-slot` is the deliberate way on.
func TestSlotDroppedWhileStoppedIsNotReplacedSilently(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 1)
	ctx := context.Background()
	c := env.NewConsumer(t, f.topics)
	relayed(t, f, c, "first.log", 21, 10)
	if _, err := f.checkDB.Exec(ctx, "SELECT pg_drop_replication_slot($1)", f.slot); err != nil {
		t.Fatal(err)
	}
	lost := outboxtest.NewWriter(f.conn, "outbox", f.shape, 28)
	for i := 0; i < 5; i++ { // events the dropped slot would have carried
		if err := lost.Txn(ctx); err != nil {
			t.Fatal(err)
		}
	}
	startRefused(t, f, "second.log", "with the slot gone", f.slot, "does not exist, but pgoutbox used it", "migrate --recreate-slot")
	if _, active := f.slotState(t); active {
		t.Fatal("a slot is active")
	}
	var n int
	if err := f.checkDB.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1", f.slot).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d slots named %s after the refusal (%v): one was created silently", n, f.slot, err)
	}

	// The deliberate recreation, then streaming goes on from the new slot.
	bin := pgoutboxBinary(t)
	out, err := exec.Command(bin, "migrate", "--recreate-slot").CombinedOutput()
	if err == nil {
		t.Fatalf("migrate without its environment succeeded: %s", out)
	}
	cmd := exec.Command(bin, "migrate", "--recreate-slot")
	cmd.Env = f.environ()
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "created again") {
		t.Fatalf("migrate --recreate-slot: %v\n%s", err, out)
	}
	var note string
	if err := f.checkDB.QueryRow(ctx, "SELECT note FROM pgoutbox_state WHERE slot_name = $1", f.slot).Scan(&note); err != nil || !strings.Contains(note, "recreated") {
		t.Fatalf("state note %q (%v): the recreation is not recorded", note, err)
	}
	relayed(t, f, c, "third.log", 22, 10)

	// The new slot is past the lost events' commits: cleanup, which
	// deletes by the slot's position, would delete their rows as relayed.
	// It is held until released, and deletes nothing meanwhile.
	countRows := func() int {
		t.Helper()
		var n int
		if err := f.checkDB.QueryRow(ctx, "SELECT count(*) FROM outbox").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	rows := countRows()
	cleanup := func(args ...string) (string, error) {
		cmd := exec.Command(bin, append([]string{"cleanup", "--retention", "0s"}, args...)...)
		cmd.Env = f.environ()
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	for range 2 {
		if out, err := cleanup(); err == nil || !strings.Contains(out, "is held, so nothing was deleted") || !strings.Contains(out, "were not relayed from the WAL") {
			t.Fatalf("cleanup after the recreation: %v\n%s", err, out)
		}
	}
	if n := countRows(); n != rows {
		t.Fatalf("%d outbox rows after the held cleanups, %d before", n, rows)
	}
	// Lost again before the first gap was released: the second
	// recreation keeps the first hold and adds its own gap to it.
	first := f.cleanupHold(t)
	var recorded string
	if err := f.checkDB.QueryRow(ctx, "SELECT confirmed_lsn::text FROM pgoutbox_state WHERE slot_name = $1", f.slot).Scan(&recorded); err != nil {
		t.Fatal(err)
	}
	if _, err := f.checkDB.Exec(ctx, "SELECT pg_drop_replication_slot($1)", f.slot); err != nil {
		t.Fatal(err)
	}
	cmd = exec.Command(bin, "migrate", "--recreate-slot")
	cmd.Env = f.environ()
	// It shows the whole hold its ID releases, the first gap included.
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "created again") || !strings.Contains(string(out), first) {
		t.Fatalf("second migrate --recreate-slot: %v\n%s", err, out)
	}
	if hold := f.cleanupHold(t); !strings.HasPrefix(hold, first) || strings.Count(hold, "were not relayed from the WAL") != 2 || !strings.Contains(hold, "after "+recorded+" ") {
		t.Fatalf("cleanup hold after a second recreation %q; before it %q: the unreleased hold must be kept and the new gap added", hold, first)
	}
	relayed(t, f, c, "fourth.log", 29, 5)
	heldOut, err := cleanup()
	if err == nil || !strings.Contains(heldOut, "is held, so nothing was deleted") {
		t.Fatalf("cleanup after the second recreation: %v\n%s", err, heldOut)
	}
	// A release names the hold it was shown: the ID of the first hold,
	// shown before the second gap was added, releases nothing, deletes
	// nothing, and says which ID the hold has now.
	held := f.cleanupHold(t)
	id := replication.HoldID(held)
	if !strings.Contains(heldOut, "--release-hold="+id) {
		t.Fatalf("the held cleanup does not print the hold's ID %s:\n%s", id, heldOut)
	}
	rows = countRows()
	stale := replication.HoldID(first)
	if stale == id {
		t.Fatal("the first and the grown hold have one ID")
	}
	if out, err := cleanup("--release-hold=" + stale); err == nil || !strings.Contains(out, "nothing was released or deleted") || !strings.Contains(out, id) {
		t.Fatalf("cleanup --release-hold with the first hold's ID: %v\n%s", err, out)
	}
	if hold := f.cleanupHold(t); hold != held {
		t.Fatalf("hold after a release naming another: %q, was %q", hold, held)
	}
	if n := countRows(); n != rows {
		t.Fatalf("%d outbox rows after a refused release, %d before", n, rows)
	}
	if out, err := cleanup("--release-hold"); err == nil || !strings.Contains(out, "release-hold") {
		t.Fatalf("cleanup --release-hold without an ID: %v\n%s", err, out)
	}
	if out, err := cleanup("--release-hold=" + id); err != nil || !strings.Contains(out, "released") {
		t.Fatalf("cleanup --release-hold: %v\n%s", err, out)
	}
	if out, err := cleanup(); err != nil || strings.Contains(out, "held") {
		t.Fatalf("cleanup after the release: %v\n%s", err, out)
	}
}

// TestSlotAdvancedWhileStoppedIsFatal: a slot moved on while pgoutbox was
// stopped (pg_replication_slot_advance to free WAL, another client
// streaming from it) has skipped the events in between. A session keeps a
// fence in the state row ahead of what it confirms, and lowers it to what
// it confirmed when it stops; the next start finds the slot past it and
// stops, naming the slot and how to go on deliberately. That holds after a
// SIGKILL too, and neither a plain stop and start nor a SIGKILL and start is
// mistaken for it.
func TestSlotAdvancedWhileStoppedIsFatal(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 1)
	ctx := context.Background()
	c := env.NewConsumer(t, f.topics)
	gaps := 0 // the slot moved on while pgoutbox was stopped, so far
	// fenced: the slot read first, the fence after it: a fence raised
	// before each confirmation is at or past the slot at any moment.
	fenced := func(when string) {
		t.Helper()
		confirmed, _ := f.slotState(t)
		if at := f.fence(t); confirmed > at || confirmed == 0 {
			t.Fatalf("%s: slot at %s, the fence at %s: the fence must be at or past the slot", when, confirmed, at)
		}
	}
	run := func(name string, seed uint64, n int, kill bool) {
		t.Helper()
		w := outboxtest.NewWriter(f.conn, "outbox", f.shape, seed)
		p := startBinary(t, f, name)
		for range n {
			if err := w.Txn(ctx); err != nil {
				t.Fatal(err)
			}
		}
		// Past the start of the last transaction: past every earlier
		// commit. (Not the end of WAL read after it: that may hold other
		// packages' writes, and the relay's own raise of the fence, which
		// an idle relay confirms only once more WAL follows.)
		end := w.Committed[len(w.Committed)-1].TxnLow + 1
		waitAll(t, c, w, time.Minute)
		fenced("while the session runs")
		if !kill {
			p.terminate(t, time.Minute)
			fenced("after a stop")
			return
		}
		// Confirmed past the events, so their fence was raised: the crash
		// below is after pgoutbox confirmed, not before.
		testenv.Eventually(t, time.Minute, 20*time.Millisecond, func() (bool, string) {
			confirmed, _ := f.slotState(t)
			return confirmed >= end, fmt.Sprintf("slot at %s, not yet past the start of the last transaction at %s", confirmed, end-1)
		})
		fenced("before the SIGKILL")
		if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		p.wait(t, 30*time.Second)
		testenv.Eventually(t, time.Minute, 20*time.Millisecond, func() (bool, string) {
			_, active := f.slotState(t)
			return !active, "the killed process's walsender still holds the slot"
		})
		fenced("after the SIGKILL")
	}
	advance := func(name string, seed uint64) {
		t.Helper()
		lost := outboxtest.NewWriter(f.conn, "outbox", f.shape, seed)
		for range 5 {
			if err := lost.Txn(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := f.checkDB.Exec(ctx, "SELECT pg_replication_slot_advance($1, pg_current_wal_lsn())", f.slot); err != nil {
			t.Fatal(err)
		}
		// Cleanup deletes by the slot's position, which now says nothing
		// of the skipped events: it refuses before any start, and the
		// refused start holds it.
		var rows int
		if err := f.checkDB.QueryRow(ctx, "SELECT count(*) FROM outbox").Scan(&rows); err != nil {
			t.Fatal(err)
		}
		cl := exec.Command(pgoutboxBinary(t), "cleanup", "--retention", "0s")
		cl.Env = f.environ()
		if out, err := cl.CombinedOutput(); err == nil || !strings.Contains(string(out), "the furthest the last pgoutbox session on it may have confirmed") {
			t.Fatalf("cleanup with the slot moved on: %v\n%s", err, out)
		}
		// status lists what run refuses (it said "problems: none").
		stat := exec.Command(pgoutboxBinary(t), "status")
		stat.Env = f.environ()
		if out, err := stat.CombinedOutput(); err == nil || !strings.Contains(string(out), "was advanced while no pgoutbox session held it") {
			t.Fatalf("status with the slot moved on: %v\n%s", err, out)
		}
		startRefused(t, f, name, "with the slot moved on while pgoutbox was stopped", f.slot, "was advanced while no pgoutbox session held it", "SET stopped_lsn = NULL")
		gaps++
		if hold := f.cleanupHold(t); strings.Count(hold, "may never have been relayed") != gaps {
			t.Fatalf("cleanup hold after %d refused starts: %q", gaps, hold)
		}
		var after int
		if err := f.checkDB.QueryRow(ctx, "SELECT count(*) FROM outbox").Scan(&after); err != nil || after != rows {
			t.Fatalf("%d outbox rows after the refused cleanup, %d before (%v)", after, rows, err)
		}
		// The deliberate way on: clear the record, as the error says.
		if _, err := f.checkDB.Exec(ctx, "UPDATE pgoutbox_state SET stopped_lsn = NULL WHERE slot_name = $1", f.slot); err != nil {
			t.Fatal(err)
		}
	}
	run("first.log", 31, 10, false)
	run("second.log", 32, 5, false) // a stop and a start: nothing moved the slot
	if hold := f.cleanupHold(t); hold != "" {
		t.Fatalf("cleanup held after a stop and a start: %q", hold)
	}
	advance("third.log", 33)
	run("fourth.log", 34, 5, true)
	run("fifth.log", 35, 5, true) // a SIGKILL and a start: nothing moved the slot
	if hold := f.cleanupHold(t); strings.Count(hold, "may never have been relayed") != gaps {
		t.Fatalf("cleanup hold after SIGKILLs and starts: %q (a SIGKILL is no gap)", hold)
	}
	advance("sixth.log", 36)
	run("seventh.log", 37, 5, false)
}

// TestSlotAdvancedBeforeTheFirstSessionIsFatal: the state row written when
// pgoutbox first makes (or finds) the slot had no fence; only a session
// raised one. A slot moved on between pgoutbox migrate and the first run
// (or after a first run that never streamed, Kafka unreachable) skipped
// its events unseen: run streamed on, cleanup deleted their rows as
// relayed. (A reviewer showed both.) The row now carries a fence at the
// slot's position from the start: cleanup refuses, and so does run.
func TestSlotAdvancedBeforeTheFirstSessionIsFatal(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 1)
	ctx := context.Background()
	migrate := exec.Command(pgoutboxBinary(t), "migrate")
	migrate.Env = f.environ()
	if out, err := migrate.CombinedOutput(); err != nil {
		t.Fatalf("migrate: %v\n%s", err, out)
	}
	if _, active := f.slotState(t); active {
		t.Fatal("the slot is in use after migrate")
	}
	lost := outboxtest.NewWriter(f.conn, "outbox", f.shape, 41)
	for range 5 {
		if err := lost.Txn(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.checkDB.Exec(ctx, "SELECT pg_replication_slot_advance($1, pg_current_wal_lsn())", f.slot); err != nil {
		t.Fatal(err)
	}
	var rows int
	if err := f.checkDB.QueryRow(ctx, "SELECT count(*) FROM outbox").Scan(&rows); err != nil || rows == 0 {
		t.Fatalf("%d outbox rows (%v)", rows, err)
	}
	cl := exec.Command(pgoutboxBinary(t), "cleanup", "--retention", "0s")
	cl.Env = f.environ()
	if out, err := cl.CombinedOutput(); err == nil || !strings.Contains(string(out), "the furthest the last pgoutbox session on it may have confirmed") {
		t.Fatalf("cleanup with the slot moved on before any session: %v\n%s", err, out)
	}
	var after int
	if err := f.checkDB.QueryRow(ctx, "SELECT count(*) FROM outbox").Scan(&after); err != nil || after != rows {
		t.Fatalf("%d outbox rows after the refused cleanup, %d before (%v)", after, rows, err)
	}
	startRefused(t, f, "first.log", "with the slot moved on before the first session", f.slot, "SET stopped_lsn = NULL")
	if hold := f.cleanupHold(t); !strings.Contains(hold, "may never have been relayed") {
		t.Fatalf("cleanup hold after the refused start: %q", hold)
	}
}

// TestSlotAdvancedWhileStoppedStaysFatalAfterAServerRestart: the fence
// tells a slot moved while pgoutbox was stopped from one an earlier
// version left at the shutdown checkpoint by whether PostgreSQL restarted
// since the last session began; only without a restart is the start
// refused. The refusal is the news: a supervisor restarting pgoutbox after
// each exit, and a PostgreSQL restart some time later, must not turn it
// into a warning and a stream over the skipped events. (A reviewer found
// the refusal did not record itself, and the start after the restart
// warned and streamed.)
func TestSlotAdvancedWhileStoppedStaysFatalAfterAServerRestart(t *testing.T) {
	env := testenv.RequireExclusive(t)
	f := newFixture(t, env, 1)
	ctx := context.Background()
	c := env.NewConsumer(t, f.topics)
	relayed(t, f, c, "first.log", 51, 5)
	lost := outboxtest.NewWriter(f.conn, "outbox", f.shape, 52)
	writeTxns(t, lost, 3)
	if _, err := f.checkDB.Exec(ctx, "SELECT pg_replication_slot_advance($1, pg_current_wal_lsn())", f.slot); err != nil {
		t.Fatal(err)
	}
	const refused = "was advanced while no pgoutbox session held it"
	startRefused(t, f, "second.log", "with the slot moved on while pgoutbox was stopped", f.slot, refused)
	env.PGCtl(t, "stop", "-m", "fast", "-t", "30")
	env.PGCtl(t, "start", "-w", "-t", "60")
	f.reconnect(t)
	startRefused(t, f, "third.log", "with the slot moved on while pgoutbox was stopped, after a PostgreSQL restart", f.slot, refused, "SET stopped_lsn = NULL")
	// The deliberate way on, as the error says, still works.
	if _, err := f.checkDB.Exec(ctx, "UPDATE pgoutbox_state SET stopped_lsn = NULL WHERE slot_name = $1", f.slot); err != nil {
		t.Fatal(err)
	}
	relayed(t, f, c, "fourth.log", 53, 5)
}

// TestAcceptCatalogRecordsAMembershipPutBack: the outbox table taken out of
// the publication and put back while pgoutbox was stopped left the catalog
// as it was, but the event written in between was never decoded; the next
// start refuses, naming it, until `migrate --accept-catalog` records the
// new membership, and then streaming goes on with the events written after.
func TestAcceptCatalogRecordsAMembershipPutBack(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 1)
	ctx := context.Background()
	c := env.NewConsumer(t, f.topics)
	relayed(t, f, c, "first.log", 23, 5)
	pub := pgx.Identifier{f.pub}.Sanitize()
	if _, err := f.checkDB.Exec(ctx, "ALTER PUBLICATION "+pub+" DROP TABLE outbox"); err != nil {
		t.Fatal(err)
	}
	lost := outboxtest.NewWriter(f.conn, "outbox", f.shape, 24)
	if err := lost.Txn(ctx); err != nil { // never decoded
		t.Fatal(err)
	}
	if _, err := f.checkDB.Exec(ctx, "ALTER PUBLICATION "+pub+" ADD TABLE outbox"); err != nil {
		t.Fatal(err)
	}
	startRefused(t, f, "second.log", "with the table taken out of the publication and put back", "was taken out of publication", "migrate --accept-catalog")
	// The refused start held cleanup already: the slot is not past the
	// gap yet, but nothing else records that it must not be trusted.
	if hold := f.cleanupHold(t); !strings.Contains(hold, "changed since it last streamed") {
		t.Fatalf("cleanup hold after the refused start %q: a start that finds the catalog changed must hold cleanup", hold)
	}

	cmd := exec.Command(pgoutboxBinary(t), "migrate", "--accept-catalog")
	cmd.Env = f.environ()
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "accepted: outbox table public.outbox was taken out of publication") ||
		!strings.Contains(string(out), "cleanup is held") {
		t.Fatalf("migrate --accept-catalog: %v\n%s", err, out)
	}
	relayed(t, f, c, "third.log", 25, 5)
	// The lost event's row is still in the table, behind the slot's
	// position: cleanup is held, and the relay's own writes of the state
	// row since have kept the hold.
	cl := exec.Command(pgoutboxBinary(t), "cleanup", "--retention", "0s")
	cl.Env = f.environ()
	if out, err := cl.CombinedOutput(); err == nil || !strings.Contains(string(out), "is held, so nothing was deleted") {
		t.Fatalf("cleanup after --accept-catalog: %v\n%s", err, out)
	}
	if hold := f.cleanupHold(t); !strings.Contains(hold, "changed since it last streamed") || !strings.Contains(hold, "; and catalog accepted by pgoutbox migrate --accept-catalog") {
		t.Fatalf("cleanup hold after --accept-catalog %q: both the refused start's hold and the acceptance's must be there", hold)
	}
}

// cleanupHold reads the cleanup hold of the fixture's slot ("" for none).
func (f *fixture) cleanupHold(t *testing.T) string {
	t.Helper()
	var hold string
	if err := f.checkDB.QueryRow(context.Background(), "SELECT coalesce(to_jsonb(st) ->> 'cleanup_hold', '') FROM pgoutbox_state st WHERE slot_name = $1", f.slot).Scan(&hold); err != nil {
		t.Fatal(err)
	}
	return hold
}

// TestSlotAdvancedByAnotherHolderIsFatal: while pgoutbox runs, its
// walsender is ended and another client (pg_recvlogical, a misconfigured
// Debezium) takes the slot before pgoutbox reconnects, streams the events
// written meanwhile and confirms them. pgoutbox, waiting as a standby, must
// not take the slot over at that client's position as if another pgoutbox
// instance had held it: a pgoutbox instance raises the fence in the state
// row before it confirms, so a slot past the fence was moved by something
// else, and the events in between were skipped. The relay stops (exit 1),
// naming the slot.
func TestSlotAdvancedByAnotherHolderIsFatal(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 1)
	ctx := context.Background()
	c := env.NewConsumer(t, f.topics)
	w := outboxtest.NewWriter(f.conn, "outbox", f.shape, 41)
	p := startBinary(t, f, "relay.log")
	writeTxns(t, w, 3)
	waitAll(t, c, w, time.Minute)

	// Take the slot: end pgoutbox's walsender and start streaming from the
	// slot before pgoutbox reconnects (its backoff is 200 ms, then more).
	var intruder *pgconn.PgConn
	opts := pglogrepl.StartReplicationOptions{Mode: pglogrepl.LogicalReplication,
		PluginArgs: []string{"proto_version '1'", "publication_names '" + f.pub + "'"}}
	testenv.Eventually(t, time.Minute, 5*time.Millisecond, func() (bool, string) {
		if _, err := f.checkDB.Exec(ctx, "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL", f.slot); err != nil {
			return false, err.Error()
		}
		conn := replicationConn(t, f.dsn, "pgoutbox-test-intruder")
		if err := pglogrepl.StartReplication(ctx, conn, f.slot, 0, opts); err != nil {
			_ = conn.Close(ctx)
			return false, "another connection still holds the slot: " + err.Error()
		}
		intruder = conn
		return true, ""
	})
	// pgoutbox finds it busy, and waits as a standby.
	p.waitLog(t, "standby: the slot is in use", time.Minute)

	// The intruder streams three transactions (one insert each) and
	// confirms them.
	f.insertEvents(t, "0009", 3, nil)
	var endText string
	if err := f.checkDB.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&endText); err != nil {
		t.Fatal(err)
	}
	end, err := parseLSN(endText)
	if err != nil {
		t.Fatal(err)
	}
	commits := 0
	deadline := time.Now().Add(time.Minute)
	for commits < 3 {
		rctx, cancel := context.WithDeadline(ctx, deadline)
		msg, err := intruder.ReceiveMessage(rctx)
		cancel()
		if err != nil {
			t.Fatalf("the intruder's stream, after %d commits: %v", commits, err)
		}
		if cd, ok := msg.(*pgproto3.CopyData); ok && len(cd.Data) > 25 && cd.Data[0] == pglogrepl.XLogDataByteID && cd.Data[25] == 'C' {
			commits++
		}
	}
	if err := pglogrepl.SendStandbyStatusUpdate(ctx, intruder, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: pglogrepl.LSN(end), WALFlushPosition: pglogrepl.LSN(end), WALApplyPosition: pglogrepl.LSN(end)}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Minute, 20*time.Millisecond, func() (bool, string) {
		confirmed, _ := f.slotState(t)
		return confirmed >= end, fmt.Sprintf("the slot is at %s, not yet at %s the intruder confirmed", confirmed, end)
	})
	_ = intruder.Close(ctx)

	// pgoutbox takes the slot back, and stops.
	if code := p.wait(t, time.Minute); code == 0 {
		t.Fatal("exit 0 after taking over a slot another client moved on")
	}
	if last := lastLine(t, p); !strings.Contains(last, f.slot) || !strings.Contains(last, "was advanced while no pgoutbox session held it") {
		t.Fatalf("last line: %s", last)
	}
}

// TestRestoredDatabaseWithALaterSlotIsRefused: a database put back to an
// earlier point without a new timeline (a disk snapshot, a crash-consistent
// copy) or with one (pg_rewind), whose pg_replslot was kept as it was, has
// a slot confirmed past the end of its WAL. PostgreSQL would skip the
// transactions committed since, up to the slot's position: they are new
// ones, never relayed. The start must stop (before: a warning about the
// fence, and streaming on), and cleanup, which deletes by the slot's
// position, must delete nothing.
func TestRestoredDatabaseWithALaterSlotIsRefused(t *testing.T) {
	env := testenv.Require(t)
	srv := env.NewServer(t)
	srv.CreateDatabase(t, "app")
	f := fixtureOn(t, env, srv.ServerDSN(srv.PrimaryPort, "app"), 1)
	c := env.NewConsumer(t, f.topics)
	ctx := context.Background()
	relayed(t, f, c, "first.log", 51, 3)
	srv.StopPrimary(t)
	srv.SaveData(t, "backup")
	srv.StartPrimary(t)
	f.reconnect(t)
	relayed(t, f, c, "second.log", 52, 20)
	// PostgreSQL before 17 writes a slot's confirmed position to disk only
	// with other changes of the slot, not at a shutdown: moved to the end
	// of WAL (past nothing unrelayed: the relay confirmed all of it) and
	// saved by a checkpoint, it stays there across the restart.
	f.exec(t, "SELECT pg_replication_slot_advance($1, pg_current_wal_lsn())", f.slot)
	f.exec(t, "CHECKPOINT")
	slotAt, _ := f.slotState(t)
	srv.StopPrimary(t)
	srv.RestoreKeepingSlots(t, "backup")
	srv.StartPrimary(t)
	f.reconnect(t)
	lost := outboxtest.NewWriter(f.conn, "outbox", f.shape, 53)
	for range 2 {
		if err := lost.Txn(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var text string
	if err := f.checkDB.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&text); err != nil {
		t.Fatal(err)
	}
	if end, err := parseLSN(text); err != nil || end >= slotAt {
		t.Fatalf("the restored server's WAL ends at %s (%v), not before the slot's %s: the test did not make its case", end, err, slotAt)
	}
	startRefused(t, f, "third.log", "with a slot from after the restore", f.slot, "the end of this server's WAL")
	cl := exec.Command(pgoutboxBinary(t), "cleanup", "--retention", "0s")
	cl.Env = f.environ()
	if out, err := cl.CombinedOutput(); err == nil || !strings.Contains(string(out), "the end of this server's WAL") {
		t.Fatalf("cleanup with a slot from after the restore: %v\n%s", err, out)
	}
	// New WAL passes the slot's position, and nothing shows the restore
	// any more but what the refused start recorded: the next start is
	// refused all the same, and cleanup stays held.
	f.exec(t, "SELECT pg_switch_wal()")
	f.insertEvents(t, "0002", 1, nil)
	if err := f.checkDB.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&text); err != nil {
		t.Fatal(err)
	}
	if end, err := parseLSN(text); err != nil || end <= slotAt {
		t.Fatalf("the WAL ends at %s (%v), not yet past the slot's %s", end, err, slotAt)
	}
	startRefused(t, f, "fourth.log", "once new WAL passed the slot from after the restore", f.slot, "no pgoutbox session held it")
	cl = exec.Command(pgoutboxBinary(t), "cleanup", "--retention", "0s")
	cl.Env = f.environ()
	if out, err := cl.CombinedOutput(); err == nil || !strings.Contains(string(out), "nothing was deleted") {
		t.Fatalf("cleanup once new WAL passed the slot from after the restore: %v\n%s", err, out)
	}
}

// TestPublicationIsNotMadeAfterItsSlot: a slot made before its publication
// cannot decode the changes written between the two with it: PostgreSQL
// 15-17 fail on them, and 18 skips them with a warning in its own log
// only, so an outbox event written there would never be relayed. With the
// slot there and no publication, the start must not make the publication
// (which hid the window on 18) but stop, naming both and the way on.
func TestPublicationIsNotMadeAfterItsSlot(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 1)
	ctx := context.Background()
	if _, err := f.checkDB.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", f.slot); err != nil {
		t.Fatal(err)
	}
	f.insertEvents(t, "0001", 1, nil) // between the slot and any publication
	err := runInProcess(t, f.config()).exited(t, time.Minute)
	var fe *relay.FatalError
	if !errors.As(err, &fe) || !errors.Is(err, replication.ErrPublicationMissing) || !strings.Contains(err.Error(), "exists already") {
		t.Fatalf("start with the slot made before its publication: %v; want a fatal ErrPublicationMissing", err)
	}
	// Nor does pgoutbox migrate, which the way on leads to.
	mig := exec.Command(pgoutboxBinary(t), "migrate")
	mig.Env = f.environ()
	if out, err := mig.CombinedOutput(); err == nil || !strings.Contains(string(out), "exists already") {
		t.Fatalf("migrate with the slot made before its publication: %v\n%s", err, out)
	}
	var n int
	if err := f.checkDB.QueryRow(ctx, "SELECT count(*) FROM pg_publication WHERE pubname = $1", f.pub).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d publications named %s after the refused start and migrate (%v)", n, f.pub, err)
	}
}

// TestTwoPhaseSlotIsRefused: pgoutput keeps a slot's two_phase for every
// client, and then sends each prepared transaction at its PREPARE, in
// messages protocol version 1 does not have: a relay on such a slot would
// stop on the first one, again after every restart. The start refuses the
// slot, naming it and the way on.
func TestTwoPhaseSlotIsRefused(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 1)
	f.exec(t, "CREATE PUBLICATION "+pgx.Identifier{f.pub}.Sanitize()+" FOR TABLE outbox WITH (publish = 'insert', publish_via_partition_root = true)")
	f.exec(t, "SELECT pg_create_logical_replication_slot($1, 'pgoutput', false, true)", f.slot)
	err := runInProcess(t, f.config()).exited(t, time.Minute)
	var fe *relay.FatalError
	if !errors.As(err, &fe) || !errors.Is(err, replication.ErrSlotUnusable) || !strings.Contains(err.Error(), "two_phase") || !strings.Contains(err.Error(), f.slot) {
		t.Fatalf("start on a two_phase slot: %v; want a fatal ErrSlotUnusable naming it", err)
	}
}
