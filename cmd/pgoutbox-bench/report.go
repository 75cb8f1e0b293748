package main

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// Target is one of the targets, checked against the run's own
// numbers (each a ratio measured side by side within the run).
type Target struct {
	Name string `json:"name"`
	// Value is the worst case over the run's measurements, Want the
	// bound it is held to; Detail lists each measurement.
	Value  float64 `json:"value"`
	Want   string  `json:"want"`
	Met    bool    `json:"met"`
	Detail string  `json:"detail"`
}

// targets checks what the run measured against the targets.
func targets(r *Results) []Target {
	var out []Target
	if v := r.Versus; v != nil {
		for _, size := range uniqueSizes(v.Catchup) {
			worst, worstFirst := math.Inf(1), math.Inf(1)
			var each []string
			for _, c := range v.Catchup {
				if c.TxnSize != size || c.Error != "" {
					continue
				}
				worst, worstFirst = min(worst, c.SpeedupFromStart), min(worstFirst, c.SpeedupFromFirst)
				each = append(each, fmt.Sprintf("run %d: %.1fx from start, %.1fx from the first record", c.Run, c.SpeedupFromStart, c.SpeedupFromFirst))
			}
			if len(each) > 0 {
				out = append(out, Target{Name: fmt.Sprintf("catch-up, %d-event transactions: pgoutbox's events/s over Debezium's (from each process's start)", size),
					Value: worst, Want: ">= 5", Met: worst >= 5, Detail: strings.Join(each, "; ")})
			}
		}
		// The p99 target, held apart for each system alone (as a user
		// runs one) and for both at once (each with the CPU the other
		// leaves).
		for _, alone := range []bool{true, false} {
			worst, setting := 0.0, ""
			var each []string
			for _, l := range v.Latency {
				if l.Error != "" || l.Alone != alone || !strings.HasPrefix(l.Setting, "poll.interval.ms=") {
					continue
				}
				worst, setting = max(worst, l.P99Ratio), l.Setting
				each = append(each, fmt.Sprintf("run %d: p99 %.1f ms vs %.1f ms", l.Run, l.Pgoutbox.LatencyMs.P99, l.Debezium.LatencyMs.P99))
			}
			how := ", both running at once"
			if alone {
				how = ", each running alone"
			}
			if len(each) > 0 {
				out = append(out, Target{Name: "latency at " + thousands(int64(v.Latency[0].Rate)) + " events/s: pgoutbox's p99 over Debezium's with " + setting + how,
					Value: worst, Want: "<= 0.2", Met: worst <= 0.2, Detail: strings.Join(each, "; ")})
			}
		}
		rss := math.Inf(1)
		var each []string
		for _, c := range v.Catchup {
			if c.Error == "" {
				rss = min(rss, c.RSSRatio)
				each = append(each, fmt.Sprintf("catch-up run %d, %d-event transactions: %s MB vs %s MB", c.Run, c.TxnSize, mb(c.Debezium.PeakRSSBytes), mb(c.Pgoutbox.PeakRSSBytes)))
			}
		}
		if len(each) > 0 {
			out = append(out, Target{Name: "peak RSS in the catch-up: Debezium's (the Connect JVM) over pgoutbox's", Value: rss, Want: ">= 20", Met: rss >= 20, Detail: strings.Join(each, "; ")})
		}
		rss, each = math.Inf(1), nil
		for _, l := range v.Latency {
			if l.Error == "" && l.Pgoutbox.PeakRSSBytes > 0 {
				rss = min(rss, float64(l.Debezium.PeakRSSBytes)/float64(l.Pgoutbox.PeakRSSBytes))
				each = append(each, fmt.Sprintf("run %d, %s: %s MB vs %s MB (at the end of the writes, anonymous %s vs %s MB, mapped files %s vs %s MB)", l.Run, l.Setting,
					mb(l.Debezium.PeakRSSBytes), mb(l.Pgoutbox.PeakRSSBytes), mb(l.Debezium.Window.RSSAnonBytes), mb(l.Pgoutbox.Window.RSSAnonBytes), mb(l.Debezium.Window.RSSFileBytes), mb(l.Pgoutbox.Window.RSSFileBytes)))
			}
		}
		if len(each) > 0 {
			out = append(out, Target{Name: "peak RSS at " + thousands(int64(v.Latency[0].Rate)) + " events/s: Debezium's over pgoutbox's", Value: rss, Want: ">= 20", Met: rss >= 20, Detail: strings.Join(each, "; ")})
		}
	}
	// The walsender's busy share during pgoutbox's drains, per shape.
	busy := map[int][]string{}
	worstBusy := map[int]float64{}
	note := func(size int, what string, r ReaderResult) {
		if _, ok := worstBusy[size]; !ok {
			worstBusy[size] = math.Inf(1)
		}
		worstBusy[size] = min(worstBusy[size], r.WalsenderBusy)
		busy[size] = append(busy[size], fmt.Sprintf("%s: %.2f s of CPU in %.2f s, %.0f%% (%.0f%% waiting for a CPU)", what, r.WalsenderCPUSeconds, r.WalsenderSeconds, r.WalsenderBusy*100, r.WalsenderRunQueue*100))
	}
	for _, c := range r.Catchup {
		if c.Error == "" {
			note(c.TxnSize, "catch-up", c.Pgoutbox)
		}
	}
	if v := r.Versus; v != nil {
		for _, c := range v.Catchup {
			if c.Error == "" {
				note(c.TxnSize, fmt.Sprintf("beside Debezium, run %d", c.Run), c.Pgoutbox)
			}
		}
	}
	sizes := make([]int, 0, len(busy))
	for s := range busy {
		sizes = append(sizes, s)
	}
	slices.Sort(sizes)
	for _, s := range sizes {
		out = append(out, Target{Name: fmt.Sprintf("walsender busy during pgoutbox's drain, %d-event transactions", s),
			Value: worstBusy[s], Want: ">= 0.9", Met: worstBusy[s] >= 0.9, Detail: strings.Join(busy[s], "; ")})
	}
	// CPU per 100,000 events at 1,000 events/s (the default, at-least-once
	// mode: exactly-once's runs are reported beside it, not held to this).
	worst := 0.0
	var each []string
	for _, l := range r.Latency {
		if l.TargetRate == 1000 && l.Error == "" && l.WindowCPUSecondsPer100k > 0 && l.Mode != "exactly-once" {
			worst = max(worst, l.WindowCPUSecondsPer100k)
			each = append(each, fmt.Sprintf("alone: %.1f s", l.WindowCPUSecondsPer100k))
		}
	}
	if v := r.Versus; v != nil {
		for _, l := range v.Latency {
			if l.Rate == 1000 && l.Error == "" {
				worst = max(worst, l.Pgoutbox.CPUSecondsPer100k)
				how := "beside Debezium"
				if l.Alone {
					how = "alone, in the Debezium scenario"
				}
				each = append(each, fmt.Sprintf("%s (%s), run %d: %.1f s (Debezium %.1f s)", how, l.Setting, l.Run, l.Pgoutbox.CPUSecondsPer100k, l.Debezium.CPUSecondsPer100k))
			}
		}
	}
	if len(each) > 0 {
		out = append(out, Target{Name: "pgoutbox's CPU seconds per 100,000 events at 1,000 events/s (while the measured writes ran)",
			Value: worst, Want: "<= 8", Met: worst <= 8, Detail: strings.Join(each, "; ")})
	}
	return out
}

