package metrics

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/pgoutbox/pgoutbox/checkpoint"
	"github.com/pgoutbox/pgoutbox/pkg/relay"
	"github.com/pgoutbox/pgoutbox/replication"
)

// Label values of pgoutbox_sessions_ended_total{cause}.
const (
	CauseStopped  = "stopped"  // a clean stop (Run's context was cancelled)
	CauseKafka    = "kafka"    // Kafka did not accept a record (relay.ProduceError)
	CausePostgres = "postgres" // the replication connection failed or the server ended it
	CauseFatal    = "fatal"    // a failure a restart would repeat (relay.FatalError)
	CauseOther    = "other"
)

var causes = []string{CauseStopped, CauseKafka, CausePostgres, CauseFatal, CauseOther}

// Label values of pgoutbox_events_dropped_total{reason}.
const (
	DropDelete = "delete" // a DELETE on an outbox table
	DropUpdate = "update" // an UPDATE, per table.op.invalid.behavior
	DropOther  = "other"
)

var dropReasons = []string{DropDelete, DropUpdate, DropOther}

// walStatuses are the values of pg_replication_slots.wal_status.
var walStatuses = []string{"reserved", "extended", "unreserved", "lost"}

// OtherTopic is the topic label of events whose topic came after
// Config.MaxTopics others. Parentheses cannot occur in a Kafka topic name,
// so it never collides with a real topic.
const OtherTopic = "(other)"

// latencyBuckets suit millisecond latencies up to a minute (seconds).
var latencyBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// maxCommitToAck: a longer commit-to-ack latency means the record carried
// no commit time (its stamp was zero), so it is not observed.
const maxCommitToAck = 365 * 24 * time.Hour

// Metrics is the relay's Prometheus metrics and health state. It implements
// relay.Observer and prometheus.Collector.
//
// Concurrency: every method is safe for concurrent use. The Observer
// methods run on the relay's goroutine and only update atomics and, under
// short mutexes, a few fields; the HTTP handler and the slot poller read
// the same state under the same mutexes.
type Metrics struct {
	cfg     Config
	now     func() time.Time
	version string
	all     []prometheus.Collector
	handler http.Handler

	routed, produced, failed, deadLettered *prometheus.CounterVec
	tmu                                    sync.Mutex
	topics                                 map[string]*topicCounters
	other                                  *topicCounters // created on the first overflow

	dropped       map[string]prometheus.Counter
	sessionsEnded map[string]prometheus.Counter

	producedBytes   prometheus.Counter
	commitToAck     prometheus.Histogram
	produceLatency  prometheus.Histogram
	inflightRecords prometheus.Gauge
	inflightBytes   prometheus.Gauge
	pendingTxns     prometheus.Gauge
	receivedLSN     prometheus.Gauge
	confirmedLSN    prometheus.Gauge
	serverWALEnd    prometheus.Gauge
	lag             prometheus.Gauge
	sessionsStarted prometheus.Counter
	streaming       prometheus.Gauge

	slotRetained   prometheus.Gauge
	slotSafe       *prometheus.GaugeVec // no labels: a child exists only while the server reports a value
	slotActive     prometheus.Gauge
	slotConfirmed  prometheus.Gauge
	slotStatus     map[string]prometheus.Gauge
	slotPollErrors prometheus.Counter

	behind         prometheus.Gauge
	catchUpRate    prometheus.Gauge
	catchUpETA     prometheus.Gauge
	lastCommit     prometheus.Gauge
	otherTables    prometheus.Counter
	skippedMsgs    map[string]prometheus.Counter
	standbyOK      prometheus.Gauge
	verifiedLSN    prometheus.Gauge
	catalogChanged prometheus.Gauge
	pubAltered     prometheus.Counter

	poll pollMetrics // the poll source's (poll.go)
	// pollSource: WithPollSource.
	pollSource bool

	mu sync.Mutex
	st state
}

type topicCounters struct {
	routed, produced, failed, deadLettered prometheus.Counter
}

// state is what readiness is computed from; guarded by Metrics.mu.
type state struct {
	streaming   bool
	lastCause   string // why the last session ended
	confirmed   checkpoint.LSN
	lastAdvance time.Time // when confirmed last moved (or the session started)

	progress     relay.Progress
	haveProgress bool // in this session
	progressAt   time.Time

	slot     string
	slotLost bool

	// A standby's: the outcome of its last check of what a takeover
	// needs (StandingBy), and when it was reported.
	standby    bool
	standbyErr string
	standbyAt  time.Time

	poll pollState // the poll source's (poll.go)
}

