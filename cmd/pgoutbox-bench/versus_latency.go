package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/pgoutbox/pgoutbox/pkg/kafka/kafkatest"
)

// VersusLatency is one latency run beside Debezium: pgoutbox and Debezium
// (with Setting) run at once, each on its own slot copied at one LSN, and
// the same single-event transactions at Rate go through both, so that
// both see the same events on the same machine at the same time.
type VersusLatency struct {
	Run     int    `json:"run"`
	Setting string `json:"debezium_setting"`
	Rate    int    `json:"target_rate"`
	// DurationSeconds is how long the measured writing ran, after
	// SettleEvents written at the same rate and not counted.
	DurationSeconds float64 `json:"duration_s"`
	SettleEvents    int64   `json:"settle_events_committed"`
	Committed       int64   `json:"events_committed"`
	AchievedRate    float64 `json:"achieved_rate"`
	WriteErrors     int64   `json:"write_errors"`
	// MachineCPUBusy is the share of all CPUs' time that was busy while
	// the measured writes ran; HarnessCPUSeconds the harness's CPU time
	// then (writers and consumer).
	MachineCPUBusy    float64 `json:"machine_cpu_busy"`
	HarnessCPUSeconds float64 `json:"harness_cpu_s"`

	Pgoutbox SystemLatency `json:"pgoutbox"`
	Debezium SystemLatency `json:"debezium"`
	// P50Ratio and P99Ratio are pgoutbox's percentiles over Debezium's.
	P50Ratio float64 `json:"p50_pgoutbox_over_debezium"`
	P99Ratio float64 `json:"p99_pgoutbox_over_debezium"`

	Error string `json:"error,omitempty"`
}

// SystemLatency is one system's part of a VersusLatency.
type SystemLatency struct {
	Topic string `json:"topic"`
	// StreamingSeconds is from starting the process until its walsender
	// streamed; FirstRecordSeconds until the first warm-up event arrived.
	StreamingSeconds   float64 `json:"streaming_s"`
	FirstRecordSeconds float64 `json:"first_record_s"`

	Received   int64 `json:"events_received"`
	Missing    int64 `json:"events_missing"`
	Duplicates int64 `json:"duplicates"`
	// LatencyMs is from the commit to Kafka's append of the record;
	// ReceiveLatencyMs to a consumer's receipt.
	LatencyMs        Percentiles `json:"latency_ms"`
	ReceiveLatencyMs Percentiles `json:"receive_latency_ms"`
	KeptUp           bool        `json:"kept_up"`
	KeptUpReason     string      `json:"kept_up_reason"`
	// Window is the process's resources while the measured writes ran
	// (its PeakRSSBytes: the peak of the whole run), and
	// CPUSecondsPer100k its CPU time then per 100,000 events committed;
	// WalsenderCPUSeconds its walsender's CPU time then.
	Window              ProcStats `json:"window"`
	CPUSecondsPer100k   float64   `json:"cpu_s_per_100k_events"`
	WalsenderCPUSeconds float64   `json:"walsender_cpu_s"`
	PeakRSSBytes        int64     `json:"peak_rss_bytes"`
}

// dbzSetting is one Debezium configuration of the latency runs.
type dbzSetting struct {
	name  string
	extra map[string]string
}

// debeziumSettings are Debezium at its defaults (poll.interval.ms 500) and
// with a short poll interval.
func (h *harness) debeziumSettings() []dbzSetting {
	ms := strconv.Itoa(h.o.DebeziumPollMs)
	return []dbzSetting{{name: "defaults"}, {name: "poll.interval.ms=" + ms, extra: map[string]string{"poll.interval.ms": ms}}}
}

// versusStartTimeout bounds Debezium's start: Kafka Connect, the plugin,
// the task, the slot (5-8 s on an idle machine; much longer on a busy one).
const versusStartTimeout = 3 * time.Minute

