package relay_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/checkpoint"
	"github.com/pgoutbox/pgoutbox/pkg/outboxtest"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// The fault suite drives the built binary against the real PostgreSQL and
// Kafka with a steady writer and checks every event id afterwards. Each
// scenario has a fast form (run by make test) and the full form of the
// reliability issue (PGOUTBOX_FAULTS=full, run by make test-faults). Set
// PGOUTBOX_FAULTS_REPORT to a file to get the results as a Markdown table.

func faultsFull() bool { return os.Getenv("PGOUTBOX_FAULTS") == "full" }

// pick returns the full value under make test-faults and the fast one
// otherwise.
func pick[T any](fast, full T) T {
	if faultsFull() {
		return full
	}
	return fast
}

var reportMu sync.Mutex

// report appends one scenario's row to $PGOUTBOX_FAULTS_REPORT.
func report(t *testing.T, rep outboxtest.Report, wall time.Duration, peakRSS int64) {
	t.Logf("%s: %s; wall %s; peak RSS %d MB", t.Name(), rep, wall.Round(time.Second), peakRSS>>20)
	name := t.Name()
	if _, sub, ok := strings.Cut(name, "/"); ok {
		name = sub // the scenario, without its group
	} else {
		name = strings.TrimPrefix(name, "Test")
	}
	appendReportRow(t, name, rep, wall, peakRSS)
}

// appendReportRow appends the Markdown row of scenario to
// $PGOUTBOX_FAULTS_REPORT, when it is set. Scenarios run in parallel, so
// rows are appended under reportMu.
func appendReportRow(t *testing.T, scenario string, rep outboxtest.Report, wall time.Duration, peakRSS int64) {
	path := os.Getenv("PGOUTBOX_FAULTS_REPORT")
	if path == "" {
		return
	}
	reportMu.Lock()
	defer reportMu.Unlock()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Errorf("report: %v", err)
		return
	}
	defer f.Close()
	fmt.Fprintf(f, "| %s | %d | %d | %d | %d | %d | %s | %d MB |\n", scenario,
		rep.Written, rep.Verified, len(rep.Missing), len(rep.OutOfOrder), rep.Duplicates, wall.Round(time.Second), peakRSS>>20)
}

// steadyWriter writes transactions at a steady pace until stopped,
// reconnecting (bounded) when the server goes away.
type steadyWriter struct {
	w      *outboxtest.Writer
	dsn    string
	stop   chan struct{}
	done   chan struct{}
	mu     sync.Mutex
	events int
	err    error
}

func startSteadyWriter(f *fixture, seed uint64, every time.Duration, maxTxns int) *steadyWriter {
	sw := &steadyWriter{w: outboxtest.NewWriter(f.conn, "outbox", f.shape, seed), dsn: f.dsn, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(sw.done)
		tick := time.NewTicker(every) // a write rate, not synchronisation
		defer tick.Stop()
		ctx := context.Background()
		for i := 0; i < maxTxns; i++ {
			select {
			case <-sw.stop:
				return
			case <-tick.C:
			}
			if err := sw.w.Txn(ctx); err != nil {
				// The server went away: reconnect, within a bound.
				var conn *pgx.Conn
				deadline := time.Now().Add(2 * time.Minute)
				for conn == nil && time.Now().Before(deadline) {
					select {
					case <-sw.stop:
						return
					case <-tick.C:
					}
					conn, err = pgx.Connect(ctx, sw.dsn)
				}
				if conn == nil {
					sw.mu.Lock()
					sw.err = fmt.Errorf("writer could not reconnect: %w", err)
					sw.mu.Unlock()
					return
				}
				sw.w.SetConn(conn)
			}
			sw.mu.Lock()
			sw.events = sw.w.Events()
			sw.mu.Unlock()
		}
	}()
	return sw
}

func (sw *steadyWriter) Events() int {
	sw.mu.Lock()
	defer sw.mu.Unlock()
	return sw.events
}

func (sw *steadyWriter) Stop(t *testing.T) {
	t.Helper()
	close(sw.stop)
	<-sw.done
	if sw.err != nil {
		t.Fatal(sw.err)
	}
}

// faultRun is one scenario: a fixture, the binary, a consumer and a writer.
type faultRun struct {
	t       *testing.T
	f       *fixture
	c       *testenv.Consumer
	sw      *steadyWriter
	p       *process
	logs    []string
	start   time.Time
	peakRSS int64
	// environ is added to the binary's environment (later entries win).
	environ []string
}

