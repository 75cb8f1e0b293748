package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/pgoutbox/pkg/kafka/kafkatest"
)

// LatencyResult is one steady-state scenario: single-event transactions at
// a fixed rate, and the time from each commit until Kafka has the record.
//
// Latency of an event = the broker's append time of the record (the topic is
// created with message.timestamp.type=LogAppendTime, so Kafka stamps each
// record when it appends it to the log) − clock_timestamp() evaluated inside
// the event's INSERT, which is the only statement of its transaction (the
// commit follows at once, at the Sync that ends the statement; the
// environment runs with fsync off, so the commit is quick). Both clocks are
// this machine's. It spans the commit, the WAL write, decoding, pgoutbox and
// Kafka's produce up to the append; not the acks=all answer and not a
// consumer's fetch, which ReceiveLatencyMs adds. The append time has
// millisecond precision: the middle of its millisecond is used.
type LatencyResult struct {
	// Source is "" for the WAL source, a poll variant's label for the poll
	// source (poll.go).
	Source string `json:"source,omitempty"`
	// Mode is at-least-once or exactly-once (kafka.exactly.once; its
	// consumer reads with read_committed, so ReceiveLatencyMs includes
	// the wait for the Kafka transaction's commit, and LatencyMs, the
	// append, does not).
	Mode            string  `json:"mode"`
	TargetRate      int     `json:"target_rate"`
	DurationSeconds float64 `json:"duration_s"` // how long the measured writing ran
	Writers         int     `json:"writers"`
	Topic           string  `json:"topic"`
	// SettleEvents were committed at the same rate before the measurement
	// started (Options.Settle); they were delivered but are not counted in
	// Committed, the latencies or the CPU shares.
	SettleEvents int64   `json:"settle_events_committed"`
	Committed    int64   `json:"events_committed"`
	AchievedRate float64 `json:"achieved_rate"`
	WriteErrors  int64   `json:"write_errors"`
	// Received counts committed events that arrived (each once), Missing
	// those that had not arrived DrainTimeout after the writers stopped.
	Received   int64 `json:"events_received"`
	Missing    int64 `json:"events_missing"`
	Duplicates int64 `json:"duplicates"`

	LatencyMs Percentiles `json:"latency_ms"`
	// ReceiveLatencyMs is from the commit to a sarama consumer's callback
	// receiving the record: LatencyMs plus the consumer's fetch.
	ReceiveLatencyMs Percentiles `json:"receive_latency_ms"`
	// P50 of the events committed in the first and in the last quarter of
	// the run, and the growth of the lag over the run (the least-squares
	// slope of latency against commit time, times the duration).
	FirstQuarterP50Ms float64 `json:"first_quarter_p50_ms"`
	LastQuarterP50Ms  float64 `json:"last_quarter_p50_ms"`
	LagGrowthMs       float64 `json:"lag_growth_ms"`
	// DrainSeconds is from the writers' stop to the last event's arrival.
	DrainSeconds float64 `json:"drain_s"`
	KeptUp       bool    `json:"kept_up"`
	KeptUpReason string  `json:"kept_up_reason"`

	// Pgoutbox's resources over the scenario (start, warm-up, writing,
	// draining), read from /proc before it was stopped.
	Pgoutbox          ProcStats `json:"pgoutbox"`
	CPUSecondsPer100k float64   `json:"pgoutbox_cpu_s_per_100k_events"`
	// PgoutboxWindow is pgoutbox's resources while the measured writes
	// ran (no start-up, warm-up, settling or drain), and
	// WindowCPUSecondsPer100k its CPU time then per 100,000 events
	// committed then.
	PgoutboxWindow          ProcStats `json:"pgoutbox_window"`
	WindowCPUSecondsPer100k float64   `json:"pgoutbox_window_cpu_s_per_100k_events"`
	// While the writers ran: the CPU time of the walsender decoding for
	// pgoutbox and of this harness (writers and consumer), and the share
	// of the machine's CPU time that was busy (all processes, 0-1).
	WalsenderCPUSeconds float64 `json:"walsender_cpu_s"`
	HarnessCPUSeconds   float64 `json:"harness_cpu_s"`
	MachineCPUBusy      float64 `json:"machine_cpu_busy"`

	// Timeline has one entry per second of commit time.
	Timeline []SecondStats `json:"timeline"`

	Error string `json:"error,omitempty"`
}