var (
	_ relay.Observer        = (*Metrics)(nil)
	_ relay.CatalogObserver = (*Metrics)(nil)
)

// Option configures Metrics.
type Option func(*Metrics)

// WithClock replaces time.Now, for tests of readiness.
func WithClock(now func() time.Time) Option { return func(m *Metrics) { m.now = now } }

// WithPollSource says the relay is a poll source: its instances all
// claim, and /rolloutz counts each as available from the start, as
// /healthz does (see Available).
func WithPollSource() Option { return func(m *Metrics) { m.pollSource = true } }

// WithVersion sets the version label of pgoutbox_build_info.
func WithVersion(v string) Option { return func(m *Metrics) { m.version = v } }

// New validates cfg, builds the metrics and registers them on reg, with the
// Go runtime's and the process's collectors (so reg must not already hold
// those) and the /metrics handler's own counters.
func New(reg *prometheus.Registry, cfg Config, opts ...Option) (*Metrics, error) {
	if reg == nil {
		return nil, errors.New("metrics: nil registry")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m := &Metrics{cfg: cfg, now: time.Now, version: "unknown", topics: map[string]*topicCounters{}}
	for _, o := range opts {
		o(m)
	}
	m.st.lastCause = "no session has started"
	m.build()
	for _, c := range []prometheus.Collector{m, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("metrics: register: %w", err)
		}
	}
	m.handler = m.newHandler(reg)
	return m, nil
}

