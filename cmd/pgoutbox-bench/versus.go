package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/pgoutbox/pgoutbox/pkg/kafka/kafkatest"
)

// VersusResult is the side-by-side benchmark against Debezium: the same
// backlogs drained by pg_recvlogical, Debezium and pgoutbox, each from its
// own slot copied at one LSN, and the latency of the same events through
// Debezium and pgoutbox running at once, and of each running alone.
type VersusResult struct {
	Runs int `json:"runs"`
	// Debezium and KafkaConnect are the versions of their jars;
	// ConnectJVM the worker's JVM options; Connector the connector
	// configuration both systems ran (topic prefixes aside).
	Debezium     string            `json:"debezium"`
	KafkaConnect string            `json:"kafka_connect"`
	ConnectJVM   []string          `json:"connect_jvm_options"`
	Connector    map[string]string `json:"connector"`
	// ConfirmWaitSeconds bounds the wait for each slot's confirmation
	// after the last record.
	ConfirmWaitSeconds float64 `json:"confirm_wait_s"`
	// OffsetFlushSeconds is the worker's offset.flush.interval.ms (0:
	// Kafka Connect's default, 60 s).
	OffsetFlushSeconds float64 `json:"offset_flush_interval_s"`

	Catchup []VersusCatchup `json:"catchup"`
	Latency []VersusLatency `json:"latency"`
}

// VersusCatchup is one backlog drained by the three readers in Order.
type VersusCatchup struct {
	Run          int      `json:"run"`
	Order        []string `json:"order"`
	TxnSize      int      `json:"txn_size"`
	Events       int      `json:"events"`
	Transactions int      `json:"transactions"`
	StartLSN     string   `json:"start_lsn"`
	backlog

	PGRecvlogical ReaderResult `json:"pg_recvlogical"`
	Debezium      ReaderResult `json:"debezium"`
	Pgoutbox      ReaderResult `json:"pgoutbox"`
	// Ratios of pgoutbox to Debezium: events/s from each process's start
	// and from each one's first record; Debezium's peak RSS over
	// pgoutbox's; and pgoutbox's events/s over pg_recvlogical's.
	SpeedupFromStart   float64 `json:"speedup_from_start"`
	SpeedupFromFirst   float64 `json:"speedup_from_first_record"`
	RSSRatio           float64 `json:"debezium_rss_over_pgoutbox"`
	PgoutboxToRecvlogc float64 `json:"pgoutbox_to_pg_recvlogical"`

	Error string `json:"error,omitempty"`
}

// Reader names, as in VersusCatchup.Order.
const (
	readerRecvlogical = "pg_recvlogical"
	readerDebezium    = "debezium"
	readerPgoutbox    = "pgoutbox"
)

// debeziumConfirmWait bounds the wait for Debezium's slot: it confirms
// only when Kafka Connect flushes offsets, every 60 s by default.
func (h *harness) debeziumConfirmWait() time.Duration {
	if f := h.o.DebeziumOffsetFlush; f > 0 {
		return f + 15*time.Second
	}
	return 75 * time.Second
}

// connectWorker is the worker's configuration beyond startConnect's.
func (h *harness) connectWorker() map[string]string {
	if f := h.o.DebeziumOffsetFlush; f > 0 {
		return map[string]string{"offset.flush.interval.ms": strconv.FormatInt(f.Milliseconds(), 10)}
	}
	return nil
}

// versusOrder is run's order of the readers: reversed every other run.
func versusOrder(run int) []string {
	if run%2 == 0 {
		return []string{readerRecvlogical, readerDebezium, readerPgoutbox}
	}
	return []string{readerPgoutbox, readerDebezium, readerRecvlogical}
}

// versus runs the debezium scenario: every run's catch-up shapes, then
// its latency configurations (in alternating order too).
func (h *harness) versus(ctx context.Context, res *Results) []error {
	v := &VersusResult{Runs: h.o.Runs, ConnectJVM: connectJVMOptions, ConfirmWaitSeconds: h.debeziumConfirmWait().Seconds(), OffsetFlushSeconds: h.o.DebeziumOffsetFlush.Seconds()}
	res.Versus = v
	v.Debezium = jarVersion(filepath.Join(h.o.DebeziumLibs, "plugins", "debezium-connector-postgres"), "debezium-connector-postgres-")
	v.KafkaConnect = jarVersion(filepath.Join(h.o.DebeziumLibs, "connect"), "connect-runtime-")
	if js, err := h.connectorConfig("SLOT", "PREFIX", nil); err == nil {
		v.Connector = js
	}
	var failed []error
	for run := range h.o.Runs {
		for _, size := range h.o.TxnSizes {
			if ctx.Err() != nil {
				return append(failed, ctx.Err())
			}
			c, err := h.versusCatchup(ctx, run, size)
			if err != nil {
				c.Error = err.Error()
				h.logf("debezium catch-up, run %d, %d-event transactions: FAILED: %v", run+1, size, err)
				failed = append(failed, fmt.Errorf("debezium catch-up, run %d, %d-event transactions: %w", run+1, size, err))
			}
			v.Catchup = append(v.Catchup, c)
		}
		settings := h.debeziumSettings()
		if run%2 == 1 {
			settings[0], settings[1] = settings[1], settings[0]
		}
		// Both at once in each setting, then each alone with the short
		// poll interval (Debezium's defaults wait up to 500 ms a poll,
		// alone or not).
		type latencyRun struct {
			s     dbzSetting
			alone bool
		}
		var latencies []latencyRun
		for _, s := range settings {
			latencies = append(latencies, latencyRun{s, false})
		}
		shortPoll := h.debeziumSettings()[1]
		latencies = append(latencies, latencyRun{shortPoll, true})
		for _, lr := range latencies {
			if ctx.Err() != nil {
				return append(failed, ctx.Err())
			}
			what := lr.s.name
			if lr.alone {
				what += ", each alone"
			}
			l, err := h.versusLatency(ctx, run, lr.s, lr.alone)
			if err != nil {
				l.Error = err.Error()
				h.logf("debezium latency, run %d, %s: FAILED: %v", run+1, what, err)
				failed = append(failed, fmt.Errorf("debezium latency, run %d, %s: %w", run+1, what, err))
			}
			v.Latency = append(v.Latency, l)
		}
	}
	return failed
}

