package main

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/pkg/kafka/kafkatest"
	"github.com/pgoutbox/pgoutbox/pkg/outboxtest"
)

// CatchupResult is one catch-up scenario: Events events already in the WAL,
// in transactions of TxnSize events, read from the same starting LSN by
// pg_recvlogical and by pgoutbox.
type CatchupResult struct {
	TxnSize      int    `json:"txn_size"`
	Events       int    `json:"events"`
	Transactions int    `json:"transactions"`
	Topic        string `json:"topic"`
	// StartLSN is where both slots start; EndLSN the WAL insert position
	// after the last event's commit (pg_recvlogical's --endpos).
	StartLSN string `json:"start_lsn"`
	EndLSN   string `json:"end_lsn"`
	WALBytes int64  `json:"wal_bytes"`
	// PrepSeconds is the time the writers took to insert the events.
	PrepSeconds      float64 `json:"prep_s"`
	PrepEventsPerSec float64 `json:"prep_events_per_s"`

	PGRecvlogical ReaderResult `json:"pg_recvlogical"`
	Pgoutbox      ReaderResult `json:"pgoutbox"`
	// PgoutboxEOS is the same catch-up with kafka.exactly.once (from a
	// third copy of the slot, right after), done when a read_committed
	// consumer has every event (the consumer's work counts against it);
	// RatioEOS is its rate over at-least-once's (to the last ack).
	PgoutboxEOS *ReaderResult `json:"pgoutbox_exactly_once,omitempty"`
	RatioEOS    float64       `json:"ratio_exactly_once_to_at_least_once,omitempty"`
	// Ratio is pgoutbox's events/s over pg_recvlogical's.
	Ratio float64 `json:"ratio_pgoutbox_to_pg_recvlogical"`

	Error string `json:"error,omitempty"`
}

// ReaderResult is one reader's pass over a catch-up scenario's events.
type ReaderResult struct {
	// WallSeconds runs from starting the reader's process to its end:
	// pg_recvlogical exiting at --endpos; pgoutbox's records all in Kafka
	// (the sum of the topic's high-water marks reaching the event count:
	// acknowledged by Kafka, with acks=all).
	WallSeconds  float64 `json:"wall_s"`
	EventsPerSec float64 `json:"events_per_s"`
	// The reader process's resources: for pg_recvlogical from its rusage
	// after it exited, for pgoutbox from /proc just before it was stopped.
	PeakRSSBytes      int64   `json:"peak_rss_bytes"`
	CPUSeconds        float64 `json:"cpu_s"`
	CPUSecondsPer100k float64 `json:"cpu_s_per_100k_events"`
	// WalsenderCPUSeconds is the CPU time of the server process decoding
	// the WAL for this reader (sampled every 100 ms; approximate).
	WalsenderCPUSeconds float64 `json:"walsender_cpu_s"`
	// pgoutbox only: seconds from start until the slot's confirmed_flush_lsn
	// reached EndLSN (confirmation follows the acks by up to the status
	// interval, 1 s by default), and the records found in Kafka.
	ConfirmedSeconds float64 `json:"confirmed_s,omitempty"`
	RecordsInKafka   int64   `json:"records_in_kafka,omitempty"`
	// FirstRecordSeconds (pgoutbox only) is from start until the first
	// record was in Kafka: start-up, connecting, the first batch.
	FirstRecordSeconds float64 `json:"first_record_s,omitempty"`
}

// pollInterval is how often completion (Kafka high-water marks, slot
// position) is polled: the resolution of pgoutbox's wall times.
const pollInterval = 10 * time.Millisecond