func uniqueSizes(cs []VersusCatchup) []int {
	var out []int
	for _, c := range cs {
		if !slices.Contains(out, c.TxnSize) {
			out = append(out, c.TxnSize)
		}
	}
	return out
}

// walsenderCell is the walsender's CPU seconds, busy share and run-queue
// share.
func walsenderCell(r ReaderResult) string {
	return fmt.Sprintf("%s (%.0f%%, %.0f%%)", f2(r.WalsenderCPUSeconds), r.WalsenderBusy*100, r.WalsenderRunQueue*100)
}

// confirmedCell says when a reader's slot was confirmed after its last
// record.
func confirmedCell(r ReaderResult) string {
	switch {
	case r.ConfirmedAfterLastSeconds >= 0:
		return f2(r.ConfirmedAfterLastSeconds)
	case r.ConfirmedLSN == "":
		return "–"
	default:
		return fmt.Sprintf("never: stopped %s bytes short at %s s", thousands(r.ConfirmedShortBytes), f1(r.ConfirmSettledSeconds))
	}
}

func summaryVersus(p func(string, ...any), v *VersusResult) {
	p("\n## pgoutbox vs Debezium\n\n")
	p("Debezium %s on Kafka Connect %s standalone (JVM `%s`), the common Connect setup: String keys, JsonConverter values without schemas, the outbox EventRouter; pgoutbox runs the same connector JSON (`pgoutbox run --connector`). Each reader has its own slot, copied from one slot at one LSN; the readers of one backlog run one after another in the order shown, reversed in the next run.\n\n",
		orDash(v.Debezium), orDash(v.KafkaConnect), strings.Join(v.ConnectJVM, " "))
	if len(v.Catchup) > 0 {
		p("### Catch-up\n\nSeconds from starting the process until Kafka has every record (pg_recvlogical: until it exits at the end LSN); the first record's time in parentheses.\n\n")
		p("| run | events per txn | order | pg_recvlogical s | Debezium s | pgoutbox s | pgoutbox / Debezium, from start | from the first record | pgoutbox / pg_recvlogical |\n")
		p("|---:|---:|---|---:|---:|---:|---:|---:|---:|\n")
		for _, c := range v.Catchup {
			if c.Error != "" {
				p("| %d | %d | failed: %s |||||||\n", c.Run, c.TxnSize, oneLine(c.Error))
				continue
			}
			p("| %d | %d | %s | %s | %s (%s) | %s (%s) | %.1fx | %.1fx | %.2fx |\n", c.Run, c.TxnSize, strings.Join(c.Order, ", "),
				f2(c.PGRecvlogical.WallSeconds), f2(c.Debezium.WallSeconds), f2(c.Debezium.FirstRecordSeconds),
				f2(c.Pgoutbox.WallSeconds), f2(c.Pgoutbox.FirstRecordSeconds), c.SpeedupFromStart, c.SpeedupFromFirst, c.PgoutboxToRecvlogc)
		}
		p("\nResources of each drain: CPU seconds of the process (Debezium's: the Connect JVM, its start-up CPU before the first record in parentheses), peak RSS, the walsender's CPU seconds and busy share, the broker's CPU seconds, and how long after the last record the slot's confirmed_flush_lsn reached the end of the last transaction (if it did not within the wait: how far short it stopped, and when it last moved).\n\n")
		p("| run | events per txn | CPU s: Debezium / pgoutbox / pg_recvlogical | peak RSS MB: Debezium / pgoutbox | walsender CPU s (busy, waiting for a CPU): pg_recvlogical / Debezium / pgoutbox | broker CPU s: Debezium / pgoutbox | confirmed after the last record, s: Debezium / pgoutbox / pg_recvlogical | machine busy |\n")
		p("|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, c := range v.Catchup {
			if c.Error != "" {
				continue
			}
			p("| %d | %d | %s (%s) / %s / %s | %s / %s | %s / %s / %s | %s / %s | %s / %s / %s | %.0f%% / %.0f%% |\n", c.Run, c.TxnSize,
				f2(c.Debezium.CPUSeconds), f2(c.Debezium.FirstRecordCPUSeconds), f2(c.Pgoutbox.CPUSeconds), f2(c.PGRecvlogical.CPUSeconds),
				mb(c.Debezium.PeakRSSBytes), mb(c.Pgoutbox.PeakRSSBytes),
				walsenderCell(c.PGRecvlogical), walsenderCell(c.Debezium), walsenderCell(c.Pgoutbox),
				f2(c.Debezium.BrokerCPUSeconds), f2(c.Pgoutbox.BrokerCPUSeconds),
				confirmedCell(c.Debezium), confirmedCell(c.Pgoutbox), confirmedCell(c.PGRecvlogical),
				c.Debezium.MachineBusy*100, c.Pgoutbox.MachineBusy*100)
		}
	}
	var lastTxn []string
	for _, c := range v.Catchup {
		if c.Error == "" {
			lastTxn = append(lastTxn, fmt.Sprintf("run %d, %d-event transactions: %s bytes", c.Run, c.TxnSize, thousands(c.LastTxnBytes)))
		}
	}
	if len(lastTxn) > 0 {
		p("\nThe last transaction of each backlog, for the slots that stop short: %s.\n", strings.Join(lastTxn, "; "))
	}
	if len(v.Latency) > 0 {
		p("\n### Latency beside each other\n\nAt once: pgoutbox and Debezium run together, each from its own slot, on the same single-event transactions. Alone: each runs by itself, one after the other in the order given, on the same writers at the same rate. Commit → Kafka append (LogAppendTime topics), ms. CPU seconds are the process's while the measured writes ran, per 100,000 events; events and machine busy are pgoutbox's / Debezium's where they ran apart.\n\n")
		p("| run | Debezium | how | events | pgoutbox p50 / p99 / p99.9 / max | Debezium p50 / p99 / p99.9 / max | p99 pgoutbox / Debezium | CPU s per 100k: pgoutbox / Debezium | peak RSS MB: pgoutbox / Debezium | machine busy |\n")
		p("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, l := range v.Latency {
			how := l.how()
			if l.Alone {
				how += ": " + strings.Join(l.Order, ", then ")
			}
			if l.Error != "" && (l.Pgoutbox.Received == 0 || l.Debezium.Received == 0) {
				p("| %d | %s | %s | failed: %s |||||||\n", l.Run, l.Setting, how, oneLine(l.Error))
				continue
			}
			q := func(x Percentiles) string {
				return fmt.Sprintf("%s / %s / %s / %s", f1(x.P50), f1(x.P99), f1(x.P999), f1(x.Max))
			}
			events, busy := thousands(l.Committed), fmt.Sprintf("%.0f%%", l.MachineCPUBusy*100)
			if l.Alone {
				pgo, dbz := l.phase(&l.Pgoutbox), l.phase(&l.Debezium)
				events = thousands(pgo.Committed) + " / " + thousands(dbz.Committed)
				busy = fmt.Sprintf("%.0f%% / %.0f%%", pgo.MachineCPUBusy*100, dbz.MachineCPUBusy*100)
			}
			p("| %d | %s | %s | %s | %s | %s | %.2f | %s / %s | %s / %s | %s |\n", l.Run, l.Setting, how, events,
				q(l.Pgoutbox.LatencyMs), q(l.Debezium.LatencyMs), l.P99Ratio,
				f1(l.Pgoutbox.CPUSecondsPer100k), f1(l.Debezium.CPUSecondsPer100k), mb(l.Pgoutbox.PeakRSSBytes), mb(l.Debezium.PeakRSSBytes), busy)
		}
		for _, l := range v.Latency {
			p("\n- run %d, %s, %s: pgoutbox %s; Debezium %s%s", l.Run, l.Setting, l.how(), l.Pgoutbox.KeptUpReason, l.Debezium.KeptUpReason, errorNote(l.Error))
		}
		p("\n")
	}
}

