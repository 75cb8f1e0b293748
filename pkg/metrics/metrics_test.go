package metrics_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pgoutbox/pgoutbox/checkpoint"
	"github.com/pgoutbox/pgoutbox/pkg/metrics"
	"github.com/pgoutbox/pgoutbox/pkg/relay"
	"github.com/pgoutbox/pgoutbox/replication"
)

// exercise drives every Observer method once so that every vector has
// series.
func exercise(m *metrics.Metrics) {
	m.SessionStarted(100)
	m.Routed("public.outbox", "outbox.event.Order")
	m.Acked("outbox.event.Order", 120, 30*time.Millisecond, 5*time.Millisecond)
	m.Failed("outbox.event.Order", errors.New("boom"))
	m.DeadLettered("outbox.event.Order")
	m.Dropped("public.outbox", "delete")
	m.Progress(relay.Progress{Received: 200, Confirmed: 150, ServerWALEnd: 300, InFlightRecords: 2, InFlightBytes: 64, PendingTxns: 1})
	safe := int64(1 << 30)
	m.ObserveSlot(replication.SlotStats{Name: "s", Active: true, WALStatus: "reserved", RetainedWALBytes: 4096, SafeWALSize: &safe, ConfirmedFlushLSN: 150})
	m.SessionEnded(&relay.ProduceError{Topic: "outbox.event.Order", Err: errors.New("broker down")})
}

func TestMetricNamesPassPromlint(t *testing.T) {
	h := newHarness(t, metrics.DefaultConfig())
	exercise(h.m)
	problems, err := testutil.CollectAndLint(h.m)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
	// The whole registry, Go and process collectors included, gathers
	// without inconsistencies.
	if _, err := h.reg.Gather(); err != nil {
		t.Fatal(err)
	}
}