// Percentiles of latency in milliseconds (nearest rank).
type Percentiles struct {
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	P999 float64 `json:"p99_9"`
	Max  float64 `json:"max"`
	Mean float64 `json:"mean"`
}

// SecondStats describes the events committed in one second of a run.
type SecondStats struct {
	Second       int     `json:"second"`
	Events       int     `json:"events"`
	P50Ms        float64 `json:"p50_ms"`
	P99Ms        float64 `json:"p99_ms"`
	MaxMs        float64 `json:"max_ms"`
	ReceiveP50Ms float64 `json:"receive_p50_ms"`
}

// keptUpMaxGrowthMs is the growth of the lag over a run (LagGrowthMs)
// beyond which the relay counts as falling behind.
const keptUpMaxGrowthMs = 250

// latencyEndpoint is where a run's latency ends: the topics' timestamp
// type that makes each record's timestamp that moment, and its name in the
// results and in the log.
type latencyEndpoint struct{ timestampType, key, label string }

func latencyEnd(o Options) latencyEndpoint {
	if o.RouteTimes {
		return latencyEndpoint{"CreateTime", "pgoutbox_route", "pgoutbox routing"} // pgoutbox stamps the routing time
	}
	return latencyEndpoint{"LogAppendTime", "kafka_append", "Kafka append"}
}

// latencyInsert writes one event into table whose payload carries its
// sequence number and the commit time (microseconds since the epoch).
func latencyInsert(table string) string {
	return `INSERT INTO ` + table + ` (id, aggregatetype, aggregateid, type, payload)
VALUES (gen_random_uuid(), $1, $2, 'Created', jsonb_build_object('seq', $3::bigint,
	'ts', (extract(epoch FROM clock_timestamp()) * 1000000)::bigint, 'pad', $4::text))`
}

// latencySource is what a latency run measures: the WAL source (the
// table outboxTable, a slot) or the poll source (poll.go).
type latencySource struct {
	tag   string // prefixes the run's names ("" for the WAL source)
	table string
	// env is pgoutbox's environment for the run's slot name.
	env func(slot string) []string
	// ready waits until pgoutbox reads the source.
	ready func(ctx context.Context, p *relayProc, slot string) error
}

func (h *harness) walSource() latencySource {
	return latencySource{table: outboxTable, env: func(slot string) []string { return h.relayEnv(slot) },
		ready: func(ctx context.Context, p *relayProc, slot string) error {
			return h.waitSlotActive(ctx, p, slot, time.Minute)
		}}
}

// receiver collects what the consumer receives.
type receiver struct {
	mu        sync.Mutex
	commitUS  []int64 // by seq: commit time from the payload, µs
	recvUS    []int64 // by seq: Kafka's append time, µs; 0 = not received
	consumeUS []int64 // by seq: the consumer's receive time, µs
	received  int64
	dups      int64
	warm      int64 // warm-up events (negative seq)
	unknown   int64
	lastRecv  time.Time
	decodeErr error
}

func (rc *receiver) add(value []byte, appended, now time.Time) {
	var ev struct {
		Seq int64 `json:"seq"`
		TS  int64 `json:"ts"`
	}
	err := json.Unmarshal(value, &ev)
	if err != nil && len(value) > 0 && value[0] == '"' {
		// JsonConverter writes a json column's value as a JSON string
		// (Debezium, and pgoutbox with the same connector JSON).
		var inner string
		if err = json.Unmarshal(value, &inner); err == nil {
			err = json.Unmarshal([]byte(inner), &ev)
		}
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if err != nil {
		if rc.decodeErr == nil {
			rc.decodeErr = fmt.Errorf("record value %q: %w", value, err)
		}
		return
	}
	switch {
	case ev.Seq < 0:
		rc.warm++
	case ev.Seq >= int64(len(rc.recvUS)):
		rc.unknown++
	case rc.recvUS[ev.Seq] != 0:
		rc.dups++
	default:
		// The append time is whole milliseconds: take the middle of it.
		rc.recvUS[ev.Seq] = appended.UnixMilli()*1000 + 500
		rc.commitUS[ev.Seq] = ev.TS
		rc.consumeUS[ev.Seq] = now.UnixMicro()
		rc.received++
		rc.lastRecv = now
	}
}

func (rc *receiver) counts() (received, warm int64) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.received, rc.warm
}