func summaryScaling(p func(string, ...any), s *ScalingResult) {
	p("\n## Scaling\n\nCatch-up of a backlog by pgoutbox (and by pg_recvlogical, from a copy of the same slot: the decoding limit) as one dimension changes; the others stay at payload %d B, %d-event transactions, 1 topic (the topic dimension: %d-event transactions). Payloads are padded with random letters and digits, which TOAST cannot compress; at most %s MB of payload per point.\n\n",
		s.BasePayloadBytes, s.BaseTxnSize, s.TopicsTxnSize, mb(s.MaxPayloadBytes))
	p("| dimension | payload B | events per txn | topics | events | WAL MB | pg_recvlogical events/s | pgoutbox events/s | pgoutbox payload MB/s | pgoutbox / pg_recvlogical | pgoutbox peak RSS MB | pgoutbox CPU s | walsender busy |\n")
	p("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, x := range s.Points {
		if x.Error != "" {
			p("| %s | %d | %d | %d | %s | failed: %s ||||||||\n", x.Dimension, x.PayloadBytes, x.TxnSize, x.Topics, thousands(int64(x.Events)), oneLine(x.Error))
			continue
		}
		p("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %.2f | %s | %s | %.0f%% |\n", x.Dimension, thousands(int64(x.PayloadBytes)), thousands(int64(x.TxnSize)),
			thousands(int64(x.Topics)), thousands(int64(x.Events)), mb(x.WALBytes), thousands(int64(x.PGRecvlogical.EventsPerSec)),
			thousands(int64(x.Pgoutbox.EventsPerSec)), f1(x.PayloadMBPerSec), x.Ratio, mb(x.Pgoutbox.PeakRSSBytes), f2(x.Pgoutbox.CPUSeconds), x.Pgoutbox.WalsenderBusy*100)
	}
}