func (h *harness) catchup(ctx context.Context, size int) (CatchupResult, error) {
	o := h.o
	n := o.Events
	r := CatchupResult{TxnSize: size, Events: n, Transactions: (n + size - 1) / size}
	tag := fmt.Sprintf("cu%d", size)
	aggType := h.name(tag)
	r.Topic = "outbox.event." + aggType
	slotRecv, slotRelay := h.name(tag, "recv"), h.name(tag, "relay")
	h.logf("catch-up, %d-event transactions: %d events in %d transactions", size, n, r.Transactions)

	if err := h.createTopic(r.Topic, nil); err != nil {
		return r, err
	}
	// Both slots start at the same LSN: the second is a copy of the first.
	var startRecv, startRelay string
	if err := h.admin.QueryRow(ctx, "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')", slotRecv).Scan(&startRecv); err != nil {
		return r, fmt.Errorf("create slot %s: %w", slotRecv, err)
	}
	defer h.dropSlot(context.WithoutCancel(ctx), slotRecv)
	if _, err := h.admin.Exec(ctx, "SELECT pg_copy_logical_replication_slot($1, $2)", slotRecv, slotRelay); err != nil {
		return r, fmt.Errorf("copy slot %s to %s: %w", slotRecv, slotRelay, err)
	}
	defer h.dropSlot(context.WithoutCancel(ctx), slotRelay)
	slotEOS := h.name(tag, "eos")
	if o.ExactlyOnce {
		if _, err := h.admin.Exec(ctx, "SELECT pg_copy_logical_replication_slot($1, $2)", slotRecv, slotEOS); err != nil {
			return r, fmt.Errorf("copy slot %s to %s: %w", slotRecv, slotEOS, err)
		}
		defer h.dropSlot(context.WithoutCancel(ctx), slotEOS)
	}
	var cf1, cf2 string
	if err := h.admin.QueryRow(ctx, `SELECT
		(SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1),
		(SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $2)`, slotRecv, slotRelay).Scan(&cf1, &cf2); err != nil {
		return r, fmt.Errorf("read slots: %w", err)
	}
	startRelay = cf2
	if cf1 != cf2 || cf1 != startRecv {
		return r, fmt.Errorf("slots do not start at the same LSN: %s created at %s (confirmed %s), %s confirmed %s", slotRecv, startRecv, cf1, slotRelay, startRelay)
	}
	r.StartLSN = startRecv

	// Write the events.
	t0 := time.Now()
	if err := h.prepare(ctx, outboxTable, aggType, size, n); err != nil {
		return r, err
	}
	r.PrepSeconds = time.Since(t0).Seconds()
	r.PrepEventsPerSec = float64(n) / r.PrepSeconds
	var count int
	if err := h.admin.QueryRow(ctx, "SELECT count(*) FROM "+outboxTable+" WHERE aggregatetype = $1", aggType).Scan(&count); err != nil {
		return r, fmt.Errorf("count events: %w", err)
	}
	if count != n {
		return r, fmt.Errorf("%d events in the table, want %d", count, n)
	}
	// The end position: after every event's commit. Then a committing
	// transaction with synchronous_commit on flushes the WAL up to there
	// (the writers committed without waiting for the flush), and a
	// checkpoint keeps one from falling into either measurement.
	if err := h.admin.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&r.EndLSN); err != nil {
		return r, fmt.Errorf("read WAL position: %w", err)
	}
	if _, err := h.admin.Exec(ctx, "SELECT pg_current_xact_id()"); err != nil {
		return r, fmt.Errorf("flush WAL: %w", err)
	}
	if _, err := h.admin.Exec(ctx, "CHECKPOINT"); err != nil {
		return r, fmt.Errorf("checkpoint: %w", err)
	}
	if err := h.admin.QueryRow(ctx, "SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)::bigint", r.EndLSN, r.StartLSN).Scan(&r.WALBytes); err != nil {
		return r, fmt.Errorf("WAL size: %w", err)
	}
	h.logf("  wrote %d events in %.1f s (%.0f events/s), %d MB of WAL, end LSN %s", n, r.PrepSeconds, r.PrepEventsPerSec, r.WALBytes>>20, r.EndLSN)

	// (a) pg_recvlogical.
	rr, err := h.runRecvlogical(ctx, slotRecv, r.EndLSN)
	if err != nil {
		return r, err
	}
	rr.EventsPerSec = float64(n) / rr.WallSeconds
	rr.CPUSecondsPer100k = rr.CPUSeconds / float64(n) * 100_000
	r.PGRecvlogical = rr
	h.logf("  pg_recvlogical: %.2f s, %.0f events/s (walsender CPU %.2f s)", rr.WallSeconds, rr.EventsPerSec, rr.WalsenderCPUSeconds)

	// (b) pgoutbox.
	pr, err := h.runRelayCatchup(ctx, slotRelay, r.Topic, r.EndLSN, n, tag)
	r.Pgoutbox = pr
	if err != nil {
		return r, err
	}
	r.Ratio = pr.EventsPerSec / rr.EventsPerSec
	h.logf("  pgoutbox: %.2f s (first record after %.2f s), %.0f events/s (%.2fx pg_recvlogical), CPU %.2f s, peak RSS %d MB, confirmed after %.2f s",
		pr.WallSeconds, pr.FirstRecordSeconds, pr.EventsPerSec, r.Ratio, pr.CPUSeconds, pr.PeakRSSBytes>>20, pr.ConfirmedSeconds)

	// (c) pgoutbox in exactly-once mode.
	if o.ExactlyOnce {
		h.eos = true
		er, err := h.runRelayCatchup(ctx, slotEOS, r.Topic, r.EndLSN, n, tag+"eos")
		h.eos = false
		r.PgoutboxEOS = &er
		if err != nil {
			return r, fmt.Errorf("exactly-once: %w", err)
		}
		r.RatioEOS = er.EventsPerSec / pr.EventsPerSec
		h.logf("  pgoutbox exactly-once: %.2f s until a read_committed consumer had every event, %.0f events/s (%.2fx at-least-once to the last ack), CPU %.2f s, peak RSS %d MB, confirmed after %.2f s",
			er.WallSeconds, er.EventsPerSec, r.RatioEOS, er.CPUSeconds, er.PeakRSSBytes>>20, er.ConfirmedSeconds)
	}

	// Keep the table small for the next scenario (TRUNCATE is not
	// published: the publication publishes inserts only).
	if _, err := h.admin.Exec(ctx, "TRUNCATE "+outboxTable); err != nil {
		return r, fmt.Errorf("truncate: %w", err)
	}
	return r, nil
}