func TestExposesEveryMetricWithItsType(t *testing.T) {
	h := newHarness(t, metrics.DefaultConfig())
	exercise(h.m)
	f := scrape(t, h.srv.URL)
	want := map[string]string{
		"pgoutbox_events_routed_total":            "COUNTER",
		"pgoutbox_events_produced_total":          "COUNTER",
		"pgoutbox_events_failed_total":            "COUNTER",
		"pgoutbox_events_dead_lettered_total":     "COUNTER",
		"pgoutbox_events_dropped_total":           "COUNTER",
		"pgoutbox_produced_bytes_total":           "COUNTER",
		"pgoutbox_commit_to_ack_latency_seconds":  "HISTOGRAM",
		"pgoutbox_produce_latency_seconds":        "HISTOGRAM",
		"pgoutbox_inflight_records":               "GAUGE",
		"pgoutbox_inflight_bytes":                 "GAUGE",
		"pgoutbox_pending_transactions":           "GAUGE",
		"pgoutbox_received_lsn_bytes":             "GAUGE",
		"pgoutbox_confirmed_lsn_bytes":            "GAUGE",
		"pgoutbox_server_wal_end_lsn_bytes":       "GAUGE",
		"pgoutbox_replication_lag_bytes":          "GAUGE",
		"pgoutbox_sessions_started_total":         "COUNTER",
		"pgoutbox_sessions_ended_total":           "COUNTER",
		"pgoutbox_streaming":                      "GAUGE",
		"pgoutbox_ready":                          "GAUGE",
		"pgoutbox_slot_retained_wal_bytes":        "GAUGE",
		"pgoutbox_slot_safe_wal_size_bytes":       "GAUGE",
		"pgoutbox_slot_active":                    "GAUGE",
		"pgoutbox_slot_confirmed_flush_lsn_bytes": "GAUGE",
		"pgoutbox_slot_wal_status":                "GAUGE",
		"pgoutbox_slot_poll_errors_total":         "COUNTER",
		"pgoutbox_other_table_changes_total":      "COUNTER",
		"pgoutbox_skipped_messages_total":         "COUNTER",
		"pgoutbox_standby_available":              "GAUGE",
		"pgoutbox_catchup_behind_bytes":           "GAUGE",
		"pgoutbox_catchup_rate_bytes_per_second":  "GAUGE",
		"pgoutbox_catchup_eta_seconds":            "GAUGE",
		"pgoutbox_last_commit_timestamp_seconds":  "GAUGE",
		"pgoutbox_catalog_changed":                "GAUGE",
		"pgoutbox_publication_altered_total":      "COUNTER",
		"pgoutbox_catalog_verified_lsn_bytes":     "GAUGE",
		"pgoutbox_build_info":                     "GAUGE",
		"pgoutbox_start_time_seconds":             "GAUGE",
		// The poll source's.
		"pgoutbox_outbox_unpublished_rows":               "GAUGE",
		"pgoutbox_outbox_oldest_unpublished_age_seconds": "GAUGE",
		"pgoutbox_outbox_failed_rows":                    "GAUGE",
		"pgoutbox_outbox_backlog_read_errors_total":      "COUNTER",
		"pgoutbox_poll_instances":                        "GAUGE",
		"pgoutbox_poll_buckets_owned":                    "GAUGE",
		"pgoutbox_poll_claims_total":                     "COUNTER",
		"pgoutbox_poll_rows_published_total":             "COUNTER",
		"pgoutbox_poll_failed_attempts_total":            "COUNTER",
		"pgoutbox_poll_cleanup_deleted_rows_total":       "COUNTER",
		"go_goroutines":                                  "GAUGE",
		"process_start_time_seconds":                     "GAUGE",
		"promhttp_metric_handler_requests_total":         "COUNTER",
	}
	for name, typ := range want {
		mf := f[name]
		if mf == nil {
			t.Errorf("%s missing", name)
			continue
		}
		if got := mf.GetType().String(); got != typ {
			t.Errorf("%s is a %s, want %s", name, got, typ)
		}
		if mf.GetHelp() == "" {
			t.Errorf("%s has no help", name)
		}
	}
	for name := range f {
		if strings.HasPrefix(name, "pgoutbox_") && want[name] == "" {
			t.Errorf("%s is not in this test's list", name)
		}
	}
	if v := f.value("pgoutbox_build_info", "version", "v1.2.3"); v != 1 {
		t.Errorf("build info %v, want 1 with version v1.2.3", v)
	}
	if got := f.find("pgoutbox_build_info").GetLabel(); len(got) != 2 || got[0].GetName() != "goversion" || !strings.HasPrefix(got[0].GetValue(), "go") {
		t.Errorf("build info labels %v", got)
	}
	if v, want := f.value("pgoutbox_start_time_seconds"), float64(newFakeClock().Now().Unix()); v != want {
		t.Errorf("start time %v, want %v", v, want)
	}
}