func (h *harness) latency(ctx context.Context, rate int, src latencySource) (LatencyResult, error) {
	o := h.o
	res := LatencyResult{Mode: h.mode(), TargetRate: rate, Writers: o.LatencyWriters}
	tag := src.tag + fmt.Sprintf("lat%d%s", rate, h.variantTag)
	iso := sarama.ReadUncommitted
	if h.eos {
		tag += "eos"
		iso = sarama.ReadCommitted
	}
	aggType := h.name(tag)
	res.Topic = "outbox.event." + aggType
	slot := h.name(tag)
	h.logf("latency at %d events/s for %s with %d writers", rate, o.Duration, o.LatencyWriters)
	// Kafka stamps each record with its append time (or, with RouteTimes,
	// keeps pgoutbox's routing time): the latency ends there, not when a
	// consumer fetched the record.
	if err := h.createTopic(res.Topic, map[string]string{"message.timestamp.type": latencyEnd(o).timestampType}); err != nil {
		return res, err
	}
	defer h.dropSlot(context.WithoutCancel(ctx), slot)

	// pgoutbox creates its slot, at the current end of WAL.
	p, err := startRelay(o.Pgoutbox, src.env(slot), filepath.Join(h.logDir, "pgoutbox-"+tag+".log"))
	if err != nil {
		return res, err
	}
	defer p.stop(time.Minute) // on the error paths
	if err := src.ready(ctx, p, slot); err != nil {
		return res, err
	}

	// Events 0..settleN-1 are due before the measurement starts.
	settleN := int64(math.Ceil(float64(rate) * o.Settle.Seconds()))
	maxEvents := int(settleN) + int(math.Ceil(float64(rate)*o.Duration.Seconds())) + 1
	rc := &receiver{commitUS: make([]int64, maxEvents), recvUS: make([]int64, maxEvents), consumeUS: make([]int64, maxEvents)}
	tail := h.tailIsolated(ctx, []string{res.Topic}, iso, func(r kafkatest.Record) { rc.add(r.Value, r.Timestamp, time.Now()) })
	defer tail.close()

	// Warm-up: a few events through the whole path (relation message,
	// producer metadata, consumer fetch) before the clock starts.
	pad := strings.Repeat("x", o.PayloadBytes)
	if err := h.warmUp(ctx, []proc{p}, []*receiver{rc}, src.table, aggType, pad, tail, time.Minute); err != nil {
		return res, err
	}

	// The writers: o.Settle at the rate, then the measured o.Duration.
	// The CPU readings are taken when the measurement starts.
	committed := make([]bool, maxEvents)
	ws := startWalsenderSampler(h.dsn, slot)
	defer ws.stop()
	ws.wait(time.Second)
	type cpuMark struct {
		walsender, self float64
		machine         machineCPU
		relay           ProcStats
		relayErr        error
	}
	mark := func() cpuMark {
		self, _ := readCPUSeconds(os.Getpid())
		m := cpuMark{walsender: ws.sample(), self: self, machine: readMachineCPU()}
		m.relay, m.relayErr = readProcStats(p.pid())
		return m
	}
	var m0, m1 cpuMark
	ph, err := h.writePhase(ctx, rate, src.table, aggType, pad, committed, settleN, func(end bool) {
		if end {
			m1 = mark()
		} else {
			m0 = mark()
		}
	})
	res.MachineCPUBusy = m0.machine.busyUntil(m1.machine)
	res.HarnessCPUSeconds = m1.self - m0.self
	if m0.walsender > 0 {
		res.WalsenderCPUSeconds = m1.walsender - m0.walsender
	}
	if m0.relayErr == nil && m1.relayErr == nil {
		res.PgoutboxWindow = m1.relay.since(m0.relay)
	}
	res.DurationSeconds, res.SettleEvents, res.Committed, res.WriteErrors, res.AchievedRate = ph.seconds, ph.settleEvents, ph.committed, ph.errors, ph.rate
	if err != nil {
		return res, err
	}
	if err := h.waitReceived(ctx, []proc{p}, []*receiver{rc}, ph.total, ph.end.Add(o.DrainTimeout)); err != nil {
		return res, err
	}
	st, err := p.stats()
	if err != nil {
		return res, err
	}
	res.Pgoutbox = st
	if err := p.stop(time.Minute); err != nil {
		return res, err
	}
	if err := tail.close(); err != nil {
		return res, err
	}

	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.decodeErr != nil {
		return res, rc.decodeErr
	}
	res.Duplicates = rc.dups
	res.summarize(latencyData{committed: committed[settleN:], commitUS: rc.commitUS[settleN:], recvUS: rc.recvUS[settleN:], consumeUS: rc.consumeUS[settleN:],
		start: ph.start, writersEnd: ph.end, lastRecv: rc.lastRecv, keepUpBound: o.KeepUpBound, drainTimeout: o.DrainTimeout})
	if ph.total > 0 { // pgoutbox's CPU time covers the settling too
		res.CPUSecondsPer100k = st.CPUSeconds / float64(ph.total) * 100_000
	}
	if res.Committed > 0 {
		res.WindowCPUSecondsPer100k = res.PgoutboxWindow.CPUSeconds / float64(res.Committed) * 100_000
	}
	h.logf("  latency ms (commit to %s): p50 %.1f p90 %.1f p99 %.1f p99.9 %.1f max %.1f (commit to consumer: p50 %.1f p99 %.1f); kept up: %v (%s)",
		latencyEnd(o).label,
		res.LatencyMs.P50, res.LatencyMs.P90, res.LatencyMs.P99, res.LatencyMs.P999, res.LatencyMs.Max, res.ReceiveLatencyMs.P50, res.ReceiveLatencyMs.P99,
		res.KeptUp, res.KeptUpReason)
	h.logf("  pgoutbox CPU %.2f s, peak RSS %d MB (%s); while writing: pgoutbox CPU %.2f s (%.2f s per 100k events; per event %.2f reads, %.2f writes, %.2f voluntary context switches), walsender CPU %.2f s, harness CPU %.2f s, machine CPU %.0f%% busy",
		st.CPUSeconds, st.PeakRSSBytes>>20, rssSplit(res.PgoutboxWindow), res.PgoutboxWindow.CPUSeconds, res.WindowCPUSecondsPer100k,
		perEvent(res.PgoutboxWindow.ReadSyscalls, res.Committed), perEvent(res.PgoutboxWindow.WriteSyscalls, res.Committed), perEvent(res.PgoutboxWindow.VoluntarySwitches, res.Committed),
		res.WalsenderCPUSeconds, res.HarnessCPUSeconds, res.MachineCPUBusy*100)
	if res.Received == 0 {
		return res, errors.New("no event arrived")
	}
	return res, nil
}