func (m *Metrics) build() {
	add := func(c prometheus.Collector) { m.all = append(m.all, c) }
	counter := func(name, help string) prometheus.Counter {
		c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
		add(c)
		return c
	}
	gauge := func(name, help string) prometheus.Gauge {
		g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
		add(g)
		return g
	}
	counterVec := func(name, help, label string) *prometheus.CounterVec {
		v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{label})
		add(v)
		return v
	}
	histogram := func(name, help string) prometheus.Histogram {
		h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: latencyBuckets})
		add(h)
		return h
	}

	m.routed = counterVec("pgoutbox_events_routed_total", "Outbox rows and messages the relay turned into Kafka records, by topic.", "topic")
	m.produced = counterVec("pgoutbox_events_produced_total", "Records Kafka acknowledged, by topic.", "topic")
	m.failed = counterVec("pgoutbox_events_failed_total", "Records Kafka rejected after its retries, by topic; each ends the session.", "topic")
	m.deadLettered = counterVec("pgoutbox_events_dead_lettered_total", "Events sent to a dead-letter topic instead of their own, by original topic.", "topic")
	dropped := counterVec("pgoutbox_events_dropped_total", "Changes on outbox tables that produced no record, by reason (delete, update, other).", "reason")
	m.dropped = map[string]prometheus.Counter{}
	for _, r := range dropReasons {
		m.dropped[r] = dropped.WithLabelValues(r)
	}
	m.producedBytes = counter("pgoutbox_produced_bytes_total", "Key, value and header bytes of the records Kafka acknowledged.")
	m.commitToAck = histogram("pgoutbox_commit_to_ack_latency_seconds", "Time from a transaction's commit on PostgreSQL to Kafka's acknowledgement of each of its records.")
	m.produceLatency = histogram("pgoutbox_produce_latency_seconds", "Time from sending a record to the Kafka producer to its acknowledgement.")

	m.inflightRecords = gauge("pgoutbox_inflight_records", "Records sent to Kafka and not yet acknowledged.")
	m.inflightBytes = gauge("pgoutbox_inflight_bytes", "Key, value and header bytes of the records in flight.")
	m.pendingTxns = gauge("pgoutbox_pending_transactions", "Transactions read from the slot whose records are not all acknowledged yet.")
	m.receivedLSN = gauge("pgoutbox_received_lsn_bytes", "Highest WAL position received from the slot (the LSN as a number).")
	m.confirmedLSN = gauge("pgoutbox_confirmed_lsn_bytes", "WAL position last confirmed to the slot (flush position).")
	m.serverWALEnd = gauge("pgoutbox_server_wal_end_lsn_bytes", "The server's WAL end from its last keepalive.")
	m.lag = gauge("pgoutbox_replication_lag_bytes", "WAL between the server's end (its walsender's, the highest position received, or, while the relay has not read up to it, the server's position at its last catalog check, whichever is latest) and the confirmed position.")

	m.sessionsStarted = counter("pgoutbox_sessions_started_total", "Replication sessions that started streaming; more than one means reconnects.")
	ended := counterVec("pgoutbox_sessions_ended_total", "Replication sessions that ended, by cause (stopped, kafka, postgres, fatal, other).", "cause")
	m.sessionsEnded = map[string]prometheus.Counter{}
	for _, c := range causes {
		m.sessionsEnded[c] = ended.WithLabelValues(c)
	}
	m.streaming = gauge("pgoutbox_streaming", "1 while a replication session is streaming.")
	m.standbyOK = gauge("pgoutbox_standby_available", "1 while this instance stands by (another streams from the slot) and its last check of what a takeover needs passed (PostgreSQL, the event columns, Kafka's brokers and credentials, the dead-letter topic); 0 otherwise.")
	add(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "pgoutbox_ready", Help: "1 when /readyz answers 200."},
		func() float64 {
			if ok, _ := m.Ready(); ok {
				return 1
			}
			return 0
		}))

	m.slotRetained = gauge("pgoutbox_slot_retained_wal_bytes", "WAL the replication slot keeps from being recycled: the current WAL position minus restart_lsn.")
	m.slotSafe = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "pgoutbox_slot_safe_wal_size_bytes",
		Help: "WAL that can still be written before the slot is in danger of being lost (absent without max_slot_wal_keep_size)."}, nil)
	add(m.slotSafe)
	m.slotActive = gauge("pgoutbox_slot_active", "1 while a walsender holds the replication slot.")
	m.slotConfirmed = gauge("pgoutbox_slot_confirmed_flush_lsn_bytes", "The slot's confirmed_flush_lsn as the server reports it.")
	status := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "pgoutbox_slot_wal_status",
		Help: "The slot's wal_status: 1 for the current one of reserved, extended, unreserved, lost; all 0 when unknown."}, []string{"status"})
	add(status)
	m.slotStatus = map[string]prometheus.Gauge{}
	for _, s := range walStatuses {
		m.slotStatus[s] = status.WithLabelValues(s)
	}
	m.slotPollErrors = counter("pgoutbox_slot_poll_errors_total", "Failed reads of the slot's WAL usage.")
	m.behind = gauge("pgoutbox_catchup_behind_bytes", "WAL the relay still has to read to reach the server's position at its last catalog check; 0 when caught up.")
	m.catchUpRate = gauge("pgoutbox_catchup_rate_bytes_per_second", "How fast the relay read WAL over the last relay.progress.interval while behind; 0 when caught up.")
	m.catchUpETA = gauge("pgoutbox_catchup_eta_seconds", "Estimated time to catch up at the current rate; 0 when caught up or unknown.")
	m.lastCommit = gauge("pgoutbox_last_commit_timestamp_seconds", "Commit time of the last transaction read from the slot, in Unix seconds (time() minus it is how old the events being read are).")
	m.otherTables = counter("pgoutbox_other_table_changes_total", "Changes on tables of a FOR ALL TABLES publication that are not outbox tables, skipped.")
	skipped := counterVec("pgoutbox_skipped_messages_total", "Logical decoding messages whose prefix is not messages.prefix, skipped, by reason: another_relay (another slot's state row records the prefix), unclaimed (no relay records it), unclaimed_event (no relay records it, and the message looks like an outbox event: most likely an event no one relays).", "reason")
	m.skippedMsgs = map[string]prometheus.Counter{}
	for _, r := range []string{relay.SkippedAnotherRelays, relay.SkippedUnclaimed, relay.SkippedUnclaimedEvent} {
		m.skippedMsgs[r] = skipped.WithLabelValues(r)
	}
	m.verifiedLSN = gauge("pgoutbox_catalog_verified_lsn_bytes", "WAL position of the last check that found the publication and the outbox tables unchanged; the slot is not confirmed past it.")
	m.catalogChanged = gauge("pgoutbox_catalog_changed", "1 after the relay stopped because the publication or an outbox table changed under it (events may be missing from the stream).")
	m.pubAltered = counter("pgoutbox_publication_altered_total", "Times the relay found the publication's catalog row written since its session started or it last streamed (ALTER PUBLICATION ... SET, OWNER TO, RENAME): if inserts were unpublished for a while, their events were never decoded.")

	info := prometheus.NewGauge(prometheus.GaugeOpts{Name: "pgoutbox_build_info", Help: "Always 1; the labels say which build runs.",
		ConstLabels: prometheus.Labels{"version": m.version, "goversion": runtime.Version()}})
	info.Set(1)
	add(info)
	start := gauge("pgoutbox_start_time_seconds", "When the process started, in Unix seconds.")
	start.Set(float64(m.now().UnixNano()) / 1e9)
	m.buildPoll()
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.all {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.all {
		c.Collect(ch)
	}
}