func newFaultRun(t *testing.T, env *testenv.Env, seed uint64, every time.Duration) *faultRun {
	r := prepareFaultRun(t, env)
	r.restart()
	r.startWriter(seed, every)
	return r
}

// prepareFaultRun makes the fixture and the consumer (with opts); the
// scenario starts the relay (restart) and the writer (startWriter).
func prepareFaultRun(t *testing.T, env *testenv.Env, opts ...testenv.ConsumerOption) *faultRun {
	f := newFixture(t, env, 3)
	return &faultRun{t: t, f: f, c: env.NewConsumer(t, f.topics, opts...), start: time.Now()}
}

func (r *faultRun) startWriter(seed uint64, every time.Duration) {
	r.sw = startSteadyWriter(r.f, seed, every, 1_000_000)
}

// restart starts a new relay process.
func (r *faultRun) restart() {
	r.p = startBinaryWith(r.t, r.f, fmt.Sprintf("pgoutbox-%d.log", len(r.logs)), r.environ...)
	r.logs = append(r.logs, r.p.log)
	r.f.waitStreaming(r.t)
}

// progress waits until n more records were delivered.
func (r *faultRun) progress(n int) {
	target := r.c.Len() + n
	testenv.Eventually(r.t, 2*time.Minute, 5*time.Millisecond, func() (bool, string) {
		r.peakRSS = max(r.peakRSS, r.p.peakRSS())
		return r.c.Len() >= target, fmt.Sprintf("%d records delivered, want %d (%d events written)", r.c.Len(), target, r.sw.Events())
	})
}

// killRelay SIGKILLs the relay n times, each after a random number
// (seeded) of records more were delivered, and starts it again.
func (r *faultRun) killRelay(n int, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, seed+1))
	for i := 0; i < n; i++ {
		r.progress(200 + rng.IntN(1500))
		if err := r.p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			r.t.Fatal(err)
		}
		r.p.wait(r.t, 30*time.Second)
		r.restart()
	}
}

// killKafka SIGKILLs the broker n times, each after 500 more records were
// delivered, and starts it again; then it waits for 500 more.
func (r *faultRun) killKafka(env *testenv.Env, n int) {
	for i := 0; i < n; i++ {
		r.progress(500)
		env.KafkaStop(r.t, "KILL")
		env.KafkaStart(r.t)
	}
	r.progress(500)
}

// restartPostgres restarts the server once per shutdown mode, each after
// 500 more records were delivered; then it waits for 500 more.
func (r *faultRun) restartPostgres(env *testenv.Env, modes ...string) {
	for _, m := range modes {
		r.progress(500)
		env.PGCtl(r.t, "restart", "-m", m, "-w", "-t", "60")
		r.f.reconnect(r.t)
	}
	r.progress(500)
}

// finish stops the writer, waits for every event, stops the relay with
// SIGTERM, checks, and reports.
func (r *faultRun) finish() outboxtest.Report {
	t := r.t
	r.sw.Stop(t)
	w := r.sw.w
	waitAll(t, r.c, w, 5*time.Minute)
	r.peakRSS = max(r.peakRSS, r.p.peakRSS())
	r.p.terminate(t, time.Minute)
	rep := w.Check(delivered(drain(t, r.c, r.f)), sessionStarts(t, r.logs...))
	report(t, rep, time.Since(r.start), r.peakRSS)
	if !rep.OK() {
		t.Fatalf("%s", rep)
	}
	return rep
}

