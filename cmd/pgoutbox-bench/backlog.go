package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pgoutbox/pgoutbox/pkg/kafka/kafkatest"
)

// backlogSpec describes events to write before any reader starts.
type backlogSpec struct {
	table   string // "": outboxTable
	aggType string // aggregatetype, or its prefix when topics > 1
	size    int    // events per transaction
	events  int
	pad     string // the payload's padding
	// topics > 1 spreads the events over that many aggregate types,
	// aggType_0 .. aggType_<topics-1> (event seq % topics).
	topics int
}

func (b backlogSpec) tableName() string {
	if b.table == "" {
		return outboxTable
	}
	return b.table
}

func (b backlogSpec) aggTypes() []string {
	if b.topics <= 1 {
		return []string{b.aggType}
	}
	out := make([]string, b.topics)
	for i := range out {
		out[i] = fmt.Sprintf("%s_%d", b.aggType, i)
	}
	return out
}

// backlog is what writeBacklog wrote: the events lie between StartLSN
// (where the readers' slots start) and EndLSN.
type backlog struct {
	// LastTxnLSN is the WAL insert position just before the last
	// transaction, written alone after the others committed: a slot
	// confirmed past it has confirmed (a change of) the last transaction.
	// EndLSN is the position just after its commit: a slot confirmed at
	// or past it has confirmed every event.
	LastTxnLSN string `json:"last_txn_lsn"`
	EndLSN     string `json:"end_lsn"`
	WALBytes   int64  `json:"wal_bytes"`
	// LastTxnBytes is the WAL from LastTxnLSN to EndLSN.
	LastTxnBytes int64 `json:"last_txn_bytes"`
	// PrepSeconds is the time the writers took.
	PrepSeconds float64 `json:"prep_s"`
}

// randomPad returns n random letters and digits: TOAST cannot compress a
// payload padded with them, so the WAL carries every byte.
func randomPad(n int) string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, n)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b)
}

// createSlots creates names[0] and copies it to each other name, and
// checks that every slot starts at the same LSN, which it returns.
func (h *harness) createSlots(ctx context.Context, names ...string) (string, error) {
	var start string
	if err := h.admin.QueryRow(ctx, "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')", names[0]).Scan(&start); err != nil {
		return "", fmt.Errorf("create slot %s: %w", names[0], err)
	}
	for _, n := range names[1:] {
		if _, err := h.admin.Exec(ctx, "SELECT pg_copy_logical_replication_slot($1, $2)", names[0], n); err != nil {
			return "", fmt.Errorf("copy slot %s to %s: %w", names[0], n, err)
		}
	}
	rows, err := h.admin.Query(ctx, "SELECT slot_name, confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = ANY($1)", names)
	if err != nil {
		return "", fmt.Errorf("read slots: %w", err)
	}
	type slotPos struct{ Name, LSN string }
	pos, err := pgx.CollectRows(rows, pgx.RowToStructByPos[slotPos])
	if err != nil {
		return "", fmt.Errorf("read slots: %w", err)
	}
	for _, p := range pos {
		if p.LSN != start {
			return "", fmt.Errorf("slots do not start at the same LSN: %s created at %s, %s confirmed at %s", names[0], start, p.Name, p.LSN)
		}
	}
	if len(pos) != len(names) {
		return "", fmt.Errorf("%d of %d slots found", len(pos), len(names))
	}
	return start, nil
}

// writeBacklog writes spec's events: all transactions but the last with
// PrepWriters connections at once, then the last one alone, between two
// readings of the WAL position. It then flushes the WAL and checkpoints,
// so that neither falls into a measurement, and checks the count.
func (h *harness) writeBacklog(ctx context.Context, spec backlogSpec, start string) (backlog, error) {
	var b backlog
	txns := (spec.events + spec.size - 1) / spec.size
	t0 := time.Now()
	if err := h.writeTxns(ctx, spec, 0, txns-1, h.o.PrepWriters); err != nil {
		return b, err
	}
	if err := h.admin.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&b.LastTxnLSN); err != nil {
		return b, fmt.Errorf("read WAL position: %w", err)
	}
	if err := h.writeTxns(ctx, spec, txns-1, txns, 1); err != nil {
		return b, err
	}
	if err := h.admin.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&b.EndLSN); err != nil {
		return b, fmt.Errorf("read WAL position: %w", err)
	}
	b.PrepSeconds = time.Since(t0).Seconds()
	var count int
	if err := h.admin.QueryRow(ctx, "SELECT count(*) FROM "+spec.tableName()+" WHERE aggregatetype = ANY($1)", spec.aggTypes()).Scan(&count); err != nil {
		return b, fmt.Errorf("count events: %w", err)
	}
	if count != spec.events {
		return b, fmt.Errorf("%d events in the table, want %d", count, spec.events)
	}
	// The writers committed without waiting for the WAL flush: a commit
	// with synchronous_commit on flushes it up to here.
	if _, err := h.admin.Exec(ctx, "SELECT pg_current_xact_id()"); err != nil {
		return b, fmt.Errorf("flush WAL: %w", err)
	}
	if _, err := h.admin.Exec(ctx, "CHECKPOINT"); err != nil {
		return b, fmt.Errorf("checkpoint: %w", err)
	}
	if err := h.admin.QueryRow(ctx, "SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)::bigint, pg_wal_lsn_diff($1::pg_lsn, $3::pg_lsn)::bigint",
		b.EndLSN, start, b.LastTxnLSN).Scan(&b.WALBytes, &b.LastTxnBytes); err != nil {
		return b, fmt.Errorf("WAL size: %w", err)
	}
	return b, nil
}

