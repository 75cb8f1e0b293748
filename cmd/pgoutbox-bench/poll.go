package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/migrations"
	"github.com/pgoutbox/pgoutbox/pkg/kafka/kafkatest"
	"github.com/pgoutbox/pgoutbox/poll"
)

// The poll source beside the WAL source, in the same run: catch-up of a
// backlog with one and with several instances, latency at fixed rates
// with and without notifications, and what the notification trigger costs
// the writers.

// pollTable is the poll source's table in the run's database, made by the
// poll source's migration.
const pollTable = "public.outbox_poll"

// pollChannel is its notification channel.
const pollChannel = "pgoutbox.public.outbox_poll"

// PollCatchupResult is one catch-up of the poll source: Events unpublished
// rows, published by Instances relays at once.
type PollCatchupResult struct {
	Instances        int     `json:"instances"`
	Events           int     `json:"events"`
	Topic            string  `json:"topic"`
	PrepSeconds      float64 `json:"prep_s"`
	PrepEventsPerSec float64 `json:"prep_events_per_s"`
	// WallSeconds runs from starting the relays until Kafka has every
	// record (the topic's high-water marks add up to Events);
	// PublishedSeconds until every row is marked published as well.
	WallSeconds        float64 `json:"wall_s"`
	EventsPerSec       float64 `json:"events_per_s"`
	FirstRecordSeconds float64 `json:"first_record_s"`
	PublishedSeconds   float64 `json:"published_s"`
	RecordsInKafka     int64   `json:"records_in_kafka"`
	// The relays' resources: CPU summed, peak RSS the largest.
	CPUSeconds   float64 `json:"cpu_s"`
	PeakRSSBytes int64   `json:"peak_rss_bytes"`
	Error        string  `json:"error,omitempty"`
}

// TriggerCostResult is what the notification trigger costs the writers:
// single-row transactions per second, as fast as Writers connections go,
// with and without it (alternating rounds of DurationSeconds each; the
// medians).
type TriggerCostResult struct {
	Writers          int       `json:"writers"`
	DurationSeconds  float64   `json:"round_s"`
	WithoutTxPerSec  float64   `json:"without_trigger_tx_per_s"`
	WithTxPerSec     float64   `json:"with_trigger_tx_per_s"`
	CostPct          float64   `json:"cost_pct"`
	WithoutRounds    []float64 `json:"without_trigger_rounds"`
	WithRounds       []float64 `json:"with_trigger_rounds"`
	ListenerReceived int64     `json:"notifications_received"`
	Error            string    `json:"error,omitempty"`
}

// setupPoll creates (or completes) the poll table, with the trigger when
// notify.
func (h *harness) setupPoll(ctx context.Context, notify bool) error {
	p := migrations.PollParams{Table: pollTable, Notify: notify, Channel: pollChannel}
	if err := migrations.ApplyPoll(ctx, h.admin, p); err != nil {
		return fmt.Errorf("poll table: %w", err)
	}
	return nil
}

// pollVariant is how a poll relay is woken: by notifications, or by
// poll.interval alone (0: the default, 500 ms).
type pollVariant struct {
	notify   bool
	interval time.Duration
}

// label names the variant in the results: poll+notify, poll, poll 50ms.
func (v pollVariant) label() string {
	switch {
	case v.notify:
		return "poll+notify"
	case v.interval > 0:
		return "poll " + v.interval.String()
	}
	return "poll"
}

// pollVariants are the latency runs' variants: the default (notifications),
// without them at the default interval, and without them at a short one.
var pollVariants = []pollVariant{{notify: true}, {}, {interval: 50 * time.Millisecond}}

// pollEnv is the environment of a pgoutbox process on the poll source.
func (h *harness) pollEnv(v pollVariant) func(slot string) []string {
	return func(slot string) []string {
		extra := []string{"PGOUTBOX_RELAY_SOURCE=poll", "PGOUTBOX_POSTGRES_TABLE_INCLUDE_LIST=" + pollTable,
			"PGOUTBOX_POLL_NOTIFY=" + strconv.FormatBool(v.notify), "PGOUTBOX_POLL_NOTIFY_CHANNEL=" + pollChannel}
		if v.interval > 0 {
			extra = append(extra, "PGOUTBOX_POLL_INTERVAL="+v.interval.String())
		}
		return h.relayEnv(slot, extra...)
	}
}

// pollSource is the poll source for a latency run.
func (h *harness) pollSource(v pollVariant) latencySource {
	tag := "poll"
	switch {
	case v.notify:
		tag = "pollnotify"
	case v.interval > 0:
		tag = "pollfast"
	}
	return latencySource{tag: tag, table: pollTable, env: h.pollEnv(v),
		ready: func(ctx context.Context, p *relayProc, _ string) error { return h.waitPollOwners(ctx, []*relayProc{p}) }}
}