func TestFaults(t *testing.T) {
	t.Run("relay-sigkill", func(t *testing.T) {
		env := testenv.Require(t)
		r := newFaultRun(t, env, 11, 2*time.Millisecond)
		r.killRelay(pick(3, 30), 11)
		r.finish()
	})

	t.Run("kafka-sigkill-and-pause", func(t *testing.T) {
		env := testenv.RequireExclusive(t)
		r := newFaultRun(t, env, 12, 5*time.Millisecond)
		r.killKafka(env, pick(1, 5))
		env.KafkaPause(t)
		pause := time.Now()
		// Keep writing while Kafka is frozen.
		testenv.Eventually(t, time.Minute, 100*time.Millisecond, func() (bool, string) {
			return time.Since(pause) >= pick(5*time.Second, 20*time.Second), "Kafka paused"
		})
		env.KafkaResume(t)
		r.progress(500)
		r.finish()
	})

	t.Run("postgres-restart", func(t *testing.T) {
		env := testenv.RequireExclusive(t)
		r := newFaultRun(t, env, 13, 5*time.Millisecond)
		r.restartPostgres(env, pick([]string{"fast", "immediate"}, []string{"fast", "fast", "fast", "immediate", "immediate"})...)
		r.finish()
	})

	t.Run("kafka-unreachable", func(t *testing.T) {
		env := testenv.RequireExclusive(t)
		r := newFaultRun(t, env, 14, 5*time.Millisecond)
		r.progress(500)
		env.KafkaStop(t, "TERM")
		down := time.Now()
		firstDown := r.sw.Events() // index of the first event written with Kafka down
		var maxConfirmed checkpoint.LSN
		testenv.Eventually(t, 5*time.Minute, 200*time.Millisecond, func() (bool, string) {
			r.peakRSS = max(r.peakRSS, r.p.peakRSS())
			c, _ := r.f.slotState(t)
			maxConfirmed = max(maxConfirmed, c)
			return time.Since(down) >= pick(10*time.Second, 2*time.Minute), "Kafka down"
		})
		env.KafkaStart(t)
		if r.peakRSS > 128<<20 {
			t.Fatalf("peak RSS %d MB while Kafka was unreachable", r.peakRSS>>20)
		}
		r.progress(500)
		rep := r.finish()
		_ = rep
		// Nothing written while Kafka was down can have been acknowledged
		// then: the slot stayed below the first such transaction's commit.
		if w := r.sw.w; firstDown < len(w.Committed) && maxConfirmed >= w.Committed[firstDown].TxnHigh {
			t.Fatalf("slot confirmed %s while Kafka was down, at or past a transaction committed after it went down (commit end <= %s)", maxConfirmed, w.Committed[firstDown].TxnHigh)
		}
	})

	t.Run("big-transaction", func(t *testing.T) {
		env := testenv.Require(t)
		f := newFixture(t, env, 3)
		c := env.NewConsumer(t, f.topics)
		start := time.Now()
		p := startBinary(t, f, "pgoutbox.log")
		w, rows := writeBigTxn(t, f, 15)
		peak := waitBigTxn(t, c, p, rows)
		p.terminate(t, time.Minute)
		rep := w.Check(delivered(drain(t, c, f)), nil)
		report(t, rep, time.Since(start), peak)
		if !rep.OK() || peak > 128<<20 {
			t.Fatalf("%s; peak RSS %d MB", rep, peak>>20)
		}
	})

	t.Run("sigterm", func(t *testing.T) {
		env := testenv.Require(t)
		r := newFaultRun(t, env, 16, 2*time.Millisecond)
		r.progress(1000)
		r.p.terminate(t, time.Minute)
		r.restart()
		if rep := r.finish(); rep.Duplicates != 0 {
			t.Fatalf("a restart after SIGTERM repeated %d records", rep.Duplicates)
		}
		// A clean stop confirms everything it delivered: no duplicates.
		data, _ := os.ReadFile(filepath.Clean(r.logs[0]))
		if !strings.Contains(string(data), "pgoutbox stopped") {
			t.Fatal("first process did not log a clean stop")
		}
	})
}

// writeBigTxn writes one transaction of pick(20,000, 200,000) rows of
// about 600 bytes each (over 100 MB in the full form): the relay must
// stream it within a bounded memory. It returns the writer and the rows.
func writeBigTxn(t *testing.T, f *fixture, seed uint64) (*outboxtest.Writer, int) {
	t.Helper()
	rows := pick(20_000, 200_000)
	shape := f.shape
	shape.MinRows, shape.MaxRows, shape.RollbackPct, shape.DeletePct, shape.OtherTablePct = rows, rows, 0, 0, 0
	shape.PayloadBytes = 500
	w := outboxtest.NewWriter(f.conn, "outbox", shape, seed)
	w.BatchRows = 1000
	if err := w.Txn(context.Background()); err != nil {
		t.Fatal(err)
	}
	return w, rows
}

// waitBigTxn waits until c has read rows records, and returns the peak
// RSS of the relay p meanwhile.
func waitBigTxn(t *testing.T, c *testenv.Consumer, p *process, rows int) (peak int64) {
	t.Helper()
	testenv.Eventually(t, 10*time.Minute, 100*time.Millisecond, func() (bool, string) {
		peak = max(peak, p.peakRSS())
		return c.Len() >= rows, fmt.Sprintf("%d of %d records", c.Len(), rows)
	})
	return max(peak, p.peakRSS())
}