// prepare inserts n events of aggType into table in transactions of size events, with
// PrepWriters connections at once, each running a server-side loop that
// commits after every transaction (synchronous_commit off: the commit does
// not wait for the WAL flush, which the measurements do not need).
func (h *harness) prepare(ctx context.Context, table, aggType string, size, n int) error {
	txns := (n + size - 1) / size
	writers := min(h.o.PrepWriters, txns)
	pad := strings.Repeat("x", h.o.PayloadBytes)
	var wg sync.WaitGroup
	errs := make([]error, writers)
	for w := range writers {
		from, to := txns*w/writers, txns*(w+1)/writers
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := pgx.Connect(ctx, h.dsn)
			if err != nil {
				errs[w] = err
				return
			}
			defer conn.Close(context.Background())
			if _, err := conn.Exec(ctx, "SET synchronous_commit = off"); err != nil {
				errs[w] = err
				return
			}
			// A DO block may COMMIT when it is the whole statement; the
			// literals are ours (integers, a name of letters, digits and _).
			sql := fmt.Sprintf(`DO $bench$
DECLARE t bigint;
BEGIN
	FOR t IN %d..%d LOOP
		INSERT INTO %s (id, aggregatetype, aggregateid, type, payload)
		SELECT gen_random_uuid(), '%s', 'agg-' || ((t * %d + g) %% 1000), 'Created',
			jsonb_build_object('seq', t * %d + g, 'txn', t, 'pad', '%s')
		FROM generate_series(0, LEAST(%d, %d - t * %d) - 1) AS g;
		COMMIT;
	END LOOP;
END
$bench$`, from, to-1, table, aggType, size, size, pad, size, n, size)
			if _, err := conn.Exec(ctx, sql); err != nil {
				errs[w] = fmt.Errorf("writer %d: %w", w, err)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// runRecvlogical reads the slot with pg_recvlogical until endLSN.
func (h *harness) runRecvlogical(ctx context.Context, slot, endLSN string) (ReaderResult, error) {
	var rr ReaderResult
	bin := filepath.Join(h.o.PGBin, "pg_recvlogical")
	args := []string{"-d", h.dsn, "--slot", slot, "--start", "--endpos", endLSN, "--no-loop",
		"-o", "proto_version=1", "-o", "publication_names=" + h.pub, "-f", "/dev/null"}
	cctx, cancel := context.WithTimeout(ctx, h.o.CatchupTimeout)
	defer cancel()
	cmd := exec.CommandContext(cctx, bin, args...)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	ws := startWalsenderSampler(h.dsn, slot)
	t0 := time.Now()
	err := cmd.Run()
	rr.WallSeconds = time.Since(t0).Seconds()
	rr.WalsenderCPUSeconds = ws.stop()
	if err != nil {
		return rr, fmt.Errorf("pg_recvlogical %s: %w\n%s", strings.Join(args, " "), err, out.String())
	}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		rr.CPUSeconds = time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
		rr.PeakRSSBytes = ru.Maxrss * 1024 // kilobytes on Linux
	}
	return rr, nil
}

// runRelayCatchup runs pgoutbox on slot until Kafka holds n records in
// topic and the slot is confirmed to endLSN, then stops it.
func (h *harness) runRelayCatchup(ctx context.Context, slot, topic, endLSN string, n int, tag string) (ReaderResult, error) {
	var pr ReaderResult
	end, err := outboxtest.ParseLSN(endLSN)
	if err != nil {
		return pr, err
	}
	watcher, err := kafkatest.NewOffsetWatcher(h.kcfg)
	if err != nil {
		return pr, err
	}
	defer watcher.Close()
	if _, err := watcher.Total(topic); err != nil { // cache the partitions before the clock starts
		return pr, err
	}
	// Exactly-once: done when a read_committed consumer has every event
	// (appended records are invisible until their transaction commits, and
	// markers take offsets, so the high-water marks do not tell).
	var visible atomic.Int64
	if h.eos {
		cctx, stopConsumer := context.WithCancel(ctx)
		consumerDone := make(chan error, 1)
		go func() {
			consumerDone <- kafkatest.TailIsolated(cctx, h.kcfg, []string{topic}, sarama.ReadCommitted, func(kafkatest.Record) bool {
				visible.Add(1)
				return true
			})
		}()
		defer func() {
			stopConsumer()
			<-consumerDone
		}()
	}
	ws := startWalsenderSampler(h.dsn, slot)
	p, err := startRelay(h.o.Pgoutbox, h.relayEnv(slot), filepath.Join(h.logDir, "pgoutbox-catchup-"+tag+".log"))
	if err != nil {
		ws.stop()
		return pr, err
	}
	defer p.stop(time.Minute) // on the error paths
	deadline := p.start.Add(h.o.CatchupTimeout)
	var total int64
	base, err := watcher.Total(topic) // an earlier run's records, in exactly-once mode
	if err != nil {
		ws.stop()
		return pr, err
	}
	for {
		if total, err = watcher.Total(topic); err != nil {
			ws.stop()
			return pr, err
		}
		total -= base
		if total > 0 && pr.FirstRecordSeconds == 0 {
			pr.FirstRecordSeconds = time.Since(p.start).Seconds()
		}
		if h.eos {
			if visible.Load() >= base+int64(n) {
				break
			}
		} else if total >= int64(n) {
			break
		}
		if err := p.exited(); err != nil {
			ws.stop()
			return pr, err
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			ws.stop()
			return pr, fmt.Errorf("pgoutbox: %d of %d records in Kafka after %s (%v)", total, n, time.Since(p.start).Round(time.Millisecond), ctx.Err())
		}
		time.Sleep(pollInterval)
	}
	pr.WallSeconds = time.Since(p.start).Seconds()
	pr.EventsPerSec = float64(n) / pr.WallSeconds
	// Confirmation: informational, bounded.
	confirmDeadline := time.Now().Add(30 * time.Second)
	for {
		var lsn *string
		if err := h.admin.QueryRow(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&lsn); err != nil {
			ws.stop()
			return pr, fmt.Errorf("read slot %s: %w", slot, err)
		}
		if lsn != nil {
			if l, err := outboxtest.ParseLSN(*lsn); err == nil && l >= end {
				pr.ConfirmedSeconds = time.Since(p.start).Seconds()
				break
			}
		}
		if time.Now().After(confirmDeadline) {
			h.logf("  pgoutbox: slot %s not confirmed to %s within 30 s of the last ack (at %v)", slot, endLSN, deref(lsn))
			break
		}
		time.Sleep(pollInterval)
	}
	pr.WalsenderCPUSeconds = ws.stop()
	st, err := p.stats()
	if err != nil {
		return pr, err
	}
	pr.PeakRSSBytes, pr.CPUSeconds = st.PeakRSSBytes, st.CPUSeconds
	pr.CPUSecondsPer100k = st.CPUSeconds / float64(n) * 100_000
	if err := p.stop(time.Minute); err != nil {
		return pr, err
	}
	if pr.RecordsInKafka, err = watcher.Total(topic); err != nil {
		return pr, err
	}
	pr.RecordsInKafka -= base
	if h.eos {
		if pr.RecordsInKafka < int64(n) {
			return pr, fmt.Errorf("pgoutbox: %d offsets in Kafka, want at least %d", pr.RecordsInKafka, n)
		}
	} else if pr.RecordsInKafka != int64(n) {
		return pr, fmt.Errorf("pgoutbox: %d records in Kafka, want %d", pr.RecordsInKafka, n)
	}
	return pr, nil
}

func deref(s *string) string {
	if s == nil {
		return "NULL"
	}
	return *s
}