// waitPollOwners waits until the relays own every bucket of the poll
// table between them.
func (h *harness) waitPollOwners(ctx context.Context, procs []*relayProc) error {
	deadline := time.Now().Add(time.Minute)
	for {
		ms, err := poll.Members(ctx, h.admin, pollTable)
		if err != nil {
			return err
		}
		owned := 0
		for _, m := range ms {
			owned += m.Owned
		}
		if len(ms) == len(procs) && owned == poll.DefaultConfig().Buckets {
			return nil
		}
		for _, p := range procs {
			if err := p.exited(); err != nil {
				return err
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%d poll relays own %d buckets after a minute, want %d and %d", len(ms), owned, len(procs), poll.DefaultConfig().Buckets)
		}
		time.Sleep(pollInterval)
	}
}

// runPoll runs the poll scenarios into res.
func (h *harness) runPoll(ctx context.Context, res *Results, record func(string, error)) {
	o := h.o
	if err := h.setupPoll(ctx, true); err != nil {
		record("poll source", err)
		return
	}
	for _, n := range o.PollInstances {
		if ctx.Err() != nil {
			return
		}
		r, err := h.pollCatchup(ctx, n)
		if err != nil {
			r.Error = err.Error()
		}
		res.PollCatchup = append(res.PollCatchup, r)
		record(fmt.Sprintf("poll catch-up, %d instances", n), err)
	}
	for _, v := range pollVariants {
		// Without notifications the trigger is dropped too: what a
		// deployment that turned them off runs.
		if err := h.setupPoll(ctx, v.notify); err != nil {
			record("poll source", err)
			return
		}
		for _, rate := range o.PollRates {
			if ctx.Err() != nil {
				return
			}
			r, err := h.latency(ctx, rate, h.pollSource(v))
			r.Source = v.label()
			if err != nil {
				r.Error = err.Error()
			}
			res.PollLatency = append(res.PollLatency, r)
			record(fmt.Sprintf("poll latency at %d events/s (%s)", rate, v.label()), err)
		}
	}
	if ctx.Err() == nil {
		r, err := h.triggerCost(ctx)
		if err != nil {
			r.Error = err.Error()
		}
		res.TriggerCost = &r
		record("trigger cost", err)
	}
	_ = h.setupPoll(ctx, true)
}

func (h *harness) pollCatchup(ctx context.Context, instances int) (PollCatchupResult, error) {
	o := h.o
	n := o.Events
	r := PollCatchupResult{Instances: instances, Events: n}
	tag := fmt.Sprintf("pcu%d", instances)
	aggType := h.name(tag)
	r.Topic = "outbox.event." + aggType
	h.logf("poll catch-up, %d instances: %d unpublished rows", instances, n)
	if err := h.createTopic(r.Topic, nil); err != nil {
		return r, err
	}
	if _, err := h.admin.Exec(ctx, "SET "+migrations.DeleteUnpublished+" = on; TRUNCATE "+pollTable); err != nil {
		return r, err
	}
	t0 := time.Now()
	// The same padding as the WAL source's catch-up, in transactions of 100.
	spec := backlogSpec{table: pollTable, aggType: aggType, size: 100, events: n, pad: h.pad()}
	if err := h.writeTxns(ctx, spec, 0, (n+spec.size-1)/spec.size, o.PrepWriters); err != nil {
		return r, err
	}
	r.PrepSeconds = time.Since(t0).Seconds()
	r.PrepEventsPerSec = float64(n) / r.PrepSeconds
	if _, err := h.admin.Exec(ctx, "VACUUM ANALYZE "+pollTable); err != nil {
		return r, err
	}
	watcher, err := kafkatest.NewOffsetWatcher(h.kcfg)
	if err != nil {
		return r, err
	}
	defer watcher.Close()
	if _, err := watcher.Total(r.Topic); err != nil {
		return r, err
	}
	var procs []*relayProc
	defer func() {
		for _, p := range procs {
			_ = p.stop(time.Minute) // on the error paths
		}
	}()
	start := time.Now()
	for i := range instances {
		p, err := startRelay(o.Pgoutbox, h.pollEnv(pollVariant{notify: true})(h.name(tag, strconv.Itoa(i))), filepath.Join(h.logDir, fmt.Sprintf("pgoutbox-%s-%d.log", tag, i)))
		if err != nil {
			return r, err
		}
		procs = append(procs, p)
	}
	deadline := start.Add(o.CatchupTimeout)
	for {
		total, err := watcher.Total(r.Topic)
		if err != nil {
			return r, err
		}
		if total > 0 && r.FirstRecordSeconds == 0 {
			r.FirstRecordSeconds = time.Since(start).Seconds()
		}
		if total >= int64(n) {
			break
		}
		for _, p := range procs {
			if err := p.exited(); err != nil {
				return r, err
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return r, fmt.Errorf("poll relays: %d of %d records in Kafka after %s (%v)", total, n, time.Since(start).Round(time.Millisecond), ctx.Err())
		}
		time.Sleep(pollInterval)
	}
	r.WallSeconds = time.Since(start).Seconds()
	r.EventsPerSec = float64(n) / r.WallSeconds
	for {
		var left int
		if err := h.admin.QueryRow(ctx, "SELECT count(*) FROM "+pollTable+" WHERE published_at IS NULL").Scan(&left); err != nil {
			return r, err
		}
		if left == 0 {
			r.PublishedSeconds = time.Since(start).Seconds()
			break
		}
		if time.Since(start) > o.CatchupTimeout {
			return r, fmt.Errorf("poll relays: %d rows still unpublished", left)
		}
		time.Sleep(pollInterval)
	}
	for _, p := range procs {
		st, err := p.stats()
		if err != nil {
			return r, err
		}
		r.CPUSeconds += st.CPUSeconds
		r.PeakRSSBytes = max(r.PeakRSSBytes, st.PeakRSSBytes)
	}
	for _, p := range procs {
		if err := p.stop(time.Minute); err != nil {
			return r, err
		}
	}
	procs = nil
	if r.RecordsInKafka, err = watcher.Total(r.Topic); err != nil {
		return r, err
	}
	h.logf("  poll, %d instances: %.2f s (first record after %.2f s), %.0f events/s, all marked after %.2f s, CPU %.2f s, peak RSS %d MB, %d records",
		instances, r.WallSeconds, r.FirstRecordSeconds, r.EventsPerSec, r.PublishedSeconds, r.CPUSeconds, r.PeakRSSBytes>>20, r.RecordsInKafka)
	if _, err := h.admin.Exec(ctx, "SET "+migrations.DeleteUnpublished+" = on; TRUNCATE "+pollTable); err != nil {
		return r, err
	}
	return r, nil
}

// triggerCost measures the writers' transactions per second on the poll
// table without and with the notification trigger, in alternating rounds,
// with a connection listening on the channel during the rounds with it (a
// relay would be).
func (h *harness) triggerCost(ctx context.Context) (TriggerCostResult, error) {
	o := h.o
	r := TriggerCostResult{Writers: o.TriggerWriters, DurationSeconds: o.TriggerRound.Seconds()}
	h.logf("trigger cost: %d writers, rounds of %s without and with the notification trigger", o.TriggerWriters, o.TriggerRound)
	for round := range 4 {
		with := round%2 == 1
		if err := h.setupPoll(ctx, with); err != nil {
			return r, err
		}
		if _, err := h.admin.Exec(ctx, "SET "+migrations.DeleteUnpublished+" = on; TRUNCATE "+pollTable); err != nil {
			return r, err
		}
		var stopListen func() int64
		if with {
			var err error
			if stopListen, err = listen(ctx, h.dsn, pollChannel); err != nil {
				return r, err
			}
		}
		tps, err := writeFlat(ctx, h.dsn, o.TriggerWriters, o.TriggerRound, h.name("trig"), o.PayloadBytes)
		if stopListen != nil {
			r.ListenerReceived += stopListen()
		}
		if err != nil {
			return r, err
		}
		if with {
			r.WithRounds = append(r.WithRounds, tps)
		} else {
			r.WithoutRounds = append(r.WithoutRounds, tps)
		}
		h.logf("  round %d, trigger %v: %.0f transactions/s", round+1, with, tps)
	}
	r.WithoutTxPerSec, r.WithTxPerSec = median(r.WithoutRounds), median(r.WithRounds)
	if r.WithoutTxPerSec > 0 {
		r.CostPct = (r.WithoutTxPerSec - r.WithTxPerSec) / r.WithoutTxPerSec * 100
	}
	h.logf("  without the trigger %.0f transactions/s, with it %.0f: %.1f%% fewer", r.WithoutTxPerSec, r.WithTxPerSec, r.CostPct)
	if _, err := h.admin.Exec(ctx, "SET "+migrations.DeleteUnpublished+" = on; TRUNCATE "+pollTable); err != nil {
		return r, err
	}
	return r, nil
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// writeFlat runs workers connections that insert one row per transaction
// into the poll table as fast as they can for dur, and returns the
// transactions per second.
func writeFlat(ctx context.Context, dsn string, workers int, dur time.Duration, aggType string, padBytes int) (float64, error) {
	var n atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, workers)
	pad := strings.Repeat("x", padBytes)
	conns := make([]*pgx.Conn, workers)
	for w := range workers {
		c, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return 0, err
		}
		defer c.Close(context.Background())
		conns[w] = c
	}
	start := time.Now()
	end := start.Add(dur)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Now().Before(end); i++ {
				if _, err := conns[w].Exec(ctx, latencyInsert(pollTable), aggType, "agg-"+strconv.Itoa(i%1000), i, pad); err != nil {
					errs[w] = err
					return
				}
				n.Add(1)
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return 0, err
	}
	return float64(n.Load()) / time.Since(start).Seconds(), nil
}

// listen LISTENs on channel on a connection of its own and counts the
// notifications until the returned function is called.
func listen(ctx context.Context, dsn, channel string) (stop func() int64, err error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		conn.Close(context.Background())
		return nil, err
	}
	lctx, cancel := context.WithCancel(ctx)
	var got atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			if _, err := conn.WaitForNotification(lctx); err != nil {
				return
			}
			got.Add(1)
		}
	}()
	return func() int64 {
		cancel()
		<-done
		conn.Close(context.Background())
		return got.Load()
	}, nil
}