func TestCountsEventsByTopicAndLatencies(t *testing.T) {
	h := newHarness(t, metrics.DefaultConfig())
	m := h.m
	m.SessionStarted(1)
	for i := 0; i < 7; i++ {
		m.Routed("public.outbox", "orders")
	}
	for i := 0; i < 3; i++ {
		m.Routed("public.outbox", "payments")
	}
	for i := 0; i < 5; i++ {
		m.Acked("orders", 100, 20*time.Millisecond, 2*time.Millisecond)
	}
	m.Acked("payments", 50, 2*time.Second, time.Second)
	// No commit time on the record: not a latency.
	m.Acked("payments", 50, time.Since(time.Unix(0, 0)), time.Millisecond)
	// Clock skew: counted as 0.
	m.Acked("payments", 50, -time.Second, time.Millisecond)
	m.Failed("payments", errors.New("x"))
	m.Dropped("public.outbox", "delete")
	m.Dropped("public.outbox", "delete")
	m.Dropped("public.outbox", "UPDATE on an outbox table ignored: outbox rows must only be inserted (table.op.invalid.behavior=warn)")
	m.Dropped("public.outbox", "something new")

	f := scrape(t, h.srv.URL)
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"pgoutbox_events_routed_total", []string{"topic", "orders"}, 7},
		{"pgoutbox_events_routed_total", []string{"topic", "payments"}, 3},
		{"pgoutbox_events_produced_total", []string{"topic", "orders"}, 5},
		{"pgoutbox_events_produced_total", []string{"topic", "payments"}, 3},
		{"pgoutbox_events_failed_total", []string{"topic", "payments"}, 1},
		{"pgoutbox_events_failed_total", []string{"topic", "orders"}, 0},
		{"pgoutbox_events_dead_lettered_total", []string{"topic", "orders"}, 0},
		{"pgoutbox_events_dropped_total", []string{"reason", "delete"}, 2},
		{"pgoutbox_events_dropped_total", []string{"reason", "update"}, 1},
		{"pgoutbox_events_dropped_total", []string{"reason", "other"}, 1},
		{"pgoutbox_produced_bytes_total", nil, 5*100 + 3*50},
		{"pgoutbox_sessions_started_total", nil, 1},
		{"pgoutbox_streaming", nil, 1},
	} {
		if got := f.value(c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	c2a := f.histogram("pgoutbox_commit_to_ack_latency_seconds")
	if c2a.GetSampleCount() != 7 {
		t.Errorf("commit-to-ack count %d, want 7 (the zero-stamped record is skipped)", c2a.GetSampleCount())
	}
	if got, want := c2a.GetSampleSum(), 5*0.020+2; diff(got, want) > 1e-9 {
		t.Errorf("commit-to-ack sum %v, want %v", got, want)
	}
	for _, b := range c2a.GetBucket() {
		var want uint64
		switch ub := b.GetUpperBound(); {
		case ub >= 2.5:
			want = 7
		case ub >= 0.025:
			want = 6
		default:
			want = 1 // the skewed one, at 0
		}
		if b.GetCumulativeCount() != want {
			t.Errorf("commit-to-ack bucket le=%v: %d, want %d", b.GetUpperBound(), b.GetCumulativeCount(), want)
		}
	}
	if n := len(c2a.GetBucket()); n < 10 || c2a.GetBucket()[0].GetUpperBound() > 0.001 || c2a.GetBucket()[n-1].GetUpperBound() < 60 {
		t.Errorf("buckets %v do not span 1ms..60s", c2a.GetBucket())
	}
	if got := f.histogram("pgoutbox_produce_latency_seconds").GetSampleCount(); got != 8 {
		t.Errorf("produce latency count %d, want 8", got)
	}
}

func diff(a, b float64) float64 {
	if a > b {
		return a - b
	}
	return b - a
}

func TestTopicLabelsAreCappedAtMaxTopics(t *testing.T) {
	cfg := metrics.DefaultConfig()
	cfg.MaxTopics = 3
	h := newHarness(t, cfg)
	for i := 0; i < 10; i++ {
		topic := fmt.Sprintf("topic-%d", i)
		h.m.Routed("public.outbox", topic)
		h.m.Acked(topic, 1, time.Millisecond, time.Millisecond)
	}
	// A topic seen before the cap keeps its own label.
	h.m.Routed("public.outbox", "topic-1")
	f := scrape(t, h.srv.URL)
	want := []string{metrics.OtherTopic, "topic-0", "topic-1", "topic-2"}
	for _, name := range []string{"pgoutbox_events_routed_total", "pgoutbox_events_produced_total", "pgoutbox_events_failed_total", "pgoutbox_events_dead_lettered_total"} {
		if got := f.labelValues(name, "topic"); !reflect.DeepEqual(got, want) {
			t.Errorf("%s topics %v, want %v", name, got, want)
		}
	}
	if got := f.value("pgoutbox_events_routed_total", "topic", metrics.OtherTopic); got != 7 {
		t.Errorf("routed to (other) %v, want 7", got)
	}
	if got := f.value("pgoutbox_events_routed_total", "topic", "topic-1"); got != 2 {
		t.Errorf("routed to topic-1 %v, want 2", got)
	}
	if got := f.sum("pgoutbox_events_produced_total"); got != 10 {
		t.Errorf("produced %v, want 10", got)
	}
}

func TestProgressSetsPositionsInFlightAndLag(t *testing.T) {
	h := newHarness(t, metrics.DefaultConfig())
	m := h.m
	m.SessionStarted(0x1000)
	big := checkpoint.LSN(0x1_0000_0000_0000) // beyond 32 bits, exact in a float64
	m.Progress(relay.Progress{Received: big + 500, Confirmed: big, ServerWALEnd: big + 8000, InFlightRecords: 12, InFlightBytes: 3400, PendingTxns: 3})
	f := scrape(t, h.srv.URL)
	f.wantValues(t, map[string]float64{
		"pgoutbox_received_lsn_bytes":       float64(big + 500),
		"pgoutbox_confirmed_lsn_bytes":      float64(big),
		"pgoutbox_server_wal_end_lsn_bytes": float64(big + 8000),
		"pgoutbox_replication_lag_bytes":    8000,
		"pgoutbox_inflight_records":         12,
		"pgoutbox_inflight_bytes":           3400,
		"pgoutbox_pending_transactions":     3,
	})
	// The stream runs ahead of the last keepalive: lag counts from what
	// was received.
	m.Progress(relay.Progress{Received: big + 9000, Confirmed: big + 1000, ServerWALEnd: big + 8000})
	if got := scrape(t, h.srv.URL).value("pgoutbox_replication_lag_bytes"); got != 8000 {
		t.Errorf("lag %v, want 8000", got)
	}
	// Confirmed past the WAL end (a non-transactional message's end + 1).
	m.Progress(relay.Progress{Received: big, Confirmed: big + 1, ServerWALEnd: big, Idle: true})
	if got := scrape(t, h.srv.URL).value("pgoutbox_replication_lag_bytes"); got != 0 {
		t.Errorf("lag %v, want 0", got)
	}
	// A session that ends takes its in-flight records with it.
	m.Progress(relay.Progress{Received: big, Confirmed: big, ServerWALEnd: big, InFlightRecords: 4, InFlightBytes: 10, PendingTxns: 1})
	m.SessionEnded(nil)
	f = scrape(t, h.srv.URL)
	for _, name := range []string{"pgoutbox_inflight_records", "pgoutbox_inflight_bytes", "pgoutbox_pending_transactions", "pgoutbox_streaming"} {
		if got := f.value(name); got != 0 {
			t.Errorf("after the session ended %s = %v, want 0", name, got)
		}
	}
	if got := f.value("pgoutbox_confirmed_lsn_bytes"); got != float64(big) {
		t.Errorf("confirmed LSN %v after the session ended, want it kept at %v", got, float64(big))
	}
}

func TestSessionEndCauses(t *testing.T) {
	cases := []struct {
		err  error
		want string
	}{
		{nil, metrics.CauseStopped},
		{&relay.FatalError{Err: replication.ErrSlotLost}, metrics.CauseFatal},
		{&relay.FatalError{Err: errors.New("router: no topic")}, metrics.CauseFatal},
		{&relay.ProduceError{Topic: "t", Err: errors.New("kafka: broker not available")}, metrics.CauseKafka},
		{fmt.Errorf("wrapped: %w", &relay.ProduceError{Topic: "t", Err: io.EOF}), metrics.CauseKafka},
		{fmt.Errorf("%w: receive from slot %q: %w", replication.ErrReceive, "s", io.ErrUnexpectedEOF), metrics.CausePostgres},
		{replication.ErrStreamEnded, metrics.CausePostgres},
		{fmt.Errorf("replication: slot %q: %w", "s", &pgconn.PgError{Code: "57P01", Message: "terminating connection due to administrator command"}), metrics.CausePostgres},
		{fmt.Errorf("replication: send status update: %w", &net.OpError{Op: "write", Net: "tcp", Err: errors.New("broken pipe")}), metrics.CausePostgres},
		{errors.New("relay: producer closed its acknowledgement channel"), metrics.CauseOther},
	}
	h := newHarness(t, metrics.DefaultConfig())
	want := map[string]float64{}
	for _, c := range cases {
		if got := metrics.Cause(c.err); got != c.want {
			t.Errorf("Cause(%v) = %q, want %q", c.err, got, c.want)
		}
		h.m.SessionStarted(1)
		h.m.SessionEnded(c.err)
		want[c.want]++
	}
	f := scrape(t, h.srv.URL)
	for _, cause := range []string{"stopped", "kafka", "postgres", "fatal", "other"} {
		if got := f.value("pgoutbox_sessions_ended_total", "cause", cause); got != want[cause] {
			t.Errorf("sessions ended by %s: %v, want %v", cause, got, want[cause])
		}
	}
	if got := f.value("pgoutbox_sessions_started_total"); got != float64(len(cases)) {
		t.Errorf("sessions started %v, want %d", got, len(cases))
	}
}

// TestReadinessTransitions walks readiness through its states with a fake
// clock.
func TestReadinessTransitions(t *testing.T) {
	cfg := metrics.DefaultConfig()
	cfg.ReadyStaleAfter = 30 * time.Second
	h := newHarness(t, cfg)
	m, clk := h.m, h.clk
	expect := func(step string, code int, substr string) {
		t.Helper()
		got, body := get(t, h.srv.URL+"/readyz")
		if got != code || !strings.Contains(body, substr) {
			t.Fatalf("%s: /readyz %d %q, want %d containing %q", step, got, body, code, substr)
		}
		gauge := scrape(t, h.srv.URL).value("pgoutbox_ready")
		if (gauge == 1) != (code == http.StatusOK) {
			t.Fatalf("%s: pgoutbox_ready %v with /readyz %d", step, gauge, code)
		}
		t.Logf("%s: %d %s", step, got, strings.TrimSpace(body))
	}
	// second advances the clock by a second and reports progress.
	second := func(p relay.Progress) {
		clk.Advance(time.Second)
		m.Progress(p)
	}

	expect("before any session", 503, "not streaming: no session has started")

	m.SessionStarted(0x1000)
	expect("session started", 200, "ready: streaming")

	// Streaming under load: the confirmed LSN advances, records in flight.
	lsn := checkpoint.LSN(0x1000)
	for i := 0; i < 120; i++ {
		lsn += 100
		second(relay.Progress{Received: lsn + 50, Confirmed: lsn, ServerWALEnd: lsn + 50, InFlightRecords: 10, InFlightBytes: 1000, PendingTxns: 2})
	}
	expect("progressing for two minutes", 200, "advanced 0s ago")

	// Kafka stops acknowledging: records in flight, confirmed LSN stuck.
	for i := 0; i < 30; i++ {
		second(relay.Progress{Received: lsn + 900, Confirmed: lsn, ServerWALEnd: lsn + 900, InFlightRecords: 45, InFlightBytes: 4500, PendingTxns: 3})
	}
	expect("stuck for exactly ReadyStaleAfter", 200, "streaming")
	for i := 0; i < 15; i++ {
		second(relay.Progress{Received: lsn + 900, Confirmed: lsn, ServerWALEnd: lsn + 900, InFlightRecords: 45, InFlightBytes: 4500, PendingTxns: 3})
	}
	expect("stuck for 45s", 503, fmt.Sprintf("kafka: 45 records (4500 bytes) unacknowledged for 45s, confirmed LSN stuck at %s", lsn))

	// The acks arrive.
	lsn += 900
	second(relay.Progress{Received: lsn, Confirmed: lsn, ServerWALEnd: lsn})
	expect("acknowledged", 200, "streaming")

	// Idle and caught up for ten minutes: nothing to confirm, still ready.
	for i := 0; i < 600; i++ {
		second(relay.Progress{Received: lsn, Confirmed: lsn, ServerWALEnd: lsn, Idle: true})
	}
	expect("idle and caught up for 10m", 200, "idle and caught up")
	// Within the slack of the WAL end (a keepalive not yet confirmed).
	second(relay.Progress{Received: lsn, Confirmed: lsn, ServerWALEnd: lsn + 1000, Idle: true})
	expect("idle, a keepalive ahead", 200, "idle and caught up")
	// The walsender sends nothing (it waits for a standby named in
	// synchronized_standby_slots, decodes a large transaction, or hangs)
	// while the server's WAL moves on: its keepalives' WAL end is its
	// own, so only the relay's read of the server's position shows it.
	// Before, this was "idle and caught up" with a lag of 0 (a prober).
	second(relay.Progress{Received: lsn, Confirmed: lsn, ServerWALEnd: lsn, Idle: true, ServerWAL: lsn + 135664, Behind: 135664})
	expect("idle, the walsender silent while the server's WAL moved on", 503, fmt.Sprintf("behind: the server's WAL was at %s", lsn+135664))
	if lag := scrape(t, h.srv.URL).value("pgoutbox_replication_lag_bytes"); lag != 135664 {
		t.Fatalf("pgoutbox_replication_lag_bytes %v with the server's WAL 135664 bytes past the confirmed LSN", lag)
	}

	// Idle but far behind the server and not advancing.
	second(relay.Progress{Received: lsn, Confirmed: lsn, ServerWALEnd: lsn + 10<<20, Idle: true})
	expect("idle and behind", 503, "behind: confirmed LSN")

	// A transaction that never ends.
	second(relay.Progress{Received: lsn + 5000, Confirmed: lsn, ServerWALEnd: lsn, PendingTxns: 1})
	expect("open transaction", 503, "transaction open")

	// Progress reports stop (the relay's loop is stuck).
	second(relay.Progress{Received: lsn, Confirmed: lsn, ServerWALEnd: lsn, Idle: true})
	expect("idle again", 200, "idle and caught up")
	clk.Advance(31 * time.Second)
	expect("no progress for 31s", 503, "stalled: no progress report")

	// The session ends with a Kafka error.
	m.SessionEnded(&relay.ProduceError{EventID: "e1", Topic: "orders", Err: errors.New("kafka server: Not Leader For Partition")})
	expect("session ended", 503, "not streaming: session ended (kafka): produce event e1")

	// A new session gets ReadyStaleAfter to make progress, and its own
	// progress reports count, not the last session's.
	m.SessionStarted(lsn)
	expect("new session", 200, "streaming")
	clk.Advance(31 * time.Second)
	expect("new session without progress", 503, "stalled: no progress report from the relay (last: none this session)")
	second(relay.Progress{Received: lsn, Confirmed: lsn, ServerWALEnd: lsn, Idle: true})
	expect("new session idle", 200, "idle and caught up")

	// The slot poller finds the slot lost: not ready, whatever else.
	m.ObserveSlot(replication.SlotStats{Name: "pgoutbox", WALStatus: "lost"})
	expect("slot lost", 503, `slot lost: replication slot "pgoutbox" has wal_status lost`)
	m.ObserveSlot(replication.SlotStats{Name: "pgoutbox", WALStatus: "reserved", Active: true})
	expect("slot recreated", 200, "idle and caught up")

	m.SessionEnded(nil)
	expect("stopped", 503, "not streaming: stopped")
}

// TestLivenessFailsOnlyWhenTheLoopStopsReporting: /healthz turns 503 only
// when a streaming WAL session's loop has been silent for live.stale.after;
// Kafka down, a standby, a stopped session or the poll source stay live.
// (That the loop keeps reporting while Kafka refuses is what
// TestReadinessFollowsAKafkaOutage shows on a real relay: its reason is
// "kafka: … unacknowledged", which needs a fresh report.)
func TestLivenessFailsOnlyWhenTheLoopStopsReporting(t *testing.T) {
	cfg := metrics.DefaultConfig()
	cfg.LiveStaleAfter = 2 * time.Minute
	h := newHarness(t, cfg)
	m, clk := h.m, h.clk
	expect := func(step string, code int, substr string) {
		t.Helper()
		got, body := get(t, h.srv.URL+"/healthz")
		if got != code || !strings.Contains(body, substr) {
			t.Fatalf("%s: /healthz %d %q, want %d containing %q", step, got, body, code, substr)
		}
	}
	expect("before any session (a standby)", 200, "ok")
	clk.Advance(time.Hour)
	expect("a standby for an hour", 200, "ok")

	m.SessionStarted(0x1000)
	clk.Advance(2 * time.Minute)
	expect("session start, no report for exactly the limit", 200, "ok")
	clk.Advance(time.Second)
	expect("no report since the session started", 503, "no progress report for 2m1s (none this session")

	// Kafka refuses for ten minutes: nothing confirmed, but the loop reports.
	for range 600 {
		clk.Advance(time.Second)
		m.Progress(relay.Progress{Received: 0x2000, Confirmed: 0x1000, ServerWALEnd: 0x2000, InFlightRecords: 5})
	}
	expect("Kafka down for 10m, the loop reporting", 200, "ok")
	if code, _ := get(t, h.srv.URL+"/readyz"); code != 503 {
		t.Fatalf("/readyz %d while Kafka is down, want 503", code)
	}

	clk.Advance(2*time.Minute + time.Second)
	expect("the loop silent", 503, "stuck: the relay's loop has sent no progress report for 2m1s (last 2m1s ago")
	m.Progress(relay.Progress{Received: 0x2000, Confirmed: 0x2000, ServerWALEnd: 0x2000, Idle: true})
	expect("the loop reports again", 200, "ok")

	clk.Advance(time.Hour)
	m.SessionEnded(errors.New("kafka: brokers down"))
	expect("session ended (reconnecting)", 200, "ok")

	m.SessionStarted(0x2000)
	m.PollProgress(relay.PollProgress{Table: "public.outbox", Members: 1, Owned: 64, Buckets: 64, InFlightRecords: 3})
	clk.Advance(time.Hour)
	expect("poll source, a claim waiting an hour", 200, "ok")

	off := metrics.DefaultConfig()
	off.LiveStaleAfter = 0
	h2 := newHarness(t, off)
	h2.m.SessionStarted(0x1000)
	h2.clk.Advance(24 * time.Hour)
	if code, _ := get(t, h2.srv.URL+"/healthz"); code != 200 {
		t.Fatalf("live.stale.after 0: /healthz %d, want 200", code)
	}
}

func TestHealthzAndIndex(t *testing.T) {
	h := newHarness(t, metrics.DefaultConfig())
	if code, body := get(t, h.srv.URL+"/healthz"); code != 200 || body != "ok\n" {
		t.Fatalf("/healthz: %d %q", code, body)
	}
	if code, body := get(t, h.srv.URL+"/"); code != 200 || !strings.Contains(body, "/readyz") {
		t.Fatalf("/: %d %q", code, body)
	}
	if code, _ := get(t, h.srv.URL+"/nope"); code != 404 {
		t.Fatalf("/nope: %d, want 404", code)
	}
	resp, err := http.Post(h.srv.URL+"/readyz", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("POST /readyz: %d, want 405", resp.StatusCode)
	}
}

func TestSlotGauges(t *testing.T) {
	h := newHarness(t, metrics.DefaultConfig())
	safe := int64(5 << 20)
	h.m.ObserveSlot(replication.SlotStats{Name: "s", Active: true, WALStatus: "extended", RetainedWALBytes: 7 << 20, SafeWALSize: &safe, ConfirmedFlushLSN: 0x5000})
	f := scrape(t, h.srv.URL)
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"pgoutbox_slot_retained_wal_bytes", nil, 7 << 20},
		{"pgoutbox_slot_safe_wal_size_bytes", nil, 5 << 20},
		{"pgoutbox_slot_active", nil, 1},
		{"pgoutbox_slot_confirmed_flush_lsn_bytes", nil, 0x5000},
		{"pgoutbox_slot_wal_status", []string{"status", "extended"}, 1},
		{"pgoutbox_slot_wal_status", []string{"status", "reserved"}, 0},
		{"pgoutbox_slot_wal_status", []string{"status", "unreserved"}, 0},
		{"pgoutbox_slot_wal_status", []string{"status", "lost"}, 0},
	} {
		if got := f.value(c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	// No max_slot_wal_keep_size: no safe size series at all.
	h.m.ObserveSlot(replication.SlotStats{Name: "s", WALStatus: "reserved"})
	f = scrape(t, h.srv.URL)
	if f["pgoutbox_slot_safe_wal_size_bytes"] != nil {
		t.Errorf("safe WAL size exposed without a value: %v", f["pgoutbox_slot_safe_wal_size_bytes"])
	}
	if f.value("pgoutbox_slot_wal_status", "status", "reserved") != 1 || f.value("pgoutbox_slot_wal_status", "status", "extended") != 0 {
		t.Errorf("wal_status series after reserved: %v", f["pgoutbox_slot_wal_status"])
	}
}

func TestConfigValidate(t *testing.T) {
	def := metrics.DefaultConfig()
	if err := def.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	for _, c := range []struct {
		change func(*metrics.Config)
		want   string
	}{
		{func(c *metrics.Config) { c.Listen = "9180" }, "listen"},
		{func(c *metrics.Config) { c.ReadyStaleAfter = 0 }, "ready.stale.after"},
		{func(c *metrics.Config) { c.SlotPollInterval = time.Millisecond }, "slot.poll.interval"},
		{func(c *metrics.Config) { c.MaxTopics = 0 }, "max.topics"},
		{func(c *metrics.Config) { c.LiveStaleAfter = 30 * time.Second }, "live.stale.after"},
	} {
		cfg := metrics.DefaultConfig()
		c.change(&cfg)
		err := cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: got %v, want an error naming %s", cfg, err, c.want)
		}
		if _, err := metrics.New(prometheus.NewRegistry(), cfg); err == nil {
			t.Errorf("New accepted %+v", cfg)
		}
	}
	ok := metrics.DefaultConfig()
	ok.Listen, ok.SlotPollInterval = "127.0.0.1:0", 0
	if err := ok.Validate(); err != nil {
		t.Errorf("%+v: %v", ok, err)
	}
}