// topic returns the counters of a topic label, creating them for the first
// MaxTopics topics and sharing OtherTopic's after that.
func (m *Metrics) topic(name string) *topicCounters {
	m.tmu.Lock()
	defer m.tmu.Unlock()
	if t, ok := m.topics[name]; ok {
		return t
	}
	if len(m.topics) >= m.cfg.MaxTopics {
		if m.other == nil {
			m.other = m.newTopic(OtherTopic)
		}
		return m.other
	}
	t := m.newTopic(name)
	m.topics[name] = t
	return t
}

func (m *Metrics) newTopic(name string) *topicCounters {
	return &topicCounters{
		routed:       m.routed.WithLabelValues(name),
		produced:     m.produced.WithLabelValues(name),
		failed:       m.failed.WithLabelValues(name),
		deadLettered: m.deadLettered.WithLabelValues(name),
	}
}

// SessionStarted implements relay.Observer.
func (m *Metrics) SessionStarted(start checkpoint.LSN) {
	m.sessionsStarted.Inc()
	m.streaming.Set(1)
	m.standbyOK.Set(0)
	m.confirmedLSN.Set(float64(start))
	now := m.now()
	m.mu.Lock()
	m.st.standby = false
	m.st.streaming = true
	m.st.confirmed = start
	m.st.lastAdvance = now
	m.st.haveProgress = false
	m.mu.Unlock()
}

// PublicationAltered implements relay.CatalogObserver.
func (m *Metrics) PublicationAltered(string) { m.pubAltered.Inc() }

// SessionEnded implements relay.Observer.
func (m *Metrics) SessionEnded(cause error) {
	c := Cause(cause)
	m.sessionsEnded[c].Inc()
	m.streaming.Set(0)
	if errors.Is(cause, replication.ErrCatalogChanged) {
		m.catalogChanged.Set(1)
	}
	// The session's producer is closed: nothing it held is in flight now.
	m.inflightRecords.Set(0)
	m.inflightBytes.Set(0)
	m.pendingTxns.Set(0)
	why := CauseStopped
	if cause != nil {
		why = "session ended (" + c + "): " + truncate(cause.Error(), 300)
	}
	m.standbyOK.Set(0)
	m.mu.Lock()
	m.st.streaming, m.st.standby = false, false
	m.st.lastCause = why
	m.mu.Unlock()
}

// StandingBy implements relay.Observer.
func (m *Metrics) StandingBy(err error) {
	ok := 0.0
	reason := ""
	if err == nil {
		ok = 1
	} else {
		reason = truncate(err.Error(), 300)
	}
	m.standbyOK.Set(ok)
	now := m.now()
	m.mu.Lock()
	m.st.standby, m.st.standbyErr, m.st.standbyAt = true, reason, now
	m.mu.Unlock()
}

// Routed implements relay.Observer.
func (m *Metrics) Routed(_, topic string) { m.topic(topic).routed.Inc() }

// OtherTable implements relay.Observer.
func (m *Metrics) OtherTable(string) { m.otherTables.Inc() }

// SkippedMessage implements relay.Observer.
func (m *Metrics) SkippedMessage(reason string) {
	if c, ok := m.skippedMsgs[reason]; ok {
		c.Inc()
	}
}

// Dropped implements relay.Observer. The relay's reasons are sentences;
// they are counted as one of DropDelete, DropUpdate, DropOther.
func (m *Metrics) Dropped(_, reason string) { m.dropped[DropReason(reason)].Inc() }

// Acked implements relay.Observer.
func (m *Metrics) Acked(topic string, bytes int, commitToAck, sendToAck time.Duration) {
	m.topic(topic).produced.Inc()
	m.producedBytes.Add(float64(bytes))
	if commitToAck < maxCommitToAck {
		// A negative latency is clock skew between PostgreSQL and us.
		m.commitToAck.Observe(max(commitToAck, 0).Seconds())
	}
	m.produceLatency.Observe(max(sendToAck, 0).Seconds())
}

// Failed implements relay.Observer.
func (m *Metrics) Failed(topic string, _ error) { m.topic(topic).failed.Inc() }

// DeadLettered counts an event sent to a dead-letter topic instead of
// topic (the dead-letter topic itself when the row could not be routed).
func (m *Metrics) DeadLettered(topic string) { m.topic(topic).deadLettered.Inc() }