// waitSlotActive waits until a walsender streams from slot. "active"
// alone is not enough: a slot being created is active too, held by the
// creating backend while it waits for running transactions to end, and
// events committed then precede the slot's consistent point and are
// rightly never decoded (the warm-up lost its rows that way while other
// work kept transactions open).
func (h *harness) waitSlotActive(ctx context.Context, p proc, slot string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		var streaming bool
		err := h.admin.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_replication_slots s
			JOIN pg_stat_activity a ON a.pid = s.active_pid
			WHERE s.slot_name = $1 AND a.backend_type = 'walsender')`, slot).Scan(&streaming)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("read slot %s: %w", slot, err)
		}
		if streaming {
			return nil
		}
		if err := p.exited(); err != nil {
			return err
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s did not start streaming from slot %s within %s; last log lines:\n%s", p.name(), slot, within, p.logTail(15))
		}
		time.Sleep(pollInterval)
	}
}

// tailer is a consumer of topics running in the background.
type tailer struct {
	cancel  context.CancelFunc
	done    chan struct{}
	started chan struct{}
	err     error
}

// tail starts consuming every partition of topics from the oldest offset,
// calling fn for each record, until close.
func (h *harness) tail(ctx context.Context, topics []string, fn func(kafkatest.Record)) *tailer {
	return h.tailIsolated(ctx, topics, sarama.ReadUncommitted, fn)
}

// tailIsolated is tail with a consumer of isolation level iso
// (sarama.ReadCommitted for exactly-once mode).
func (h *harness) tailIsolated(ctx context.Context, topics []string, iso sarama.IsolationLevel, fn func(kafkatest.Record)) *tailer {
	return h.tailWith(ctx, topics, kafkatest.TailOptions{Isolation: iso}, fn)
}

// tailWith is tail with options; started is closed once the consumer
// reads every partition (or it ended).
func (h *harness) tailWith(ctx context.Context, topics []string, o kafkatest.TailOptions, fn func(kafkatest.Record)) *tailer {
	cctx, cancel := context.WithCancel(ctx)
	t := &tailer{cancel: cancel, done: make(chan struct{}), started: make(chan struct{})}
	var once sync.Once
	o.Started = func() { once.Do(func() { close(t.started) }) }
	go func() {
		// started closes after done when the consumer fails to start, so
		// that ended reports the failure to whoever waited for started.
		defer o.Started()
		defer close(t.done)
		t.err = kafkatest.TailWith(cctx, h.kcfg, topics, o, func(r kafkatest.Record) bool {
			fn(r)
			return true
		})
	}()
	return t
}

// ended returns an error once the consumer has stopped by itself.
func (t *tailer) ended() error {
	select {
	case <-t.done:
		return fmt.Errorf("consumer stopped: %v", t.err)
	default:
		return nil
	}
}

// close stops the consumer and returns its error; closing twice is
// harmless.
func (t *tailer) close() error {
	t.cancel()
	<-t.done
	if t.err != nil {
		return fmt.Errorf("consumer: %w", t.err)
	}
	return nil
}

// warmUp writes h.o.Warmup events with negative sequence numbers and waits
// (up to within) until every receiver has received them, each from the
// process of the same index.
func (h *harness) warmUp(ctx context.Context, ps []proc, rcs []*receiver, table, aggType, pad string, tail *tailer, within time.Duration) error {
	for i := range h.o.Warmup {
		if _, err := h.admin.Exec(ctx, latencyInsert(table), aggType, "warm", -1-i, pad); err != nil {
			return fmt.Errorf("warm-up insert: %w", err)
		}
	}
	deadline := time.Now().Add(within)
	for {
		done := true
		for i, rc := range rcs {
			if _, warm := rc.counts(); warm < int64(h.o.Warmup) {
				done = false
				if err := ps[i].exited(); err != nil {
					return err
				}
				if time.Now().After(deadline) || ctx.Err() != nil {
					return fmt.Errorf("warm-up: %d of %d events arrived through %s within %s", warm, h.o.Warmup, ps[i].name(), within)
				}
			}
		}
		if done {
			return nil
		}
		if err := tail.ended(); err != nil {
			return err
		}
		time.Sleep(pollInterval)
	}
}

// phase is the measured writing of a latency run.
type phase struct {
	start, end time.Time // of the measured part
	seconds    float64
	// settleEvents were committed during the settling; committed and
	// errors during the measured part, at rate; total is every commit.
	settleEvents, committed, errors, total int64
	rate                                   float64
}

// writePhase writes into table at rate for o.Settle, not counted, then
// o.Duration measured; mark(false) runs when the measurement starts and
// mark(true) when the writers have ended.
func (h *harness) writePhase(ctx context.Context, rate int, table, aggType, pad string, committed []bool, settleN int64, mark func(end bool)) (phase, error) {
	o := h.o
	ph := phase{start: time.Now().Add(o.Settle)}
	marked := make(chan struct{})
	timer := time.AfterFunc(o.Settle, func() { mark(false); close(marked) })
	wres, err := writeAtRate(ctx, h.dsn, latencyInsert(table), rate, o.Settle+o.Duration, o.LatencyWriters, aggType, pad, int64(len(committed)), committed)
	ph.end = time.Now()
	if timer.Stop() { // the writers ended during the settling
		mark(false)
		ph.start = time.Now()
	} else {
		<-marked
	}
	mark(true)
	ph.seconds = ph.end.Sub(ph.start).Seconds()
	for k := range min(settleN, int64(len(committed))) {
		if committed[k] {
			ph.settleEvents++
		}
	}
	ph.total, ph.errors = wres.committed, wres.errors
	ph.committed = wres.committed - ph.settleEvents
	ph.rate = float64(ph.committed) / ph.seconds
	if err != nil {
		return ph, fmt.Errorf("writers: %w", err)
	}
	h.logf("  wrote %d events in %.1f s after %d to settle: %.0f events/s (%d errors)", ph.committed, ph.seconds, ph.settleEvents, ph.rate, ph.errors)
	return ph, nil
}

// waitReceived waits until every receiver has n events or deadline
// passes; each receiver's process must stay up meanwhile.
func (h *harness) waitReceived(ctx context.Context, ps []proc, rcs []*receiver, n int64, deadline time.Time) error {
	for {
		all := true
		for _, rc := range rcs {
			if got, _ := rc.counts(); got < n {
				all = false
			}
		}
		if all || time.Now().After(deadline) || ctx.Err() != nil {
			return nil
		}
		for _, p := range ps {
			if err := p.exited(); err != nil {
				return err
			}
		}
		time.Sleep(pollInterval)
	}
}

type writeResult struct {
	committed, errors int64
}

// maxPipeline caps the events one writer sends in one round trip.
const maxPipeline = 64

// writeAtRate commits single-event transactions at rate for dur with
// workers connections. Event k is due at start + k/rate. One pacer wakes
// at most every pacerTick, hands every event due by then (up to
// maxPipeline at a time) to an idle worker, and each worker sends its batch
// pipelined, each INSERT followed by its own Sync, so each is its own
// transaction. A single pacer keeps the harness's own wake-ups, which
// compete with the servers for the CPU, at about 1,000 per second instead of
// one per worker per event. Workers that fall behind catch up in bigger
// batches; nothing is handed out after dur. committed[k] is set for each
// event whose commit succeeded.
func writeAtRate(ctx context.Context, dsn, insert string, rate int, dur time.Duration, workers int, aggType, pad string, maxEvents int64, committed []bool) (writeResult, error) {
	var (
		nCommit   atomic.Int64
		nErr      atomic.Int64
		wg        sync.WaitGroup
		errs      = make([]error, workers)
		conns     = make([]*pgx.Conn, workers)
		perEvent  = float64(time.Second) / float64(rate)
		padBytes  = []byte(pad)
		aggBytes  = []byte(aggType)
		firstErrs sync.Once
		firstErr  error
	)
	// Connect and prepare before the clock starts.
	for w := range workers {
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return writeResult{}, err
		}
		defer conn.Close(context.Background())
		if _, err := conn.PgConn().Prepare(ctx, "bench_insert", insert, nil); err != nil {
			return writeResult{}, fmt.Errorf("prepare: %w", err)
		}
		conns[w] = conn
	}
	type batch struct{ k, n int64 }
	batches := make(chan batch, workers)
	wctx, stopWorkers := context.WithCancel(ctx)
	defer stopWorkers()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pc := conns[w].PgConn()
			for b := range batches {
				ok, failed, err := sendPipeline(wctx, pc, aggBytes, padBytes, b.k, b.n, committed)
				nCommit.Add(ok)
				nErr.Add(failed)
				if failed > 0 {
					firstErrs.Do(func() { firstErr = err })
				}
				if err != nil && failed == 0 {
					errs[w] = err
					stopWorkers() // a broken connection ends the run
					return
				}
			}
		}()
	}
	start := time.Now()
	end := start.Add(dur)
	var next int64
pace:
	for next < maxEvents && wctx.Err() == nil {
		now := time.Now()
		if !now.Before(end) {
			break
		}
		due := start.Add(time.Duration(float64(next) * perEvent))
		if wait := due.Sub(now); wait > 0 {
			time.Sleep(min(max(wait, pacerTick), end.Sub(now))) // pacing
			continue
		}
		upto := min(int64(float64(now.Sub(start))/perEvent)+1, maxEvents) // events due by now
		for next < upto {
			n := min(upto-next, maxPipeline)
			select {
			case batches <- batch{next, n}:
				next += n
			case <-wctx.Done():
				break pace
			}
		}
	}
	close(batches)
	wg.Wait()
	res := writeResult{committed: nCommit.Load(), errors: nErr.Load()}
	if err := errors.Join(errs...); err != nil {
		return res, err
	}
	if ctx.Err() != nil {
		return res, ctx.Err()
	}
	if res.errors > 0 && res.committed == 0 {
		return res, fmt.Errorf("every insert failed: %w", firstErr)
	}
	return res, nil
}

// pacerTick is the shortest sleep of writeAtRate's pacer: events due
// within it are handed out together.
const pacerTick = time.Millisecond

// sendPipeline sends events k..k+n-1 as n single-statement transactions in
// one round trip. It returns how many committed and how many failed with a
// server error (the error is the first such); a non-nil error with failed
// == 0 is a broken connection.
func sendPipeline(ctx context.Context, pc *pgconn.PgConn, agg, pad []byte, k, n int64, committed []bool) (ok, failed int64, err error) {
	pl := pc.StartPipeline(ctx)
	for i := range n {
		seq := k + i
		params := [][]byte{agg, []byte("agg-" + strconv.FormatInt(seq%1000, 10)), []byte(strconv.FormatInt(seq, 10)), pad}
		pl.SendQueryPrepared("bench_insert", params, nil, nil)
		pl.SendPipelineSync()
	}
	if err := pl.Flush(); err != nil {
		_ = pl.Close()
		return 0, 0, err
	}
	var firstErr error
	for i := range n {
		good := true
		res, err := pl.GetResults()
		if err == nil {
			if rr, isRR := res.(*pgconn.ResultReader); isRR {
				_, err = rr.Close()
			} else {
				err = fmt.Errorf("unexpected pipeline result %T", res)
			}
		}
		if err != nil {
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) {
				_ = pl.Close()
				return ok, 0, err
			}
			good = false
			if firstErr == nil {
				firstErr = err
			}
		}
		res, err = pl.GetResults() // the Sync: the commit's outcome
		if err != nil {
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) {
				_ = pl.Close()
				return ok, 0, err
			}
			good = false
			if firstErr == nil {
				firstErr = err
			}
		} else if _, isSync := res.(*pgconn.PipelineSync); !isSync {
			_ = pl.Close()
			return ok, 0, fmt.Errorf("unexpected pipeline result %T, want the Sync", res)
		}
		if good {
			committed[k+i] = true
			ok++
		} else {
			failed++
		}
	}
	if err := pl.Close(); err != nil && failed == 0 {
		return ok, 0, err
	}
	return ok, failed, firstErr
}

// latencyData is what summarize works from.
type latencyData struct {
	committed                   []bool
	commitUS, recvUS, consumeUS []int64 // by seq, µs: commit, Kafka append, consumer receive
	start, writersEnd           time.Time
	lastRecv                    time.Time
	keepUpBound, drainTimeout   time.Duration
}

// summarize computes the latency statistics of the committed events.
func (r *LatencyResult) summarize(d latencyData) {
	type sample struct {
		commit, lat, recv int64 // µs
		received          bool  // recv is known
	}
	var samples []sample
	for k, c := range d.committed {
		if !c {
			continue
		}
		if d.recvUS[k] == 0 {
			r.Missing++
			continue
		}
		// The append time has millisecond precision: an append in the
		// millisecond of the commit can come out a little negative.
		x := sample{commit: d.commitUS[k], lat: max(0, d.recvUS[k]-d.commitUS[k])}
		if d.consumeUS != nil && d.consumeUS[k] > 0 {
			x.recv, x.received = d.consumeUS[k]-d.commitUS[k], true
		}
		samples = append(samples, x)
	}
	r.Received = int64(len(samples))
	if len(samples) == 0 {
		r.KeptUpReason = "no event arrived"
		return
	}
	ms := func(s []sample, recv bool) []float64 {
		out := make([]float64, 0, len(s))
		for _, x := range s {
			switch {
			case !recv:
				out = append(out, float64(x.lat)/1000)
			case x.received:
				out = append(out, float64(x.recv)/1000)
			}
		}
		return out
	}
	r.LatencyMs = percentiles(ms(samples, false))
	r.ReceiveLatencyMs = percentiles(ms(samples, true))
	if dr := d.lastRecv.Sub(d.writersEnd).Seconds(); dr > 0 {
		r.DrainSeconds = dr
	}

	// Lag growth: the first and last quarter by commit time, and the
	// least-squares slope of latency against commit time.
	slices.SortFunc(samples, func(a, b sample) int { return cmp.Compare(a.commit, b.commit) })
	q := max(1, len(samples)/4)
	r.FirstQuarterP50Ms = percentiles(ms(samples[:q], false)).P50
	r.LastQuarterP50Ms = percentiles(ms(samples[len(samples)-q:], false)).P50
	var sx, sy, sxx, sxy float64
	t0 := samples[0].commit
	for _, x := range samples {
		tx, ly := float64(x.commit-t0)/1e6, float64(x.lat)/1000 // s, ms
		sx, sy, sxx, sxy = sx+tx, sy+ly, sxx+tx*tx, sxy+tx*ly
	}
	n := float64(len(samples))
	span := float64(samples[len(samples)-1].commit-t0) / 1e6
	if den := n*sxx - sx*sx; den > 0 && span > 0 {
		r.LagGrowthMs = (n*sxy - sx*sy) / den * span
	}

	// Per second of commit time.
	startUS := d.start.UnixMicro()
	from := 0
	for i := 1; i <= len(samples); i++ {
		sec := func(j int) int64 { return max(0, samples[j].commit-startUS) / 1_000_000 }
		if i < len(samples) && sec(i) == sec(from) {
			continue
		}
		part := samples[from:i]
		p := percentiles(ms(part, false))
		r.Timeline = append(r.Timeline, SecondStats{Second: int(sec(from)), Events: len(part), P50Ms: p.P50, P99Ms: p.P99, MaxMs: p.Max,
			ReceiveP50Ms: percentiles(ms(part, true)).P50})
		from = i
	}

	switch {
	case r.Missing > 0:
		r.KeptUpReason = fmt.Sprintf("%d events had not arrived %s after the writers stopped", r.Missing, d.drainTimeout)
	case r.DrainSeconds > d.keepUpBound.Seconds():
		r.KeptUpReason = fmt.Sprintf("the last event arrived %.2f s after the writers stopped (bound %s)", r.DrainSeconds, d.keepUpBound)
	case r.LagGrowthMs > keptUpMaxGrowthMs:
		r.KeptUpReason = fmt.Sprintf("lag grew by %.0f ms over the run (p50 %.1f ms in the first quarter, %.1f ms in the last)", r.LagGrowthMs, r.FirstQuarterP50Ms, r.LastQuarterP50Ms)
	default:
		r.KeptUp = true
		r.KeptUpReason = fmt.Sprintf("all arrived within %.2f s of the writers' stop; lag growth %.0f ms (p50 %.1f ms in the first quarter, %.1f ms in the last)",
			r.DrainSeconds, r.LagGrowthMs, r.FirstQuarterP50Ms, r.LastQuarterP50Ms)
	}
}

func perEvent(n, events int64) float64 {
	if events <= 0 {
		return 0
	}
	return float64(n) / float64(events)
}

// percentiles of values (nearest rank); values are sorted in place.
func percentiles(values []float64) Percentiles {
	if len(values) == 0 {
		return Percentiles{}
	}
	slices.Sort(values)
	rank := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(values)))) - 1
		return values[min(max(i, 0), len(values)-1)]
	}
	var sum float64
	for _, v := range values {
		sum += v
	}
	return Percentiles{P50: rank(0.50), P90: rank(0.90), P99: rank(0.99), P999: rank(0.999), Max: values[len(values)-1], Mean: sum / float64(len(values))}
}
