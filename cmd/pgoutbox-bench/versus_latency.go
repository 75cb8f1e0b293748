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

// VersusLatency is one latency run beside Debezium (with Setting). Run at
// once (Alone false), pgoutbox and Debezium each stream from its own slot
// copied at one LSN, and the same single-event transactions at Rate go
// through both: both see the same events on the same machine at the same
// time, and each has the CPU the other leaves. Alone, each runs by itself
// (in alternating order), as a user runs one of them: the same writers at
// the same rate, one after the other, each from a slot of its own; the
// run's phase fields are then those of each system (SystemLatency.Phase).
type VersusLatency struct {
	Run     int    `json:"run"`
	Setting string `json:"debezium_setting"`
	Rate    int    `json:"target_rate"`
	Alone   bool   `json:"alone"`
	// Order is the order the systems ran in, alone.
	Order []string `json:"order,omitempty"`
	// LatencyPhase is the measured writing, at once (alone: zero, and
	// each system's Phase).
	LatencyPhase

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
	// Phase is the writing this system's numbers come from, when it ran
	// alone (at once, the run's own fields).
	Phase *LatencyPhase `json:"phase,omitempty"`
}

// LatencyPhase is one measured writing of a latency run.
type LatencyPhase struct {
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
}

// phase is the writing the system's numbers come from: its own when it
// ran alone, otherwise the run's.
func (l *VersusLatency) phase(s *SystemLatency) LatencyPhase {
	if s.Phase != nil {
		return *s.Phase
	}
	return l.LatencyPhase
}