// jarVersion returns the version in the name of the first jar in dir
// that starts with prefix.
func jarVersion(dir, prefix string) string {
	m, _ := filepath.Glob(filepath.Join(dir, prefix+"*.jar"))
	if len(m) == 0 {
		return ""
	}
	return strings.TrimSuffix(strings.TrimPrefix(filepath.Base(m[0]), prefix), ".jar")
}

// versusCatchup writes one backlog and drains it with each reader in turn.
func (h *harness) versusCatchup(ctx context.Context, run, size int) (VersusCatchup, error) {
	n := h.o.Events
	c := VersusCatchup{Run: run + 1, Order: versusOrder(run), TxnSize: size, Events: n, Transactions: (n + size - 1) / size}
	tag := fmt.Sprintf("vs%d_r%d", size, run+1)
	aggType := h.name(tag)
	pgoTopic, dbzTopic := "pgo."+aggType, "dbz."+aggType
	h.logf("debezium catch-up, run %d, %d-event transactions: %d events, order %s", run+1, size, n, strings.Join(c.Order, ", "))
	for _, t := range []string{pgoTopic, dbzTopic} {
		if err := h.createTopic(t, nil); err != nil {
			return c, err
		}
	}
	slots := map[string]string{readerRecvlogical: h.name(tag, "recv"), readerDebezium: h.name(tag, "dbz"), readerPgoutbox: h.name(tag, "pgo")}
	for _, s := range slots {
		defer h.dropSlot(context.WithoutCancel(ctx), s)
	}
	var err error
	if c.StartLSN, err = h.createSlots(ctx, slots[readerRecvlogical], slots[readerDebezium], slots[readerPgoutbox]); err != nil {
		return c, err
	}
	if c.backlog, err = h.writeBacklog(ctx, backlogSpec{aggType: aggType, size: size, events: n, pad: h.pad()}, c.StartLSN); err != nil {
		return c, err
	}
	h.logf("  wrote %d events in %.1f s, %d MB of WAL, end LSN %s", n, c.PrepSeconds, c.WALBytes>>20, c.EndLSN)
	for _, r := range c.Order {
		if ctx.Err() != nil {
			return c, ctx.Err()
		}
		switch r {
		case readerRecvlogical:
			if c.PGRecvlogical, err = h.runRecvlogical(ctx, slots[r], c.backlog, n); err != nil {
				return c, err
			}
			h.logReader(r, c.PGRecvlogical)
		case readerPgoutbox:
			file, err := h.writeConnector(tag+"_pgo", slots[r], "pgo", nil)
			if err != nil {
				return c, err
			}
			if c.Pgoutbox, err = h.runRelayCatchup(ctx, slots[r], []string{pgoTopic}, c.backlog, n, tag, []string{"--connector", file}); err != nil {
				return c, err
			}
			h.logReader(r, c.Pgoutbox)
		case readerDebezium:
			if c.Debezium, err = h.runDebeziumCatchup(ctx, slots[r], dbzTopic, c.backlog, n, tag); err != nil {
				return c, err
			}
			h.logReader(r, c.Debezium)
		}
	}
	c.SpeedupFromStart = c.Pgoutbox.EventsPerSec / c.Debezium.EventsPerSec
	c.SpeedupFromFirst = c.Pgoutbox.DrainEventsPerSec / c.Debezium.DrainEventsPerSec
	c.RSSRatio = float64(c.Debezium.PeakRSSBytes) / float64(c.Pgoutbox.PeakRSSBytes)
	c.PgoutboxToRecvlogc = c.Pgoutbox.EventsPerSec / c.PGRecvlogical.EventsPerSec
	h.logf("  pgoutbox / Debezium: %.1fx from start, %.1fx from the first record; Debezium's peak RSS %.0fx pgoutbox's",
		c.SpeedupFromStart, c.SpeedupFromFirst, c.RSSRatio)
	if _, err := h.admin.Exec(ctx, "TRUNCATE "+outboxTable); err != nil {
		return c, fmt.Errorf("truncate: %w", err)
	}
	return c, nil
}

