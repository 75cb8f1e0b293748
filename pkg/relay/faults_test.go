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
	_, name, _ := strings.Cut(t.Name(), "/") // the scenario, without its group
	fmt.Fprintf(f, "| %s | %d | %d | %d | %d | %d | %s | %d MB |\n", name,
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

// prepareFaultRun makes the fixture and the consumer; the scenario starts
// the relay (restart) and the writer (startWriter).
func prepareFaultRun(t *testing.T, env *testenv.Env) *faultRun {
	f := newFixture(t, env, 3)
	return &faultRun{t: t, f: f, c: env.NewConsumer(t, f.topics), start: time.Now()}
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
		kills := pick(3, 30)
		rng := rand.New(rand.NewPCG(11, 12))
		for i := 0; i < kills; i++ {
			r.progress(200 + rng.IntN(1500))
			if err := r.p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			r.p.wait(t, 30*time.Second)
			r.restart()
		}
		r.finish()
	})

	t.Run("kafka-sigkill-and-pause", func(t *testing.T) {
		env := testenv.RequireExclusive(t)
		r := newFaultRun(t, env, 12, 5*time.Millisecond)
		for i := 0; i < pick(1, 5); i++ {
			r.progress(500)
			env.KafkaStop(t, "KILL")
			env.KafkaStart(t)
		}
		r.progress(500)
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
		modes := pick([]string{"fast", "immediate"}, []string{"fast", "fast", "fast", "immediate", "immediate"})
		for _, m := range modes {
			r.progress(500)
			env.PGCtl(t, "restart", "-m", m, "-w", "-t", "60")
			f := r.f
			f.reconnect(t)
		}
		r.progress(500)
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
		rows := pick(20_000, 200_000)
		shape := f.shape
		shape.MinRows, shape.MaxRows, shape.RollbackPct, shape.DeletePct, shape.OtherTablePct = rows, rows, 0, 0, 0
		shape.PayloadBytes = 500 // 200,000 rows × ~600 bytes: over 100 MB
		w := outboxtest.NewWriter(f.conn, "outbox", shape, 15)
		w.BatchRows = 1000
		if err := w.Txn(context.Background()); err != nil {
			t.Fatal(err)
		}
		var peak int64
		want := map[string]bool{}
		for _, e := range w.Committed {
			want[e.ID] = true
		}
		testenv.Eventually(t, 10*time.Minute, 100*time.Millisecond, func() (bool, string) {
			peak = max(peak, p.peakRSS())
			return c.Len() >= rows, fmt.Sprintf("%d of %d records", c.Len(), rows)
		})
		peak = max(peak, p.peakRSS())
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
