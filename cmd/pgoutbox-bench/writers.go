package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/pkg/outbox"
)

// WritersResult is the writers' side: what each way of recording an event
// costs the application's transactions. Clients connections run, for a
// fixed time each, transactions of one business insert alone, plus an
// outbox row, plus an outbox row deleted in the same transaction, plus a
// pg_logical_emit_message instead of the row (pkg/outbox's three modes),
// with a logical slot in the database (pkg/outbox refuses the last two
// modes' writes without one) and no relay reading it. "interactive" sends
// each statement on its own (BEGIN, the business INSERT, the
// outbox.Writer's statements, COMMIT), as an application with pgx and
// pkg/outbox does; "pipelined" sends the same statements in one round trip
// (a pgx batch: one implicit transaction), which leaves the server's work.
type WritersResult struct {
	Clients         int     `json:"clients"`
	DurationSeconds float64 `json:"duration_s"`
	WarmupSeconds   float64 `json:"warmup_s"`
	PayloadBytes    int     `json:"payload_pad_bytes"`
	Runs            int     `json:"runs"`
	// Points in the order measured; Modes in Run 1's order.
	Points []WriterPoint `json:"points"`
	Modes  []string      `json:"modes"`
}

// WriterPoint is one mode measured once.
type WriterPoint struct {
	Run     int    `json:"run"`
	Fsync   string `json:"fsync"`
	Variant string `json:"variant"` // interactive or pipelined
	Mode    string `json:"mode"`
	// Transactions committed in the measured time, and per second.
	Transactions int64   `json:"transactions"`
	TPS          float64 `json:"tps"`
	Errors       int64   `json:"errors"`
	// VsBusiness is TPS over the business insert alone's in the same run,
	// fsync setting and variant (1 for the business insert itself).
	VsBusiness float64 `json:"vs_business"`
	// LatencyMs is each transaction's time at the client.
	LatencyMs Percentiles `json:"latency_ms"`
	// WALBytesPerTxn is the WAL written per transaction (all of the
	// server's WAL in the measured time over the transactions), and
	// BackendCPUMicros the CPU time of the clients' backends per
	// transaction.
	WALBytesPerTxn   float64 `json:"wal_bytes_per_txn"`
	BackendCPUMicros float64 `json:"backend_cpu_us_per_txn"`
	MachineCPUBusy   float64 `json:"machine_cpu_busy"`
}

// Writer modes, as WriterPoint.Mode.
const (
	writerBusiness = "business"
	writerTable    = "table"
	writerDelete   = "table-delete-after-insert"
	writerMessage  = "message"
)

var writerModes = []string{writerBusiness, writerTable, writerDelete, writerMessage}

const businessTable = "public.bench_orders"

