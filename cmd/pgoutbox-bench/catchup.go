package main

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/IBM/sarama"

	"github.com/pgoutbox/pgoutbox/pkg/kafka/kafkatest"
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
	StartLSN   string `json:"start_lsn"`
	LastTxnLSN string `json:"last_txn_lsn"`
	EndLSN     string `json:"end_lsn"`
	WALBytes   int64  `json:"wal_bytes"`
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
	// pg_recvlogical exiting at --endpos; pgoutbox's (or Debezium's)
	// records all in Kafka (the sum of the topics' high-water marks
	// reaching the event count: acknowledged by Kafka, with acks=all).
	WallSeconds  float64 `json:"wall_s"`
	EventsPerSec float64 `json:"events_per_s"`
	// DrainEventsPerSec counts from the first record in Kafka instead of
	// the process's start: the rate without start-up.
	DrainEventsPerSec float64 `json:"drain_events_per_s,omitempty"`
	// The reader process's resources: for pg_recvlogical from its rusage
	// after it exited, for the others from /proc when the last record was
	// in Kafka (Debezium's: the Kafka Connect JVM's).
	PeakRSSBytes      int64     `json:"peak_rss_bytes"`
	CPUSeconds        float64   `json:"cpu_s"`
	CPUSecondsPer100k float64   `json:"cpu_s_per_100k_events"`
	Proc              ProcStats `json:"proc"`
	// FirstRecordCPUSeconds is the process's CPU time when the first record
	// was in Kafka (start-up: for a JVM, class loading and compiling).
	FirstRecordCPUSeconds float64 `json:"first_record_cpu_s,omitempty"`
	// WalsenderCPUSeconds is the CPU time of the server process decoding
	// the WAL for this reader until the drain ended, WalsenderSeconds the
	// time from its appearance to then, and WalsenderBusy their ratio:
	// near 1, decoding is the limit and the reader keeps up with it.
	WalsenderCPUSeconds float64 `json:"walsender_cpu_s"`
	WalsenderSeconds    float64 `json:"walsender_s"`
	WalsenderBusy       float64 `json:"walsender_busy"`
	// WalsenderRunQueue is the share of WalsenderSeconds the walsender was
	// ready to run but waited for a CPU; the rest of its time (1 - busy -
	// run queue) it slept: waiting for the reader to take what it sent.
	WalsenderRunQueue float64 `json:"walsender_run_queue"`
	// BrokerCPUSeconds is the Kafka broker's CPU time during the drain (0
	// without --kafka-pid); MachineBusy the share of all CPUs' time that
	// was busy (everything on the machine).
	BrokerCPUSeconds float64 `json:"broker_cpu_s"`
	MachineBusy      float64 `json:"machine_busy"`
	// Confirmation: ConfirmedSeconds from start until the slot's
	// confirmed_flush_lsn reached EndLSN; ConfirmedAfterLastSeconds from
	// the last record (pg_recvlogical: its exit) until then, -1 if not
	// within the wait. ConfirmedLSN is where the slot was at the end of
	// the wait, ConfirmedShortBytes the WAL from there to EndLSN, and
	// ConfirmSettledSeconds when (after the last record) it last moved.
	ConfirmedSeconds          float64 `json:"confirmed_s,omitempty"`
	ConfirmedAfterLastSeconds float64 `json:"confirmed_after_last_record_s"`
	ConfirmSettledSeconds     float64 `json:"confirm_settled_after_last_record_s"`
	ConfirmedLSN              string  `json:"confirmed_lsn,omitempty"`
	ConfirmedShortBytes       int64   `json:"confirmed_short_of_end_bytes"`
	RecordsInKafka            int64   `json:"records_in_kafka,omitempty"`
	// FirstRecordSeconds is from start until the first record was in
	// Kafka: start-up, connecting, the first batch.
	FirstRecordSeconds float64 `json:"first_record_s,omitempty"`
}

// pollInterval is how often completion (Kafka high-water marks, slot
// position) is polled: the resolution of the readers' wall times.
const pollInterval = 10 * time.Millisecond