// pollSummary renders the poll source's sections of summary.md.
func pollSummary(r *Results) string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	if len(r.PollCatchup) > 0 {
		p("\n## Poll source: catch-up of a backlog\n\n")
		p("Unpublished rows already in the poll table (`%s`), published by that many relays at once; done when Kafka has every record (all rows marked published after the time in the last column).\n\n", pollTable)
		p("| relays | events | s (first record) | events/s | all marked after s | CPU s (all relays) | peak RSS MB |\n|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, c := range r.PollCatchup {
			if c.Error != "" {
				p("| %d | %s | failed: %s |||||\n", c.Instances, thousands(int64(c.Events)), oneLine(c.Error))
				continue
			}
			p("| %d | %s | %s (%s) | %s | %s | %s | %s |\n", c.Instances, thousands(int64(c.Events)), f2(c.WallSeconds), f2(c.FirstRecordSeconds),
				thousands(int64(c.EventsPerSec)), f2(c.PublishedSeconds), f2(c.CPUSeconds), mb(c.PeakRSSBytes))
		}
	}
	if len(r.PollLatency) > 0 {
		p("\n## Poll source: steady-state latency\n\n")
		p("One relay; commit → consumer is until a sarama consumer received the record. poll+notify: woken by the trigger's notifications; poll: without them (and without the trigger), claiming every poll.interval, 500 ms by default or as named.\n\n")
		p("| source | target events/s | achieved events/s | events | commit → consumer p50 / p99 ms | commit → Kafka append p50 / p99 / max ms | kept up | pgoutbox CPU s per 100k events |\n")
		p("|---|---:|---:|---:|---:|---:|:---:|---:|\n")
		for _, l := range r.PollLatency {
			if l.Error != "" && l.Received == 0 {
				p("| %s | %s | failed: %s ||||||\n", l.Source, thousands(int64(l.TargetRate)), oneLine(l.Error))
				continue
			}
			kept := "yes"
			if !l.KeptUp {
				kept = "**no**"
			}
			p("| %s | %s | %s | %s | %s / %s | %s / %s / %s | %s | %s |\n", l.Source, thousands(int64(l.TargetRate)), thousands(int64(l.AchievedRate)), thousands(l.Received),
				f1(l.ReceiveLatencyMs.P50), f1(l.ReceiveLatencyMs.P99), f1(l.LatencyMs.P50), f1(l.LatencyMs.P99), f1(l.LatencyMs.Max), kept, f2(l.CPUSecondsPer100k))
		}
	}
	if t := r.TriggerCost; t != nil {
		p("\n## Poll source: what the notification trigger costs the writers\n\n")
		if t.Error != "" {
			p("Failed: %s\n", oneLine(t.Error))
		} else {
			p("%d connections inserting one row per transaction as fast as they can, %s s rounds alternating without and with the trigger (and a connection listening); medians.\n\n", t.Writers, f0(t.DurationSeconds))
			p("| without trigger tx/s | with trigger tx/s | cost |\n|---:|---:|---:|\n| %s | %s | %s%% |\n", thousands(int64(t.WithoutTxPerSec)), thousands(int64(t.WithTxPerSec)), f1(t.CostPct))
		}
	}
	return b.String()
}