// how says how the systems ran: "at once" or "alone".
func (l *VersusLatency) how() string {
	if l.Alone {
		return "alone"
	}
	return "at once"
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

// latencyProc is a process a latency run starts: pgoutbox or Kafka
// Connect.
type latencyProc interface {
	proc
	stop(timeout time.Duration) error
}

// versusSystem is one system of a latency run.
type versusSystem struct {
	label string // in the log
	out   *SystemLatency
	slot  string
	// start starts the process on slot; within bounds the wait for its
	// walsender; failed says why it did not stream, when it can.
	start  func() (latencyProc, error)
	within time.Duration
	failed func(latencyProc) string
}

func (h *harness) versusLatency(ctx context.Context, run int, s dbzSetting, alone bool) (VersusLatency, error) {
	o := h.o
	rate := o.VersusRate
	res := VersusLatency{Run: run + 1, Setting: s.name, Rate: rate, Alone: alone}
	tag := fmt.Sprintf("vl%d_r%d", len(s.extra), run+1)
	if alone {
		tag += "a"
	}
	aggType := h.name(tag)
	res.Pgoutbox.Topic, res.Debezium.Topic = "pgo."+aggType, "dbz."+aggType
	for _, t := range []string{res.Pgoutbox.Topic, res.Debezium.Topic} {
		if err := h.createTopic(t, map[string]string{"message.timestamp.type": "LogAppendTime"}); err != nil {
			return res, err
		}
	}
	dbzSlot, pgoSlot := h.name(tag, "dbz"), h.name(tag, "pgo")
	dbzFile, err := h.writeConnector(tag+"_dbz", dbzSlot, "dbz", s.extra)
	if err != nil {
		return res, err
	}
	pgoFile, err := h.writeConnector(tag+"_pgo", pgoSlot, "pgo", nil)
	if err != nil {
		return res, err
	}
	pgo := &versusSystem{label: readerPgoutbox, out: &res.Pgoutbox, slot: pgoSlot, within: time.Minute,
		start: func() (latencyProc, error) {
			return startRelay(o.Pgoutbox, h.relayEnv(pgoSlot), filepath.Join(h.logDir, "pgoutbox-"+tag+".log"), "--connector", pgoFile)
		}}
	dbz := &versusSystem{label: "Debezium (" + s.name + ")", out: &res.Debezium, slot: dbzSlot, within: versusStartTimeout,
		start: func() (latencyProc, error) {
			return h.startConnect(filepath.Join(h.logDir, "connect-"+tag), dbzFile, h.connectWorker())
		},
		failed: func(p latencyProc) string {
			return p.(*connectProc).failed("bench-" + strings.ReplaceAll(tag, "_", "-") + "-dbz")
		}}

	if !alone {
		h.logf("debezium latency, run %d: Debezium with %s beside pgoutbox, %d events/s for %s", run+1, s.name, rate, o.Duration)
		// Debezium first: it takes seconds to start.
		ph, err := h.latencyPhase(ctx, rate, aggType, dbz, pgo)
		res.LatencyPhase = ph
		if err != nil {
			return res, err
		}
	} else {
		order := []*versusSystem{pgo, dbz}
		if run%2 == 1 {
			order[0], order[1] = order[1], order[0]
		}
		for _, sys := range order {
			res.Order = append(res.Order, sys.label)
		}
		h.logf("debezium latency, run %d: pgoutbox and Debezium with %s each alone (%s), %d events/s for %s each", run+1, s.name, strings.Join(res.Order, ", then "), rate, o.Duration)
		for _, sys := range order {
			ph, err := h.latencyPhase(ctx, rate, aggType, sys)
			sys.out.Phase = &ph
			if err != nil {
				return res, fmt.Errorf("%s alone: %w", sys.label, err)
			}
		}
	}

	if d := res.Debezium.LatencyMs; d.P99 > 0 {
		res.P50Ratio = res.Pgoutbox.LatencyMs.P50 / d.P50
		res.P99Ratio = res.Pgoutbox.LatencyMs.P99 / d.P99
	}
	h.logf("  pgoutbox / Debezium: p50 %.2f, p99 %.2f", res.P50Ratio, res.P99Ratio)
	if res.Pgoutbox.Received == 0 || res.Debezium.Received == 0 {
		return res, errors.New("no event arrived")
	}
	return res, nil
}

// latencyPhase creates the systems' slots at one LSN, starts them in the
// order given, writes single-event transactions at rate through them
// (o.Settle not counted, then o.Duration), waits for the events, stops the
// systems, drops the slots and fills in each system's out.
func (h *harness) latencyPhase(ctx context.Context, rate int, aggType string, systems ...*versusSystem) (LatencyPhase, error) {
	o := h.o
	var lp LatencyPhase
	slots := make([]string, len(systems))
	for i, sys := range systems {
		slots[i] = sys.slot
		defer h.dropSlot(context.WithoutCancel(ctx), sys.slot)
	}
	if _, err := h.createSlots(ctx, slots...); err != nil {
		return lp, err
	}
	samplers := make([]*walsenderSampler, len(systems))
	for i, sys := range systems {
		samplers[i] = startWalsenderSampler(h.dsn, sys.slot)
		defer samplers[i].stop()
	}
	// procs are the systems' processes; watched holds the same, as the
	// procs that warmUp and waitReceived take.
	procs, watched := make([]latencyProc, len(systems)), make([]proc, len(systems))
	for i, sys := range systems {
		p, err := sys.start()
		if err != nil {
			return lp, err
		}
		defer p.stop(time.Minute)
		procs[i], watched[i] = p, p
	}
	for i, sys := range systems {
		p := procs[i]
		if err := h.waitSlotActive(ctx, p, sys.slot, sys.within); err != nil {
			if sys.failed != nil {
				if f := sys.failed(p); f != "" {
					err = fmt.Errorf("%w; the connector failed: %s", err, f)
				}
			}
			return lp, err
		}
		sys.out.StreamingSeconds = time.Since(p.started()).Seconds()
	}

	settleN := int64(math.Ceil(float64(rate) * o.Settle.Seconds()))
	maxEvents := int(settleN) + int(math.Ceil(float64(rate)*o.Duration.Seconds())) + 1
	rcs := make([]*receiver, len(systems))
	byTopic := map[string]*receiver{}
	var topics []string
	for i, sys := range systems {
		rcs[i] = &receiver{commitUS: make([]int64, maxEvents), recvUS: make([]int64, maxEvents), consumeUS: make([]int64, maxEvents)}
		byTopic[sys.out.Topic] = rcs[i]
		topics = append(topics, sys.out.Topic)
	}
	tail := h.tail(ctx, topics, func(r kafkatest.Record) { byTopic[r.Topic].add(r.Value, r.Timestamp, time.Now()) })
	defer tail.close()
	pad := h.pad()
	if err := h.warmUp(ctx, watched, rcs, outboxTable, aggType, pad, tail, versusStartTimeout); err != nil {
		return lp, err
	}
	for i, sys := range systems {
		sys.out.FirstRecordSeconds = time.Since(procs[i].started()).Seconds()
	}

	// The writers: o.Settle at the rate, then the measured o.Duration.
	type window struct {
		ps      []ProcStats
		ws      []float64
		self    float64
		machine machineCPU
		err     error
	}
	mark := func() window {
		w := window{machine: readMachineCPU(), ps: make([]ProcStats, len(systems)), ws: make([]float64, len(systems))}
		for i := range systems {
			var err error
			w.ps[i], err = readProcStats(procs[i].pid())
			w.err = errors.Join(w.err, err)
			w.ws[i] = samplers[i].sample()
		}
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
	lp.DurationSeconds, lp.SettleEvents, lp.Committed, lp.WriteErrors, lp.AchievedRate = ph.seconds, ph.settleEvents, ph.committed, ph.errors, ph.rate
	if err != nil {
		return lp, err
	}
	if err := errors.Join(m0.err, m1.err); err != nil {
		return lp, fmt.Errorf("read the processes' resources: %w", err)
	}
	lp.MachineCPUBusy = m0.machine.busyUntil(m1.machine)
	lp.HarnessCPUSeconds = m1.self - m0.self
	if err := h.waitReceived(ctx, watched, rcs, ph.total, ph.end.Add(o.DrainTimeout)); err != nil {
		return lp, err
	}
	peaks := make([]ProcStats, len(systems))
	for i := range systems {
		if peaks[i], err = readProcStats(procs[i].pid()); err != nil {
			return lp, err
		}
	}
	if err := tail.close(); err != nil {
		return lp, err
	}
	var stopErr error
	for _, p := range procs {
		err := p.stop(time.Minute)
		if _, connect := p.(*connectProc); connect && err != nil {
			// Every record arrived and the resources were read: a Kafka
			// Connect worker slow to stop (it was seen to take over a
			// minute after SIGTERM, then killed) does not void that.
			h.logf("  %v; its measurement above is complete", err)
			continue
		}
		stopErr = errors.Join(stopErr, err)
	}
	if stopErr != nil {
		return lp, stopErr
	}

	for i, sys := range systems {
		rc, out := rcs[i], sys.out
		rc.mu.Lock()
		if rc.decodeErr != nil {
			rc.mu.Unlock()
			return lp, rc.decodeErr
		}
		var lr LatencyResult
		lr.summarize(latencyData{committed: committed[settleN:], commitUS: rc.commitUS[settleN:], recvUS: rc.recvUS[settleN:], consumeUS: rc.consumeUS[settleN:],
			start: ph.start, writersEnd: ph.end, lastRecv: rc.lastRecv, keepUpBound: o.KeepUpBound, drainTimeout: o.DrainTimeout})
		out.Duplicates = rc.dups
		rc.mu.Unlock()
		out.Received, out.Missing = lr.Received, lr.Missing
		out.LatencyMs, out.ReceiveLatencyMs = lr.LatencyMs, lr.ReceiveLatencyMs
		out.KeptUp, out.KeptUpReason = lr.KeptUp, lr.KeptUpReason
		out.Window = m1.ps[i].since(m0.ps[i])
		out.PeakRSSBytes = peaks[i].PeakRSSBytes
		out.WalsenderCPUSeconds = m1.ws[i] - m0.ws[i]
		if lp.Committed > 0 {
			out.CPUSecondsPer100k = out.Window.CPUSeconds / float64(lp.Committed) * 100_000
		}
		q := out.LatencyMs
		h.logf("  %s: latency ms p50 %.1f p90 %.1f p99 %.1f p99.9 %.1f max %.1f; CPU %.2f s (%.2f s per 100k events), peak RSS %d MB (%s), walsender CPU %.2f s; kept up: %v (%s); machine CPU %.0f%% busy",
			sys.label, q.P50, q.P90, q.P99, q.P999, q.Max, out.Window.CPUSeconds, out.CPUSecondsPer100k, out.PeakRSSBytes>>20, rssSplit(out.Window), out.WalsenderCPUSeconds, out.KeptUp, out.KeptUpReason, lp.MachineCPUBusy*100)
	}
	return lp, nil
}