func TestNewRefusesARegistryThatHasTheGoCollector(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := metrics.New(reg, metrics.DefaultConfig()); err != nil {
		t.Fatal(err)
	}
	if _, err := metrics.New(reg, metrics.DefaultConfig()); err == nil {
		t.Fatal("a second Metrics on the same registry was accepted")
	}
}

// TestObserverHotPathDoesNotAllocate: Routed and Acked run per event.
func TestObserverHotPathDoesNotAllocate(t *testing.T) {
	h := newHarness(t, metrics.DefaultConfig())
	m := h.m
	p := relay.Progress{Received: 10, Confirmed: 5, ServerWALEnd: 10, InFlightRecords: 1}
	run := func() {
		m.Routed("public.outbox", "outbox.event.Order")
		m.Acked("outbox.event.Order", 100, 3*time.Millisecond, time.Millisecond)
		m.Progress(p)
	}
	run()
	if n := testing.AllocsPerRun(1000, run); n != 0 {
		t.Fatalf("%v allocations per event", n)
	}
}

func BenchmarkRoutedAndAcked(b *testing.B) {
	m, err := metrics.New(prometheus.NewRegistry(), metrics.DefaultConfig())
	if err != nil {
		b.Fatal(err)
	}
	topics := []string{"outbox.event.Order", "outbox.event.Customer", "outbox.event.Payment"}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		t := topics[i%len(topics)]
		m.Routed("public.outbox", t)
		m.Acked(t, 100, 3*time.Millisecond, time.Millisecond)
	}
}

// TestDashboardQueriesExistingMetrics: every pgoutbox_ metric the example
// Grafana dashboard queries is one this package exposes.
func TestDashboardQueriesExistingMetrics(t *testing.T) {
	data, err := os.ReadFile("../../examples/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		SchemaVersion int `json:"schemaVersion"`
		Panels        []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	if dash.SchemaVersion < 36 || len(dash.Panels) == 0 {
		t.Fatalf("dashboard schemaVersion %d with %d panels", dash.SchemaVersion, len(dash.Panels))
	}
	h := newHarness(t, metrics.DefaultConfig())
	exercise(h.m)
	f := scrape(t, h.srv.URL)
	name := regexp.MustCompile(`pgoutbox_[a-z_]+`)
	for _, p := range dash.Panels {
		for _, target := range p.Targets {
			for _, n := range name.FindAllString(target.Expr, -1) {
				base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(n, "_bucket"), "_sum"), "_count")
				if f[base] == nil {
					t.Errorf("panel %q queries %s, which is not exposed", p.Title, n)
				}
			}
		}
	}
}