func (h *harness) catchup(ctx context.Context, size int) (CatchupResult, error) {
	o := h.o
	n := o.Events
	r := CatchupResult{TxnSize: size, Events: n, Transactions: (n + size - 1) / size}
	tag := fmt.Sprintf("cu%d%s", size, h.variantTag)
	aggType := h.name(tag)
	r.Topic = "outbox.event." + aggType
	slotRecv, slotRelay := h.name(tag, "recv"), h.name(tag, "relay")
	h.logf("catch-up, %d-event transactions: %d events in %d transactions", size, n, r.Transactions)

	if err := h.createTopic(r.Topic, nil); err != nil {
		return r, err
	}
	defer h.dropSlot(context.WithoutCancel(ctx), slotRecv)
	defer h.dropSlot(context.WithoutCancel(ctx), slotRelay)
	// Every slot starts at the same LSN: the others are copies of the
	// first; the third, read in exactly-once mode, only with --exactly-once.
	slots := []string{slotRecv, slotRelay}
	slotEOS := h.name(tag, "eos")
	if o.ExactlyOnce {
		slots = append(slots, slotEOS)
		defer h.dropSlot(context.WithoutCancel(ctx), slotEOS)
	}
	var err error
	if r.StartLSN, err = h.createSlots(ctx, slots...); err != nil {
		return r, err
	}
	bl, err := h.writeBacklog(ctx, backlogSpec{aggType: aggType, size: size, events: n, pad: h.pad()}, r.StartLSN)
	if err != nil {
		return r, err
	}
	r.LastTxnLSN, r.EndLSN, r.WALBytes, r.PrepSeconds = bl.LastTxnLSN, bl.EndLSN, bl.WALBytes, bl.PrepSeconds
	r.PrepEventsPerSec = float64(n) / r.PrepSeconds
	h.logf("  wrote %d events in %.1f s (%.0f events/s), %d MB of WAL, end LSN %s", n, r.PrepSeconds, r.PrepEventsPerSec, r.WALBytes>>20, r.EndLSN)

	// (a) pg_recvlogical.
	rr, err := h.runRecvlogical(ctx, slotRecv, bl, n)
	if err != nil {
		return r, err
	}
	r.PGRecvlogical = rr
	h.logf("  pg_recvlogical: %.2f s, %.0f events/s (walsender CPU %.2f s: %.0f%% busy, %.0f%% waiting for a CPU)", rr.WallSeconds, rr.EventsPerSec, rr.WalsenderCPUSeconds, rr.WalsenderBusy*100, rr.WalsenderRunQueue*100)

	// (b) pgoutbox.
	pr, err := h.runRelayCatchup(ctx, slotRelay, []string{r.Topic}, bl, n, tag, nil)
	r.Pgoutbox = pr
	if err != nil {
		return r, err
	}
	r.Ratio = pr.EventsPerSec / rr.EventsPerSec
	h.logf("  pgoutbox: %.2f s (first record after %.2f s), %.0f events/s (%.2fx pg_recvlogical), CPU %.2f s (%.2f s waiting for a CPU), peak RSS %d MB, walsender CPU %.2f s (%.0f%% busy, %.0f%% waiting for a CPU), broker CPU %.2f s, confirmed %.2f s after the last record",
		pr.WallSeconds, pr.FirstRecordSeconds, pr.EventsPerSec, r.Ratio, pr.CPUSeconds, pr.Proc.RunQueueSeconds, pr.PeakRSSBytes>>20, pr.WalsenderCPUSeconds, pr.WalsenderBusy*100, pr.WalsenderRunQueue*100, pr.BrokerCPUSeconds, pr.ConfirmedAfterLastSeconds)

	// (c) pgoutbox in exactly-once mode.
	if o.ExactlyOnce {
		h.eos = true
		er, err := h.runRelayCatchup(ctx, slotEOS, []string{r.Topic}, bl, n, tag+"eos", nil)
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

// pad is the payload padding of the catch-up events.
func (h *harness) pad() string { return randomPad(h.o.PayloadBytes) }

// runRecvlogical reads the slot with pg_recvlogical until bl's end.
func (h *harness) runRecvlogical(ctx context.Context, slot string, bl backlog, n int) (ReaderResult, error) {
	var rr ReaderResult
	bin := filepath.Join(h.o.PGBin, "pg_recvlogical")
	args := []string{"-d", h.dsn, "--slot", slot, "--start", "--endpos", bl.EndLSN, "--no-loop",
		"-o", "proto_version=1", "-o", "publication_names=" + h.pub, "-f", "/dev/null"}
	cctx, cancel := context.WithTimeout(ctx, h.o.CatchupTimeout)
	defer cancel()
	cmd := exec.CommandContext(cctx, bin, args...)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	ws := startWalsenderSampler(h.dsn, slot)
	at := h.mark()
	t0 := time.Now()
	err := cmd.Run()
	end := time.Now()
	rr.WallSeconds = end.Sub(t0).Seconds()
	rr.WalsenderCPUSeconds = ws.stop()
	at.finish(h, &rr)
	ws.finish(end, &rr)
	if err != nil {
		return rr, fmt.Errorf("pg_recvlogical %s: %w\n%s", strings.Join(args, " "), err, out.String())
	}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		rr.CPUSeconds = time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
		rr.PeakRSSBytes = ru.Maxrss * 1024 // kilobytes on Linux
		rr.Proc = ProcStats{PeakRSSBytes: rr.PeakRSSBytes, CPUSeconds: rr.CPUSeconds, VoluntarySwitches: ru.Nvcsw, InvoluntarySwitches: ru.Nivcsw}
	}
	rr.EventsPerSec = float64(n) / rr.WallSeconds
	rr.CPUSecondsPer100k = rr.CPUSeconds / float64(n) * 100_000
	// pg_recvlogical confirms what it wrote as it exits.
	h.followConfirmation(ctx, "pg_recvlogical", slot, bl, end, 0, func() bool { return false }, &rr)
	return rr, nil
}

// runRelayCatchup runs pgoutbox on slot until Kafka holds n records in
// topics and the slot is confirmed to bl's end, then stops it. args are
// extra arguments of pgoutbox run (--connector FILE).
func (h *harness) runRelayCatchup(ctx context.Context, slot string, topics []string, bl backlog, n int, tag string, args []string) (ReaderResult, error) {
	var pr ReaderResult
	hw, err := kafkatest.NewOffsetWatcher(h.kcfg)
	if err != nil {
		return pr, err
	}
	defer hw.Close()
	// Cache the partitions before the clock starts; base is an earlier
	// run's records (the at-least-once run's, in exactly-once mode).
	base, err := hw.Total(topics...)
	if err != nil {
		return pr, err
	}
	// Exactly-once: done when a read_committed consumer has every event
	// (appended records are invisible until their transaction commits, and
	// markers take offsets, so the high-water marks do not tell).
	var visible atomic.Int64
	var committed *tailer
	if h.eos {
		// From the end as it is now: the earlier run's records are not
		// read again (reading them, on the same two cores, slowed this
		// run down).
		committed = h.tailWith(ctx, topics, kafkatest.TailOptions{Isolation: sarama.ReadCommitted, Newest: true}, func(kafkatest.Record) { visible.Add(1) })
		defer committed.close()
		<-committed.started
		if err := committed.ended(); err != nil {
			return pr, fmt.Errorf("read_committed %w", err)
		}
	}
	ws := startWalsenderSampler(h.dsn, slot)
	defer ws.stop()
	at := h.mark()
	p, err := startRelay(h.o.Pgoutbox, h.relayEnv(slot), filepath.Join(h.logDir, "pgoutbox-catchup-"+tag+".log"), args...)
	if err != nil {
		return pr, err
	}
	defer p.stop(time.Minute) // on the error paths
	d := drainSpec{slot: slot, topics: topics, events: n, base: base, bl: bl, confirmWait: 30 * time.Second}
	if h.eos {
		d.visible = visible.Load
		d.failed = func() string {
			if err := committed.ended(); err != nil {
				return "read_committed " + err.Error()
			}
			return ""
		}
	}
	pr, err = h.drainToKafka(ctx, p, ws, hw, d, at)
	if err != nil {
		return pr, err
	}
	if err := p.stop(time.Minute); err != nil {
		return pr, err
	}
	if pr.RecordsInKafka, err = hw.Total(topics...); err != nil {
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