func (h *harness) logReader(name string, r ReaderResult) {
	confirmed := "not to the end within the wait: stopped " + thousands(r.ConfirmedShortBytes) + " bytes short"
	if r.ConfirmedAfterLastSeconds >= 0 {
		confirmed = fmt.Sprintf("%.2f s after the last record", r.ConfirmedAfterLastSeconds)
	}
	h.logf("  %s: %.2f s (first record after %.2f s), %.0f events/s, CPU %.2f s, peak RSS %d MB, walsender CPU %.2f s in %.2f s (%.0f%% busy, %.0f%% waiting for a CPU), broker CPU %.2f s, machine %.0f%% busy; confirmed %s",
		name, r.WallSeconds, r.FirstRecordSeconds, r.EventsPerSec, r.CPUSeconds, r.PeakRSSBytes>>20, r.WalsenderCPUSeconds, r.WalsenderSeconds,
		r.WalsenderBusy*100, r.WalsenderRunQueue*100, r.BrokerCPUSeconds, r.MachineBusy*100, confirmed)
}

// connectorConfig is the connector configuration both systems run
// (pgoutbox with run --connector, Debezium on the worker): the common
// Kafka Connect setup, routing each event to topicPrefix + "." + its
// aggregatetype, plus extra.
func (h *harness) connectorConfig(slot, topicPrefix string, extra map[string]string) (map[string]string, error) {
	host, port, user, db, err := dsnParts(h.dsn)
	if err != nil {
		return nil, err
	}
	cfg := map[string]string{
		"connector.class":                "io.debezium.connector.postgresql.PostgresConnector",
		"database.hostname":              host,
		"database.port":                  port,
		"database.user":                  user,
		"database.dbname":                db,
		"topic.prefix":                   "bench",
		"plugin.name":                    "pgoutput",
		"slot.name":                      slot,
		"publication.name":               h.pub,
		"publication.autocreate.mode":    "disabled",
		"table.include.list":             strings.ReplaceAll(outboxTable, ".", `\.`),
		"snapshot.mode":                  "no_data",
		"tasks.max":                      "1",
		"key.converter":                  "org.apache.kafka.connect.storage.StringConverter",
		"value.converter":                "org.apache.kafka.connect.json.JsonConverter",
		"value.converter.schemas.enable": "false",
		"transforms":                     "outbox",
		"transforms.outbox.type":         "io.debezium.transforms.outbox.EventRouter",
		"transforms.outbox.route.topic.replacement": topicPrefix + ".${routedByValue}",
	}
	for k, v := range extra {
		cfg[k] = v
	}
	return cfg, nil
}

// writeConnector writes the connector JSON of a reader into the log
// directory and returns its path.
func (h *harness) writeConnector(tag, slot, topicPrefix string, extra map[string]string) (string, error) {
	js, err := h.connectorJSON("bench-"+strings.ReplaceAll(tag, "_", "-"), slot, topicPrefix, extra)
	if err != nil {
		return "", err
	}
	path, err := filepath.Abs(filepath.Join(h.logDir, "connector-"+tag+".json"))
	if err != nil {
		return "", err
	}
	return path, os.WriteFile(path, js, 0o644)
}

// runDebeziumCatchup runs Debezium on Kafka Connect on slot until Kafka
// holds n records in topic, then waits (bounded) for the slot to be
// confirmed, and stops the worker.
func (h *harness) runDebeziumCatchup(ctx context.Context, slot, topic string, bl backlog, n int, tag string) (ReaderResult, error) {
	var rr ReaderResult
	file, err := h.writeConnector(tag+"_dbz", slot, "dbz", nil)
	if err != nil {
		return rr, err
	}
	hw, err := kafkatest.NewOffsetWatcher(h.kcfg)
	if err != nil {
		return rr, err
	}
	defer hw.Close()
	if _, err := hw.Total(topic); err != nil {
		return rr, err
	}
	ws := startWalsenderSampler(h.dsn, slot)
	defer ws.stop()
	at := h.mark()
	p, err := h.startConnect(filepath.Join(h.logDir, "connect-"+tag), file, h.connectWorker())
	if err != nil {
		return rr, err
	}
	defer p.stop(time.Minute) // on the error paths
	name := "bench-" + strings.ReplaceAll(tag, "_", "-") + "-dbz"
	rr, err = h.drainToKafka(ctx, p, ws, hw, drainSpec{slot: slot, topics: []string{topic}, events: n, bl: bl, confirmWait: h.debeziumConfirmWait(),
		failed: func() string { return p.failed(name) }}, at)
	if err != nil {
		return rr, err
	}
	if err := p.stop(time.Minute); err != nil {
		return rr, err
	}
	if rr.RecordsInKafka, err = hw.Total(topic); err != nil {
		return rr, err
	}
	if rr.RecordsInKafka != int64(n) {
		return rr, fmt.Errorf("debezium: %d records in Kafka, want %d", rr.RecordsInKafka, n)
	}
	return rr, nil
}