func (h *harness) writers(ctx context.Context, res *Results) []error {
	o := h.o
	w := &WritersResult{Clients: o.WriterClients, DurationSeconds: o.WriterDuration.Seconds(), WarmupSeconds: o.WriterWarmup.Seconds(),
		PayloadBytes: o.PayloadBytes, Runs: o.Runs, Modes: writerModes}
	res.Writers = w
	if _, err := h.admin.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+businessTable+` (
		id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		customer text NOT NULL,
		total numeric(12,2) NOT NULL,
		created_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return []error{fmt.Errorf("writers: create %s: %w", businessTable, err)}
	}
	var failed []error
	for _, fsync := range o.WriterFsync {
		if err := h.setFsync(ctx, fsync); err != nil {
			return append(failed, err)
		}
		for _, variant := range []string{"interactive", "pipelined"} {
			for run := range o.Runs {
				modes := slices.Clone(writerModes)
				if run%2 == 1 {
					slices.Reverse(modes)
				}
				var pts []WriterPoint
				for _, mode := range modes {
					if ctx.Err() != nil {
						return append(failed, ctx.Err())
					}
					p, err := h.writerPoint(ctx, run, fsync, variant, mode)
					if err != nil {
						h.logf("writers %s, fsync=%s, %s: FAILED: %v", variant, fsync, mode, err)
						failed = append(failed, fmt.Errorf("writers %s, fsync=%s, %s: %w", variant, fsync, mode, err))
					}
					pts = append(pts, p)
				}
				var base float64
				for _, p := range pts {
					if p.Mode == writerBusiness {
						base = p.TPS
					}
				}
				for i := range pts {
					if base > 0 {
						pts[i].VsBusiness = pts[i].TPS / base
					}
				}
				w.Points = append(w.Points, pts...)
			}
		}
	}
	h.dropSlot(context.WithoutCancel(ctx), h.writersSlot())
	if err := h.resetFsync(context.WithoutCancel(ctx)); err != nil {
		failed = append(failed, err)
	}
	return failed
}

// writersSlot is the logical slot the writers scenario keeps in the
// database, without which pkg/outbox refuses the writes of its
// delete-after-insert and message modes (nothing would decode them).
func (h *harness) writersSlot() string { return h.name("writers") }

// slotCheck is pkg/outbox's condition that the database has a logical slot,
// which its delete-after-insert and message statements carry. (Its
// delete-after-insert statement also checks that a publication carries the
// table, some 20 us more per write: the pipelined variant leaves that out.)
const slotCheck = `EXISTS (SELECT FROM pg_catalog.pg_replication_slots ` +
	`WHERE database = pg_catalog.current_database() AND slot_type = 'logical' ` +
	`AND NOT temporary AND wal_status IS DISTINCT FROM 'lost' AND confirmed_flush_lsn IS NOT NULL)`

// setFsync sets the server's fsync (reloadable). It is server-wide: the
// benchmark's own environment only.
func (h *harness) setFsync(ctx context.Context, v string) error {
	var cur string
	if err := h.admin.QueryRow(ctx, "SHOW fsync").Scan(&cur); err != nil {
		return fmt.Errorf("writers: read fsync: %w", err)
	}
	if cur == v {
		return nil
	}
	h.fsyncChanged = true
	for _, sql := range []string{"ALTER SYSTEM SET fsync = " + v, "SELECT pg_reload_conf()"} {
		if _, err := h.admin.Exec(ctx, sql); err != nil {
			return fmt.Errorf("writers: %s: %w", sql, err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		// A new session sees the reloaded configuration.
		conn, err := pgx.Connect(ctx, h.dsn)
		if err != nil {
			return err
		}
		err = conn.QueryRow(ctx, "SHOW fsync").Scan(&cur)
		conn.Close(context.Background())
		if err != nil {
			return err
		}
		if cur == v {
			h.logf("writers: fsync = %s", v)
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("writers: fsync is still %s after setting it to %s", cur, v)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// resetFsync undoes setFsync.
func (h *harness) resetFsync(ctx context.Context) error {
	if !h.fsyncChanged {
		return nil
	}
	h.fsyncChanged = false
	for _, sql := range []string{"ALTER SYSTEM RESET fsync", "SELECT pg_reload_conf()"} {
		if _, err := h.admin.Exec(ctx, sql); err != nil {
			return fmt.Errorf("writers: %s: %w", sql, err)
		}
	}
	return nil
}

// writerTxn runs one transaction of a mode on conn.
type writerTxn func(ctx context.Context, conn *pgx.Conn, seq int64) error

func (h *harness) writerTxnFunc(variant, mode string) (writerTxn, error) {
	aggType := h.name("wr")
	pad := randomPad(h.o.PayloadBytes)
	event := func(seq int64) (outbox.Event, error) {
		return outbox.NewEvent(aggType, strconv.FormatInt(seq, 10), "OrderCreated",
			map[string]any{"customer": "customer-" + strconv.FormatInt(seq%1000, 10), "total": 12.5, "pad": pad})
	}
	const insertOrder = "INSERT INTO " + businessTable + " (customer, total) VALUES ($1, $2)"
	customer := func(seq int64) string { return "customer-" + strconv.FormatInt(seq%1000, 10) }
	if variant == "interactive" {
		var w *outbox.Writer
		if mode != writerBusiness {
			m := map[string]outbox.Mode{writerTable: outbox.ModeTable, writerDelete: outbox.ModeTableDeleteAfterInsert, writerMessage: outbox.ModeMessage}[mode]
			var err error
			if w, err = outbox.NewWriter(outbox.Config{Table: outboxTable, Mode: m}); err != nil {
				return nil, err
			}
		}
		return func(ctx context.Context, conn *pgx.Conn, seq int64) error {
			tx, err := conn.Begin(ctx)
			if err != nil {
				return err
			}
			defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // after Commit: a no-op
			if _, err := tx.Exec(ctx, insertOrder, customer(seq), "12.50"); err != nil {
				return err
			}
			if w != nil {
				ev, err := event(seq)
				if err != nil {
					return err
				}
				if _, err := w.Write(ctx, tx, ev); err != nil {
					return err
				}
			}
			return tx.Commit(ctx)
		}, nil
	}
	// Pipelined: the same statements as outbox.Writer's, in one batch.
	return func(ctx context.Context, conn *pgx.Conn, seq int64) error {
		b := &pgx.Batch{}
		b.Queue(insertOrder, customer(seq), "12.50")
		if mode != writerBusiness {
			ev, err := event(seq)
			if err != nil {
				return err
			}
			id := outbox.NewID()
			switch mode {
			case writerTable, writerDelete:
				b.Queue("INSERT INTO "+outboxTable+" (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, $3, $4, $5)",
					id, ev.AggregateType, ev.AggregateID, ev.Type, string(ev.Payload))
				if mode == writerDelete {
					b.Queue("WITH deleted AS (DELETE FROM "+outboxTable+" WHERE id IN ($1) RETURNING 1) SELECT WHERE NOT EXISTS (SELECT FROM deleted) OR "+slotCheck, id)
				}
			case writerMessage:
				content := fmt.Sprintf(`{"id":%q,"aggregatetype":%q,"aggregateid":%q,"type":%q,"payload":%s}`, id, ev.AggregateType, ev.AggregateID, ev.Type, ev.Payload)
				b.Queue("SELECT pg_catalog.pg_logical_emit_message(true, $1::text, m.content) FROM (VALUES ($2::text)) AS m(content) WHERE "+slotCheck, outbox.DefaultMessagePrefix, content)
			}
		}
		return conn.SendBatch(ctx, b).Close()
	}, nil
}

// writerPoint measures one mode: o.WriterClients connections run its
// transactions back to back for o.WriterWarmup, then o.WriterDuration
// measured.
func (h *harness) writerPoint(ctx context.Context, run int, fsync, variant, mode string) (WriterPoint, error) {
	o := h.o
	p := WriterPoint{Run: run + 1, Fsync: fsync, Variant: variant, Mode: mode}
	txn, err := h.writerTxnFunc(variant, mode)
	if err != nil {
		return p, err
	}
	// A fresh slot for each point, as a relay's would be: it holds back
	// only the point's own WAL, which the server would keep until its next
	// checkpoint anyway.
	h.dropSlot(ctx, h.writersSlot())
	if _, err := h.admin.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", h.writersSlot()); err != nil {
		return p, fmt.Errorf("create slot %s: %w", h.writersSlot(), err)
	}
	for _, sql := range []string{"TRUNCATE " + businessTable + ", " + outboxTable, "CHECKPOINT"} {
		if _, err := h.admin.Exec(ctx, sql); err != nil {
			return p, fmt.Errorf("%s: %w", sql, err)
		}
	}
	conns := make([]*pgx.Conn, o.WriterClients)
	pids := make([]int, o.WriterClients)
	for i := range conns {
		c, err := pgx.Connect(ctx, h.dsn)
		if err != nil {
			return p, err
		}
		defer c.Close(context.Background())
		var pid int
		if err := c.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
			return p, err
		}
		conns[i], pids[i] = c, pid
	}
	backendCPU := func() float64 {
		var sum float64
		for _, pid := range pids {
			v, _ := readCPUSeconds(pid)
			sum += v
		}
		return sum
	}
	var (
		measuring atomic.Bool
		stop      atomic.Bool
		seq       atomic.Int64
		count     atomic.Int64
		nErr      atomic.Int64
		wg        sync.WaitGroup
		mu        sync.Mutex
		lat       []float64
		firstErr  error
	)
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []float64
			for !stop.Load() && ctx.Err() == nil {
				t0 := time.Now()
				err := txn(ctx, c, seq.Add(1))
				if !measuring.Load() {
					continue
				}
				if err != nil {
					nErr.Add(1)
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					if c.IsClosed() {
						return
					}
					continue
				}
				count.Add(1)
				mine = append(mine, float64(time.Since(t0).Microseconds())/1000)
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		}()
	}
	sleep := func(d time.Duration) {
		select {
		case <-ctx.Done():
		case <-time.After(d):
		}
	}
	sleep(o.WriterWarmup)
	var wal0, wal1 string
	if err := h.admin.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&wal0); err != nil {
		stop.Store(true)
		wg.Wait()
		return p, err
	}
	cpu0, m0 := backendCPU(), readMachineCPU()
	t0 := time.Now()
	measuring.Store(true)
	sleep(o.WriterDuration)
	measuring.Store(false)
	elapsed := time.Since(t0)
	n := count.Load()
	err = h.admin.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&wal1)
	cpu1, m1 := backendCPU(), readMachineCPU()
	stop.Store(true)
	wg.Wait()
	if err != nil {
		return p, err
	}
	var walBytes int64
	if err := h.admin.QueryRow(ctx, "SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)::bigint", wal1, wal0).Scan(&walBytes); err != nil {
		return p, err
	}
	p.Transactions, p.Errors = n, nErr.Load()
	p.TPS = float64(n) / elapsed.Seconds()
	p.LatencyMs = percentiles(lat)
	p.MachineCPUBusy = m0.busyUntil(m1)
	if n > 0 {
		p.WALBytesPerTxn = float64(walBytes) / float64(n)
		p.BackendCPUMicros = (cpu1 - cpu0) / float64(n) * 1e6
	}
	h.logf("writers %s, fsync=%s, run %d, %s: %.0f transactions/s (p50 %.2f ms, p99 %.2f ms), %.0f WAL bytes and %.0f µs of backend CPU per transaction, machine %.0f%% busy",
		variant, fsync, run+1, mode, p.TPS, p.LatencyMs.P50, p.LatencyMs.P99, p.WALBytesPerTxn, p.BackendCPUMicros, p.MachineCPUBusy*100)
	if n == 0 {
		return p, fmt.Errorf("no transaction committed: %w", errors.Join(firstErr))
	}
	return p, nil
}