func summaryWriters(p func(string, ...any), w *WritersResult) {
	p("\n## Writers\n\n%d clients, each committing transactions back to back for %s s per mode (after %s s not counted), no relay reading; payload padded with %d bytes. Interactive: BEGIN, the business INSERT, pkg/outbox's Writer, COMMIT, each a round trip; pipelined: the same statements in one round trip. Modes alternate in order from one run to the next.\n\n",
		w.Clients, f0(w.DurationSeconds), f1(w.WarmupSeconds), w.PayloadBytes)
	p("| fsync | variant | run | mode | transactions/s | vs business alone | p50 / p99 ms | WAL bytes per txn | backend CPU µs per txn | machine busy |\n")
	p("|---|---|---:|---|---:|---:|---:|---:|---:|---:|\n")
	for _, x := range w.Points {
		p("| %s | %s | %d | %s | %s | %.2f | %s / %s | %s | %s | %.0f%% |\n", x.Fsync, x.Variant, x.Run, x.Mode, thousands(int64(x.TPS)), x.VsBusiness,
			f2(x.LatencyMs.P50), f2(x.LatencyMs.P99), f0(x.WALBytesPerTxn), f0(x.BackendCPUMicros), x.MachineCPUBusy*100)
	}
	// Mean over runs of each mode's share of the business insert's rate.
	type key struct{ fsync, variant, mode string }
	sum, cnt := map[key]float64{}, map[key]int{}
	var order []key
	for _, x := range w.Points {
		k := key{x.Fsync, x.Variant, x.Mode}
		if _, ok := cnt[k]; !ok {
			order = append(order, k)
		}
		sum[k] += x.VsBusiness
		cnt[k]++
	}
	p("\nMean over the runs, transactions/s against the business insert alone:\n\n")
	for _, k := range order {
		if k.mode != writerBusiness {
			p("- fsync=%s, %s, %s: %+.0f%%\n", k.fsync, k.variant, k.mode, (sum[k]/float64(cnt[k])-1)*100)
		}
	}
}

func summaryTargets(p func(string, ...any), ts []Target) {
	if len(ts) == 0 {
		return
	}
	p("\n## Targets\n\n| target | worst in this run | want | met | measurements |\n|---|---:|---|:---:|---|\n")
	for _, t := range ts {
		met := "yes"
		if !t.Met {
			met = "**no**"
		}
		p("| %s | %.2f | %s | %s | %s |\n", t.Name, t.Value, t.Want, met, t.Detail)
	}
}