func (h *harness) versusLatency(ctx context.Context, run int, s dbzSetting) (VersusLatency, error) {
	o := h.o
	rate := o.VersusRate
	res := VersusLatency{Run: run + 1, Setting: s.name, Rate: rate}
	tag := fmt.Sprintf("vl%d_r%d", len(s.extra), run+1)
	aggType := h.name(tag)
	res.Pgoutbox.Topic, res.Debezium.Topic = "pgo."+aggType, "dbz."+aggType
	h.logf("debezium latency, run %d: Debezium with %s beside pgoutbox, %d events/s for %s", run+1, s.name, rate, o.Duration)
	for _, t := range []string{res.Pgoutbox.Topic, res.Debezium.Topic} {
		if err := h.createTopic(t, map[string]string{"message.timestamp.type": "LogAppendTime"}); err != nil {
			return res, err
		}
	}
	dbzSlot, pgoSlot := h.name(tag, "dbz"), h.name(tag, "pgo")
	defer h.dropSlot(context.WithoutCancel(ctx), dbzSlot)
	defer h.dropSlot(context.WithoutCancel(ctx), pgoSlot)
	if _, err := h.createSlots(ctx, dbzSlot, pgoSlot); err != nil {
		return res, err
	}

	// Debezium first: it takes seconds to start.
	dbzFile, err := h.writeConnector(tag+"_dbz", dbzSlot, "dbz", s.extra)
	if err != nil {
		return res, err
	}
	pgoFile, err := h.writeConnector(tag+"_pgo", pgoSlot, "pgo", nil)
	if err != nil {
		return res, err
	}
	wsDbz, wsPgo := startWalsenderSampler(h.dsn, dbzSlot), startWalsenderSampler(h.dsn, pgoSlot)
	defer wsDbz.stop()
	defer wsPgo.stop()
	dbz, err := h.startConnect(filepath.Join(h.logDir, "connect-"+tag), dbzFile, h.connectWorker())
	if err != nil {
		return res, err
	}
	defer dbz.stop(time.Minute)
	pgo, err := startRelay(o.Pgoutbox, h.relayEnv(pgoSlot), filepath.Join(h.logDir, "pgoutbox-"+tag+".log"), "--connector", pgoFile)
	if err != nil {
		return res, err
	}
	defer pgo.stop(time.Minute)
	if err := h.waitSlotActive(ctx, pgo, pgoSlot, time.Minute); err != nil {
		return res, err
	}
	res.Pgoutbox.StreamingSeconds = time.Since(pgo.started()).Seconds()
	if err := h.waitSlotActive(ctx, dbz, dbzSlot, versusStartTimeout); err != nil {
		if f := dbz.failed("bench-" + strings.ReplaceAll(tag, "_", "-") + "-dbz"); f != "" {
			err = fmt.Errorf("%w; the connector failed: %s", err, f)
		}
		return res, err
	}
	res.Debezium.StreamingSeconds = time.Since(dbz.started()).Seconds()

	settleN := int64(math.Ceil(float64(rate) * o.Settle.Seconds()))
	maxEvents := int(settleN) + int(math.Ceil(float64(rate)*o.Duration.Seconds())) + 1
	newRC := func() *receiver {
		return &receiver{commitUS: make([]int64, maxEvents), recvUS: make([]int64, maxEvents), consumeUS: make([]int64, maxEvents)}
	}
	rcPgo, rcDbz := newRC(), newRC()
	byTopic := map[string]*receiver{res.Pgoutbox.Topic: rcPgo, res.Debezium.Topic: rcDbz}
	tail := h.tail(ctx, []string{res.Pgoutbox.Topic, res.Debezium.Topic}, func(r kafkatest.Record) { byTopic[r.Topic].add(r.Value, r.Timestamp, time.Now()) })
	defer tail.close()
	pad := h.pad()
	if err := h.warmUp(ctx, []proc{pgo, dbz}, []*receiver{rcPgo, rcDbz}, outboxTable, aggType, pad, tail, versusStartTimeout); err != nil {
		return res, err
	}
	res.Pgoutbox.FirstRecordSeconds = time.Since(pgo.started()).Seconds()
	res.Debezium.FirstRecordSeconds = time.Since(dbz.started()).Seconds()

	// The writers: o.Settle at the rate, then the measured o.Duration.
	type window struct {
		pgo, dbz       ProcStats
		wsPgo, wsDbz   float64
		self           float64
		machine        machineCPU
		pgoErr, dbzErr error
	}
	mark := func() window {
		w := window{machine: readMachineCPU()}
		w.pgo, w.pgoErr = readProcStats(pgo.pid())
		w.dbz, w.dbzErr = readProcStats(dbz.pid())
		w.wsPgo, w.wsDbz = wsPgo.sample(), wsDbz.sample()
		w.self, _ = readCPUSeconds(os.Getpid())
		return w
	}
	committed := make([]bool, maxEvents)
	var m0, m1 window
	ph, err := h.writePhase(ctx, rate, outboxTable, aggType, pad, committed, settleN, func(end bool) {
		if end {
			m1 = mark()
		} else {
			m0 = mark()
		}
	})
	res.DurationSeconds, res.SettleEvents, res.Committed, res.WriteErrors, res.AchievedRate = ph.seconds, ph.settleEvents, ph.committed, ph.errors, ph.rate
	if err != nil {
		return res, err
	}
	if err := errors.Join(m0.pgoErr, m0.dbzErr, m1.pgoErr, m1.dbzErr); err != nil {
		return res, fmt.Errorf("read the processes' resources: %w", err)
	}
	res.MachineCPUBusy = m0.machine.busyUntil(m1.machine)
	res.HarnessCPUSeconds = m1.self - m0.self
	if err := h.waitReceived(ctx, []proc{pgo, dbz}, []*receiver{rcPgo, rcDbz}, ph.total, ph.end.Add(o.DrainTimeout)); err != nil {
		return res, err
	}
	pgoPeak, err := readProcStats(pgo.pid())
	if err != nil {
		return res, err
	}
	dbzPeak, err := readProcStats(dbz.pid())
	if err != nil {
		return res, err
	}
	if err := tail.close(); err != nil {
		return res, err
	}
	if err := errors.Join(pgo.stop(time.Minute), dbz.stop(time.Minute)); err != nil {
		return res, err
	}

	for _, sys := range []struct {
		out          *SystemLatency
		rc           *receiver
		w0, w1, peak ProcStats
		ws0, ws1     float64
	}{
		{&res.Pgoutbox, rcPgo, m0.pgo, m1.pgo, pgoPeak, m0.wsPgo, m1.wsPgo},
		{&res.Debezium, rcDbz, m0.dbz, m1.dbz, dbzPeak, m0.wsDbz, m1.wsDbz},
	} {
		sys.rc.mu.Lock()
		if sys.rc.decodeErr != nil {
			sys.rc.mu.Unlock()
			return res, sys.rc.decodeErr
		}
		var lr LatencyResult
		lr.summarize(latencyData{committed: committed[settleN:], commitUS: sys.rc.commitUS[settleN:], recvUS: sys.rc.recvUS[settleN:], consumeUS: sys.rc.consumeUS[settleN:],
			start: ph.start, writersEnd: ph.end, lastRecv: sys.rc.lastRecv, keepUpBound: o.KeepUpBound, drainTimeout: o.DrainTimeout})
		sys.out.Duplicates = sys.rc.dups
		sys.rc.mu.Unlock()
		sys.out.Received, sys.out.Missing = lr.Received, lr.Missing
		sys.out.LatencyMs, sys.out.ReceiveLatencyMs = lr.LatencyMs, lr.ReceiveLatencyMs
		sys.out.KeptUp, sys.out.KeptUpReason = lr.KeptUp, lr.KeptUpReason
		sys.out.Window = sys.w1.since(sys.w0)
		sys.out.PeakRSSBytes = sys.peak.PeakRSSBytes
		sys.out.WalsenderCPUSeconds = sys.ws1 - sys.ws0
		if res.Committed > 0 {
			sys.out.CPUSecondsPer100k = sys.out.Window.CPUSeconds / float64(res.Committed) * 100_000
		}
	}
	if d := res.Debezium.LatencyMs; d.P99 > 0 {
		res.P50Ratio = res.Pgoutbox.LatencyMs.P50 / d.P50
		res.P99Ratio = res.Pgoutbox.LatencyMs.P99 / d.P99
	}
	for _, x := range []struct {
		name string
		s    SystemLatency
	}{{"pgoutbox", res.Pgoutbox}, {"Debezium (" + s.name + ")", res.Debezium}} {
		q := x.s.LatencyMs
		h.logf("  %s: latency ms p50 %.1f p90 %.1f p99 %.1f p99.9 %.1f max %.1f; CPU %.2f s (%.2f s per 100k events), peak RSS %d MB, walsender CPU %.2f s; kept up: %v (%s)",
			x.name, q.P50, q.P90, q.P99, q.P999, q.Max, x.s.Window.CPUSeconds, x.s.CPUSecondsPer100k, x.s.PeakRSSBytes>>20, x.s.WalsenderCPUSeconds, x.s.KeptUp, x.s.KeptUpReason)
	}
	h.logf("  pgoutbox / Debezium: p50 %.2f, p99 %.2f; machine CPU %.0f%% busy", res.P50Ratio, res.P99Ratio, res.MachineCPUBusy*100)
	if res.Pgoutbox.Received == 0 || res.Debezium.Received == 0 {
		return res, errors.New("no event arrived")
	}
	return res, nil
}