// Progress implements relay.Observer.
func (m *Metrics) Progress(p relay.Progress) {
	m.receivedLSN.Set(float64(p.Received))
	m.confirmedLSN.Set(float64(p.Confirmed))
	m.serverWALEnd.Set(float64(p.ServerWALEnd))
	m.lag.Set(float64(lagBytes(p)))
	m.inflightRecords.Set(float64(p.InFlightRecords))
	m.inflightBytes.Set(float64(p.InFlightBytes))
	m.pendingTxns.Set(float64(p.PendingTxns))
	m.verifiedLSN.Set(float64(p.Verified))
	m.behind.Set(float64(p.Behind))
	m.catchUpRate.Set(p.CatchUpRate)
	eta := 0.0
	if p.CatchUpRate > 0 {
		eta = float64(p.Behind) / p.CatchUpRate
	}
	m.catchUpETA.Set(eta)
	if !p.LastCommitTime.IsZero() {
		m.lastCommit.Set(float64(p.LastCommitTime.UnixNano()) / 1e9)
	}
	now := m.now()
	m.mu.Lock()
	if p.Confirmed > m.st.confirmed {
		m.st.confirmed = p.Confirmed
		m.st.lastAdvance = now
	}
	m.st.progress = p
	m.st.haveProgress = true
	m.st.progressAt = now
	m.mu.Unlock()
}

// walEnd is the server's WAL end as far as the relay knows: keepalives
// carry the walsender's, but under load they are rare and the stream
// itself runs ahead; and while the relay has not read up to the server's
// position at its last catalog check (Behind), that position: a
// walsender that sends nothing (waiting for a synchronized standby,
// decoding a large transaction, hung) reports no WAL past what it sent.
func walEnd(p relay.Progress) checkpoint.LSN {
	end := max(p.ServerWALEnd, p.Received)
	if p.Behind > 0 {
		end = max(end, p.ServerWAL)
	}
	return end
}

func lagBytes(p relay.Progress) uint64 {
	if end := walEnd(p); end > p.Confirmed {
		return uint64(end - p.Confirmed)
	}
	return 0
}

// ObserveSlot records the slot's WAL usage as read by
// replication.ReadSlotStats (PollSlot calls it). A wal_status of "lost"
// makes the relay not ready.
func (m *Metrics) ObserveSlot(s replication.SlotStats) {
	m.slotRetained.Set(float64(s.RetainedWALBytes))
	if s.SafeWALSize != nil {
		m.slotSafe.WithLabelValues().Set(float64(*s.SafeWALSize))
	} else {
		m.slotSafe.Reset()
	}
	m.slotActive.Set(b2f(s.Active))
	m.slotConfirmed.Set(float64(s.ConfirmedFlushLSN))
	for name, g := range m.slotStatus {
		g.Set(b2f(name == s.WALStatus))
	}
	m.mu.Lock()
	m.st.slot = s.Name
	m.st.slotLost = s.WALStatus == "lost"
	m.mu.Unlock()
}

// slotMissing records that the slot does not exist (yet: the relay creates
// it on its first session, when configured to).
func (m *Metrics) slotMissing(slot string) {
	m.slotRetained.Set(0)
	m.slotSafe.Reset()
	m.slotActive.Set(0)
	for _, g := range m.slotStatus {
		g.Set(0)
	}
	m.mu.Lock()
	m.st.slot = slot
	m.st.slotLost = false
	m.mu.Unlock()
}

// Cause classifies why a session ended, as the cause label of
// pgoutbox_sessions_ended_total: nil is CauseStopped; a relay.FatalError
// CauseFatal; a relay.ProduceError CauseKafka; a lost or refused
// replication connection, an error from the server or a network error
// (the Kafka producer's arrive as ProduceError) CausePostgres.
func Cause(err error) string {
	if err == nil {
		return CauseStopped
	}
	var fe *relay.FatalError
	if errors.As(err, &fe) {
		return CauseFatal
	}
	var pe *relay.ProduceError
	if errors.As(err, &pe) {
		return CauseKafka
	}
	for _, e := range []error{replication.ErrReceive, replication.ErrStreamEnded, replication.ErrSlotInUse,
		replication.ErrSlotMissing, replication.ErrSlotLost, replication.ErrPublicationMissing, replication.ErrSlotVanished} {
		if errors.Is(err, e) {
			return CausePostgres
		}
	}
	var ne net.Error
	if replication.IsConnError(err) || errors.As(err, &ne) {
		return CausePostgres
	}
	return CauseOther
}

// DropReason maps the relay's reason for a drop to a label value.
func DropReason(reason string) string {
	switch {
	case reason == "delete":
		return DropDelete
	case strings.HasPrefix(reason, "UPDATE"):
		return DropUpdate
	default:
		return DropOther
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !isRuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

func isRuneStart(b byte) bool { return b&0xC0 != 0x80 }