// writeTxns inserts transactions from..to-1 of spec (transaction t holds
// events t*size .. t*size+size-1) with up to writers connections at once,
// each running a server-side loop that commits after every transaction
// (synchronous_commit off: the commit does not wait for the WAL flush,
// which the measurements do not need).
func (h *harness) writeTxns(ctx context.Context, spec backlogSpec, from, to, writers int) error {
	if to <= from {
		return nil
	}
	writers = max(1, min(writers, to-from))
	agg := "'" + spec.aggType + "'"
	if spec.topics > 1 {
		agg = fmt.Sprintf("'%s_' || ((t * %d + g) %% %d)", spec.aggType, spec.size, spec.topics)
	}
	var wg sync.WaitGroup
	errs := make([]error, writers)
	for w := range writers {
		lo, hi := from+(to-from)*w/writers, from+(to-from)*(w+1)/writers
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
			// literals are ours (integers, names of letters, digits and _,
			// a pad of letters and digits).
			sql := fmt.Sprintf(`DO $bench$
DECLARE t bigint;
BEGIN
	FOR t IN %d..%d LOOP
		INSERT INTO %s (id, aggregatetype, aggregateid, type, payload)
		SELECT gen_random_uuid(), %s, 'agg-' || ((t * %d + g) %% 1000), 'Created',
			jsonb_build_object('seq', t * %d + g, 'txn', t, 'pad', '%s')
		FROM generate_series(0, LEAST(%d, %d - t * %d) - 1) AS g;
		COMMIT;
	END LOOP;
END
$bench$`, lo, hi-1, spec.tableName(), agg, spec.size, spec.size, spec.pad, spec.size, spec.events, spec.size)
			if _, err := conn.Exec(ctx, sql); err != nil {
				errs[w] = fmt.Errorf("writer %d: %w", w, err)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// proc is a reader's process: pgoutbox or Kafka Connect.
type proc interface {
	pid() int
	name() string
	started() time.Time
	exited() error
	logTail(n int) string
}

// drainSpec is what drainToKafka waits for.
type drainSpec struct {
	slot   string
	topics []string
	events int
	// base is the records the topics held before the reader started (an
	// earlier reader's, on the same topics): not counted.
	base int64
	// visible (optional) counts the records a read_committed consumer
	// started at the topics' ends has seen: exactly-once mode is done
	// when it reaches events (records are invisible until their
	// transaction commits, and markers take offsets, so the high-water
	// marks do not tell).
	visible func() int64
	bl      backlog
	// confirmWait bounds the wait, after the last record, for the slot
	// to be confirmed to the end.
	confirmWait time.Duration
	// failed (optional) returns why the reader failed, "" while it did
	// not (Debezium's task trace).
	failed func() string
}

// drainToKafka follows a reader process p, started just before with ws
// already sampling its walsender, until Kafka holds every event in the
// topics, then until its slot is confirmed to the end (bounded). It does
// not stop p.
func (h *harness) drainToKafka(ctx context.Context, p proc, ws *walsenderSampler, hw *kafkatest.OffsetWatcher, d drainSpec, at marks) (ReaderResult, error) {
	var rr ReaderResult
	deadline := p.started().Add(h.o.CatchupTimeout)
	lastFailCheck := time.Now()
	var total int64
	var err error
	for {
		if total, err = hw.Total(d.topics...); err != nil {
			return rr, err
		}
		total -= d.base
		if total > 0 && rr.FirstRecordSeconds == 0 {
			rr.FirstRecordSeconds = time.Since(p.started()).Seconds()
			rr.FirstRecordCPUSeconds, _ = readCPUSeconds(p.pid())
		}
		if d.visible != nil {
			if d.visible() >= int64(d.events) {
				break
			}
		} else if total >= int64(d.events) {
			break
		}
		if err := p.exited(); err != nil {
			return rr, err
		}
		if d.failed != nil && time.Since(lastFailCheck) > time.Second {
			lastFailCheck = time.Now()
			if f := d.failed(); f != "" {
				return rr, fmt.Errorf("%s failed after %d of %d records: %s", p.name(), total, d.events, f)
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return rr, fmt.Errorf("%s: %d of %d records in Kafka after %s (%v); last log lines:\n%s", p.name(), total, d.events,
				time.Since(p.started()).Round(time.Millisecond), ctx.Err(), p.logTail(15))
		}
		time.Sleep(pollInterval)
	}
	end := time.Now()
	rr.WallSeconds = end.Sub(p.started()).Seconds()
	rr.EventsPerSec = float64(d.events) / rr.WallSeconds
	if drain := rr.WallSeconds - rr.FirstRecordSeconds; drain > 0 {
		rr.DrainEventsPerSec = float64(d.events) / drain
	}
	rr.WalsenderCPUSeconds = ws.sample()
	ws.finish(end, &rr)
	st, err := readProcStats(p.pid())
	if err != nil {
		return rr, fmt.Errorf("%s's resources: %w", p.name(), err)
	}
	rr.Proc = st
	rr.PeakRSSBytes, rr.CPUSeconds = st.PeakRSSBytes, st.CPUSeconds
	rr.CPUSecondsPer100k = st.CPUSeconds / float64(d.events) * 100_000
	at.finish(h, &rr)

	h.followConfirmation(ctx, p.name(), d.slot, d.bl, end, d.confirmWait, func() bool { return p.exited() == nil }, &rr)
	return rr, nil
}

// followConfirmation follows the slot's confirmed_flush_lsn from end (the
// last record) until it reaches bl's end or wait has passed (or alive
// turns false), and records when it reached the end, when it last moved,
// and where it stopped.
func (h *harness) followConfirmation(ctx context.Context, who, slot string, bl backlog, end time.Time, wait time.Duration, alive func() bool, rr *ReaderResult) {
	rr.ConfirmedAfterLastSeconds, rr.ConfirmSettledSeconds = -1, -1
	var last string
	for {
		var lsn *string
		var short int64
		if err := h.admin.QueryRow(ctx, `SELECT confirmed_flush_lsn::text, GREATEST(pg_wal_lsn_diff($2::pg_lsn, confirmed_flush_lsn), 0)::bigint
			FROM pg_replication_slots WHERE slot_name = $1`, slot, bl.EndLSN).Scan(&lsn, &short); err != nil {
			h.logf("  %s: read slot %s: %v", who, slot, err)
			return
		}
		since := time.Since(end).Seconds()
		if l := deref(lsn); l != last {
			last, rr.ConfirmSettledSeconds = l, since
		}
		rr.ConfirmedLSN, rr.ConfirmedShortBytes = last, short
		if short == 0 && lsn != nil {
			rr.ConfirmedAfterLastSeconds = since
			rr.ConfirmedSeconds = rr.WallSeconds + since
			return
		}
		if time.Since(end) > wait || ctx.Err() != nil || !alive() {
			h.logf("  %s: slot %s not confirmed to %s within %s of the last record: at %s, %d bytes before (the last transaction is %d bytes), since %.2f s after the last record",
				who, slot, bl.EndLSN, wait, last, short, bl.LastTxnBytes, rr.ConfirmSettledSeconds)
			return
		}
		time.Sleep(pollInterval)
	}
}

// marks are readings taken when a reader starts, to count what the
// machine and the broker spent during its drain.
type marks struct {
	machine machineCPU
	broker  float64
}

func (h *harness) mark() marks {
	m := marks{machine: readMachineCPU()}
	if h.o.KafkaPID > 0 {
		m.broker, _ = readCPUSeconds(h.o.KafkaPID)
	}
	return m
}

// finish records the broker's CPU and the machine's busy share since m.
func (m marks) finish(h *harness, rr *ReaderResult) {
	rr.MachineBusy = m.machine.busyUntil(readMachineCPU())
	if h.o.KafkaPID > 0 {
		if b, err := readCPUSeconds(h.o.KafkaPID); err == nil {
			rr.BrokerCPUSeconds = b - m.broker
		}
	}
}
