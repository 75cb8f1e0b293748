package metrics_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pgoutbox/pgoutbox/pkg/metrics"
	"github.com/pgoutbox/pgoutbox/pkg/outboxtest"
	"github.com/pgoutbox/pgoutbox/pkg/relay"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
	"github.com/pgoutbox/pgoutbox/replication"
)

// offsetClock is the real clock plus an offset the test can move forward,
// to see readiness after a long quiet spell without waiting for it.
type offsetClock struct{ offset atomic.Int64 }

func (c *offsetClock) Now() time.Time        { return time.Now().Add(time.Duration(c.offset.Load())) }
func (c *offsetClock) Skip(d time.Duration)  { c.offset.Add(int64(d)) }
func (c *offsetClock) Offset() time.Duration { return time.Duration(c.offset.Load()) }

// e2e is one test's database, slot, topics, metrics and HTTP endpoint.
type e2e struct {
	env    *testenv.Env
	dsn    string
	name   string // slot, publication and aggregate type prefix
	shape  outboxtest.Shape
	topics []string
	conn   *pgx.Conn
	m      *metrics.Metrics
	srv    *httptest.Server
	clk    *offsetClock
	log    *zap.Logger
}

func newE2E(t *testing.T, env *testenv.Env, mcfg metrics.Config) *e2e {
	t.Helper()
	ctx := context.Background()
	e := &e2e{env: env, dsn: env.NewDatabase(t), name: strings.ToLower(testenv.UniqueName(t, "m")),
		shape: outboxtest.DefaultShape(), clk: &offsetClock{},
		log: zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel))}
	// Topics are cluster-wide: this test's aggregate types get a prefix of
	// their own.
	for i, a := range e.shape.AggregateTypes {
		e.shape.AggregateTypes[i] = e.name + "_" + a
		topic := "outbox.event." + e.shape.AggregateTypes[i]
		env.CreateTopic(t, topic, 3)
		e.topics = append(e.topics, topic)
	}
	var err error
	e.conn, err = pgx.Connect(ctx, e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.conn.Close(context.Background()) })
	if err := outboxtest.Setup(ctx, e.conn, "outbox"); err != nil {
		t.Fatal(err)
	}
	e.m, err = metrics.New(prometheus.NewRegistry(), mcfg, metrics.WithClock(e.clk.Now), metrics.WithVersion("e2e"))
	if err != nil {
		t.Fatal(err)
	}
	e.srv = httptest.NewServer(e.m.Handler())
	t.Cleanup(e.srv.Close)
	return e
}

func (e *e2e) relayConfig() relay.Config {
	cfg := relay.DefaultConfig()
	cfg.Postgres.DSN = e.dsn
	cfg.Postgres.Slot = e.name
	cfg.Postgres.Publication = e.name
	cfg.Postgres.Tables = []string{"public.outbox"}
	cfg.Kafka.Brokers = e.env.KafkaBrokers
	cfg.Relay.RestartBackoff = 200 * time.Millisecond
	cfg.Relay.RestartBackoffMax = 2 * time.Second
	return cfg
}

// runRelay runs an in-process relay observed by the metrics until stop is
// called or the test ends.
func (e *e2e) runRelay(t *testing.T, cfg relay.Config) (stop func() error) {
	t.Helper()
	r, err := relay.New(cfg, e.log, relay.WithObserver(e.m))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var stopped bool
	var result error
	stop = func() error {
		if !stopped {
			stopped = true
			cancel()
			select {
			case result = <-done:
			case <-time.After(60 * time.Second):
				t.Fatal("relay did not stop within 60s")
			}
		}
		return result
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

// pollSlot runs the slot poller until the test ends, and waits for it.
func (e *e2e) pollSlot(t *testing.T, every time.Duration) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.m.PollSlot(ctx, replication.Config{DSN: e.dsn, Slot: e.name}, every, e.log)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

func (e *e2e) readyz(t testing.TB) (int, string) {
	t.Helper()
	code, body := get(t, e.srv.URL+"/readyz")
	return code, strings.TrimSpace(body)
}

func (e *e2e) waitReady(t *testing.T, timeout time.Duration, what string) string {
	t.Helper()
	var body string
	testenv.Eventually(t, timeout, 50*time.Millisecond, func() (bool, string) {
		var code int
		code, body = e.readyz(t)
		return code == http.StatusOK, fmt.Sprintf("%s: /readyz %d %s", what, code, body)
	})
	return body
}

// perTopic counts committed events by topic.
func perTopic(w *outboxtest.Writer) map[string]int {
	n := map[string]int{}
	for _, ev := range w.Committed {
		n[ev.Topic()]++
	}
	return n
}

// TestMetricsFollowARealRelay runs a relay against the real servers and
// checks what the metrics and health endpoints say while it streams, once
// it is idle, and after it stops.
func TestMetricsFollowARealRelay(t *testing.T) {
	env := testenv.Require(t)
	e := newE2E(t, env, metrics.DefaultConfig())
	e.pollSlot(t, 200*time.Millisecond)
	if code, body := e.readyz(t); code != 503 || !strings.Contains(body, "no session has started") {
		t.Fatalf("before the relay: /readyz %d %s", code, body)
	}
	stop := e.runRelay(t, e.relayConfig())
	t.Logf("streaming: %s", e.waitReady(t, time.Minute, "relay start"))

	// The poller sees the slot the relay created, held by its walsender.
	testenv.Eventually(t, 30*time.Second, 50*time.Millisecond, func() (bool, string) {
		f := scrape(t, e.srv.URL)
		ok := f.value("pgoutbox_slot_wal_status", "status", "reserved") == 1 &&
			f.value("pgoutbox_slot_active") == 1 && f.value("pgoutbox_slot_retained_wal_bytes") > 0
		return ok, fmt.Sprintf("slot gauges: wal_status %v, active %v, retained %v bytes",
			f.labelValues("pgoutbox_slot_wal_status", "status"), f.value("pgoutbox_slot_active"), f.value("pgoutbox_slot_retained_wal_bytes"))
	})

	w := outboxtest.NewWriter(e.conn, "outbox", e.shape, 11)
	ctx := context.Background()
	for i := 1; i <= 150; i++ {
		if err := w.Txn(ctx); err != nil {
			t.Fatal(err)
		}
		if i%25 == 0 {
			if code, body := e.readyz(t); code != 200 {
				t.Fatalf("while streaming (%d transactions written): /readyz %d %s", i, code, body)
			}
		}
	}
	want := perTopic(w)
	t.Logf("%d events committed in %d transactions: %v", w.Events(), w.Txns, want)

	// Every committed event is routed and acknowledged exactly once, and
	// the relay catches up with the server's WAL and confirms past the last
	// commit (after the acknowledgement, once a catalog check and the
	// state row's fence cover it).
	lastCommit := float64(w.Committed[len(w.Committed)-1].TxnLow)
	testenv.Eventually(t, 2*time.Minute, 100*time.Millisecond, func() (bool, string) {
		f := scrape(t, e.srv.URL)
		produced, routed := f.sum("pgoutbox_events_produced_total"), f.sum("pgoutbox_events_routed_total")
		lag, inflight := f.value("pgoutbox_replication_lag_bytes"), f.value("pgoutbox_inflight_records")
		confirmed := f.value("pgoutbox_confirmed_lsn_bytes")
		done := produced == float64(w.Events()) && routed == produced && inflight == 0 && lag <= 64<<10 && confirmed > lastCommit
		return done, fmt.Sprintf("produced %v, routed %v of %d events; %v in flight; lag %v bytes; confirmed %v, last commit at %v",
			produced, routed, w.Events(), inflight, lag, confirmed, lastCommit)
	})
	f := scrape(t, e.srv.URL)
	for topic, n := range want {
		if got := f.value("pgoutbox_events_produced_total", "topic", topic); got != float64(n) {
			t.Errorf("produced to %s: %v, want %d", topic, got, n)
		}
	}
	if got := f.histogram("pgoutbox_commit_to_ack_latency_seconds").GetSampleCount(); got != uint64(w.Events()) {
		t.Errorf("commit-to-ack latencies observed %d, want %d", got, w.Events())
	}
	if got := f.histogram("pgoutbox_produce_latency_seconds").GetSampleCount(); got != uint64(w.Events()) {
		t.Errorf("produce latencies observed %d, want %d", got, w.Events())
	}
	if f.value("pgoutbox_sessions_started_total") != 1 || f.sum("pgoutbox_sessions_ended_total") != 0 || f.value("pgoutbox_streaming") != 1 {
		t.Errorf("sessions: started %v, ended %v, streaming %v", f.value("pgoutbox_sessions_started_total"),
			f.sum("pgoutbox_sessions_ended_total"), f.value("pgoutbox_streaming"))
	}
	if f.sum("pgoutbox_events_dropped_total") != 0 || f.sum("pgoutbox_events_failed_total") != 0 {
		t.Errorf("dropped %v, failed %v", f.sum("pgoutbox_events_dropped_total"), f.sum("pgoutbox_events_failed_total"))
	}

	// Idle and caught up for ten minutes (by the metrics' clock): still
	// ready, once the next progress report arrives.
	e.clk.Skip(10 * time.Minute)
	t.Logf("idle and caught up, 10 minutes later: %s", e.waitReady(t, 30*time.Second, "idle"))

	if err := stop(); err != nil {
		t.Fatalf("relay stopped with %v", err)
	}
	if code, body := e.readyz(t); code != 503 || !strings.Contains(body, "not streaming: stopped") {
		t.Fatalf("after the stop: /readyz %d %s", code, body)
	}
	f = scrape(t, e.srv.URL)
	if f.value("pgoutbox_sessions_ended_total", "cause", "stopped") != 1 || f.value("pgoutbox_streaming") != 0 || f.value("pgoutbox_ready") != 0 {
		t.Errorf("after the stop: ended %v, streaming %v, ready %v", f.labelValues("pgoutbox_sessions_ended_total", "cause"),
			f.value("pgoutbox_streaming"), f.value("pgoutbox_ready"))
	}
	testenv.Eventually(t, 30*time.Second, 50*time.Millisecond, func() (bool, string) {
		v := scrape(t, e.srv.URL).value("pgoutbox_slot_active")
		return v == 0, fmt.Sprintf("slot active %v after the relay stopped", v)
	})
}

// TestReadinessFollowsAKafkaOutage stops Kafka while events are written:
// /readyz must turn 503 with a reason naming Kafka within a few seconds
// (ReadyStaleAfter is 3 s), and 200 again once Kafka is back and the
// events are through.
func TestReadinessFollowsAKafkaOutage(t *testing.T) {
	env := testenv.RequireExclusive(t)
	mcfg := metrics.DefaultConfig()
	mcfg.ReadyStaleAfter = 3 * time.Second
	e := newE2E(t, env, mcfg)
	stop := e.runRelay(t, e.relayConfig())
	e.waitReady(t, time.Minute, "relay start")

	w := outboxtest.NewWriter(e.conn, "outbox", e.shape, 12)
	ctx := context.Background()
	write := func(n int) {
		for i := 0; i < n; i++ {
			if err := w.Txn(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	produced := func() float64 { return scrape(t, e.srv.URL).sum("pgoutbox_events_produced_total") }
	write(20)
	testenv.Eventually(t, time.Minute, 50*time.Millisecond, func() (bool, string) {
		p := produced()
		return p == float64(w.Events()), fmt.Sprintf("produced %v of %d before the outage", p, w.Events())
	})

	env.KafkaStop(t, "TERM")
	write(20)
	before := w.Events()
	var body string
	testenv.Eventually(t, time.Minute, 100*time.Millisecond, func() (bool, string) {
		var code int
		code, body = e.readyz(t)
		return code == 503 && strings.Contains(body, "kafka"), fmt.Sprintf("Kafka down: /readyz %d %s", code, body)
	})
	t.Logf("Kafka down: 503 %s", body)
	// The loop keeps reporting while Kafka refuses, which is what keeps
	// /healthz at 200 (metrics.Live): for 8 s (more than twice
	// ready.stale.after), the reason stays "kafka", which needs a report
	// fresher than 3 s, never "stalled".
	for deadline := time.Now().Add(8 * time.Second); time.Now().Before(deadline); {
		code, body := e.readyz(t)
		if code != 503 || !strings.HasPrefix(body, "kafka") {
			t.Fatalf("Kafka still down: /readyz %d %q, want 503 kafka (the relay's loop must keep reporting)", code, body)
		}
		if code, hbody := get(t, e.srv.URL+"/healthz"); code != 200 {
			t.Fatalf("Kafka down: /healthz %d %q, want 200 (a restart mends nothing)", code, hbody)
		}
		<-time.After(250 * time.Millisecond) // the probes' pace, not synchronisation
	}
	if v := scrape(t, e.srv.URL).value("pgoutbox_ready"); v != 0 {
		t.Errorf("pgoutbox_ready %v while /readyz says 503", v)
	}

	env.KafkaStart(t)
	testenv.Eventually(t, 3*time.Minute, 100*time.Millisecond, func() (bool, string) {
		p := produced()
		code, body := e.readyz(t)
		// A resend after the outage may produce an event twice.
		return p >= float64(before) && code == 200, fmt.Sprintf("Kafka back: produced %v of %d; /readyz %d %s", p, before, code, body)
	})
	f := scrape(t, e.srv.URL)
	t.Logf("after the outage: %v sessions started; ended by kafka %v, other %v", f.value("pgoutbox_sessions_started_total"),
		f.value("pgoutbox_sessions_ended_total", "cause", "kafka"), f.value("pgoutbox_sessions_ended_total", "cause", "other"))
	if f.value("pgoutbox_sessions_ended_total", "cause", "postgres") != 0 || f.value("pgoutbox_sessions_ended_total", "cause", "fatal") != 0 {
		t.Errorf("a Kafka outage counted as a postgres or fatal session end")
	}
	if err := stop(); err != nil {
		t.Fatalf("relay stopped with %v", err)
	}
}

// TestPollerReportsALostSlotAsNotReady lowers max_slot_wal_keep_size until
// a checkpoint invalidates an unused slot, with the slot poller watching
// it: wal_status="lost" must show in the gauges and turn /readyz to 503
// even while a session streams. It changes a server setting, so it runs
// alone.
func TestPollerReportsALostSlotAsNotReady(t *testing.T) {
	env, dsn, _, slot := unusedSlot(t, "m")
	ctx := context.Background()
	m := newMetrics(t)
	srv := httptest.NewServer(m.Handler())
	t.Cleanup(srv.Close)
	pctx, cancel := context.WithCancel(ctx)
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		m.PollSlot(pctx, replication.Config{DSN: dsn, Slot: slot}, 100*time.Millisecond, zaptest.NewLogger(t))
	}()
	t.Cleanup(func() {
		cancel()
		<-polled
	})
	// A session is streaming as far as the metrics know.
	m.SessionStarted(1)
	testenv.Eventually(t, 30*time.Second, 50*time.Millisecond, func() (bool, string) {
		f := scrape(t, srv.URL)
		code, body := get(t, srv.URL+"/readyz")
		return f.value("pgoutbox_slot_wal_status", "status", "reserved") == 1 && code == 200,
			fmt.Sprintf("wal_status %v; /readyz %d %s", f["pgoutbox_slot_wal_status"], code, body)
	})

	env.LoseSlot(t, dsn, slot)
	var body string
	testenv.Eventually(t, 30*time.Second, 20*time.Millisecond, func() (bool, string) {
		f := scrape(t, srv.URL)
		var code int
		code, body = get(t, srv.URL+"/readyz")
		return f.value("pgoutbox_slot_wal_status", "status", "lost") == 1 && code == 503,
			fmt.Sprintf("wal_status %v; /readyz %d %s", f.labelValues("pgoutbox_slot_wal_status", "status"), code, body)
	})
	if !strings.Contains(body, "slot lost") {
		t.Fatalf("/readyz reason %q does not say the slot is lost", body)
	}
	t.Logf("lost slot: 503 %s", strings.TrimSpace(body))
}

// TestPollerWarnsNearMaxSlotWALKeepSize holds an unused slot while WAL
// grows towards max_slot_wal_keep_size (64 MB): the poller must log its
// warning once the slot retains 80% of the allowance, while the slot is
// still intact. It changes a server setting, so it runs alone.
func TestPollerWarnsNearMaxSlotWALKeepSize(t *testing.T) {
	env, dsn, conn, slot := unusedSlot(t, "w")
	ctx := context.Background()
	env.SetServerSetting(t, "max_slot_wal_keep_size", "64MB")
	if _, err := conn.Exec(ctx, "CREATE TABLE filler (note text)"); err != nil {
		t.Fatal(err)
	}
	m := newMetrics(t)
	core, logs := observer.New(zap.InfoLevel)
	pctx, cancel := context.WithCancel(ctx)
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		m.PollSlot(pctx, replication.Config{DSN: dsn, Slot: slot}, 50*time.Millisecond, zap.New(core))
	}()
	t.Cleanup(func() {
		cancel()
		<-polled
	})
	const warning = "replication slot is approaching max_slot_wal_keep_size"
	var written int
	testenv.Eventually(t, 90*time.Second, 10*time.Millisecond, func() (bool, string) {
		if n := logs.FilterMessageSnippet(warning).Len(); n > 0 {
			return true, ""
		}
		// About 2 MB of WAL per round, no checkpoint: the slot's
		// retained WAL grows towards the limit.
		if _, err := conn.Exec(ctx, "INSERT INTO filler SELECT repeat(md5(g::text), 8) FROM generate_series(1, 6000) g"); err != nil {
			return false, err.Error()
		}
		written++
		st, err := replication.ReadSlotStats(ctx, conn, slot)
		if err != nil {
			return false, err.Error()
		}
		u, _ := st.LimitUsage()
		return false, fmt.Sprintf("after %d rounds: retained %d bytes, usage %.2f, wal_status %s", written, st.RetainedWALBytes, u, st.WALStatus)
	})
	w := logs.FilterMessageSnippet(warning).All()[0]
	fields := w.ContextMap()
	t.Logf("warned after %d rounds: %v", written, fields)
	if w.Level != zap.WarnLevel {
		t.Errorf("logged at %v, want warn", w.Level)
	}
	retained, _ := fields["retained_wal_bytes"].(int64)
	safe, _ := fields["safe_wal_size"].(int64)
	if retained <= 0 || safe < 0 || float64(retained) < metrics.NearLimitWarn*float64(retained+safe) {
		t.Errorf("warned at retained %d, safe %d: below %.0f%% of the allowance", retained, safe, 100*metrics.NearLimitWarn)
	}
	st, err := replication.ReadSlotStats(ctx, conn, slot)
	if err != nil {
		t.Fatal(err)
	}
	if st.WALStatus == "lost" {
		t.Fatalf("the slot was lost before or at the warning: %+v", st)
	}
	if n := logs.FilterMessageSnippet(warning).Len(); n != 1 {
		t.Errorf("warned %d times, want once", n)
	}
}

// unusedSlot holds the environment exclusively (the callers change server
// settings) and creates a database with a slot nothing streams from.
func unusedSlot(t *testing.T, prefix string) (env *testenv.Env, dsn string, conn *pgx.Conn, slot string) {
	t.Helper()
	env = testenv.RequireExclusive(t)
	dsn = env.NewDatabase(t)
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	slot = strings.ToLower(testenv.UniqueName(t, prefix))
	if _, err := conn.Exec(context.Background(), "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", slot); err != nil {
		t.Fatal(err)
	}
	return env, dsn, conn, slot
}

func newMetrics(t *testing.T) *metrics.Metrics {
	t.Helper()
	m, err := metrics.New(prometheus.NewRegistry(), metrics.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestReadinessSeesAWalsenderThatSendsNothing: a walsender that sends
// nothing while the server's WAL moves on (one waiting for a standby named
// in synchronized_standby_slots, decoding a large transaction, or hung;
// here held with SIGSTOP, since a real server cannot be made to hang on
// demand) keeps its keepalives' WAL end where it was. /readyz said "idle
// and caught up" and the lag was 0 while events waited (an observability
// prober, 2 minutes and more). The relay's own read of the server's
// position shows it: not ready once the confirmed LSN has not advanced
// for ReadyStaleAfter, the lag counting up to that position; ready again
// once the walsender sends.
func TestReadinessSeesAWalsenderThatSendsNothing(t *testing.T) {
	env := testenv.Require(t)
	mcfg := metrics.DefaultConfig()
	mcfg.ReadyStaleAfter = 3 * time.Second
	e := newE2E(t, env, mcfg)
	stop := e.runRelay(t, e.relayConfig())
	e.waitReady(t, time.Minute, "relay start")
	ctx := context.Background()
	w := outboxtest.NewWriter(e.conn, "outbox", e.shape, 31)
	produced := func(want int) {
		t.Helper()
		testenv.Eventually(t, time.Minute, 50*time.Millisecond, func() (bool, string) {
			n := scrape(t, e.srv.URL).sum("pgoutbox_events_produced_total")
			return n == float64(want), fmt.Sprintf("%v of %d events produced", n, want)
		})
	}
	for range 10 {
		if err := w.Txn(ctx); err != nil {
			t.Fatal(err)
		}
	}
	produced(w.Events())
	var pid int
	if err := e.conn.QueryRow(ctx, "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1", e.name).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP walsender %d: %v", pid, err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	}
	t.Cleanup(resume)
	before := w.Events()
	for range 10 {
		if err := w.Txn(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// More WAL than the caught-up slack, from a table nobody relays.
	if _, err := e.conn.Exec(ctx, "CREATE TABLE other_work AS SELECT g, repeat('x', 200) AS pad FROM generate_series(1, 2000) g"); err != nil {
		t.Fatal(err)
	}
	var body string
	testenv.Eventually(t, 30*time.Second, 100*time.Millisecond, func() (bool, string) {
		var code int
		code, body = e.readyz(t)
		lag := scrape(t, e.srv.URL).value("pgoutbox_replication_lag_bytes")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "behind: the server's WAL was at") && lag > 64<<10,
			fmt.Sprintf("walsender stopped: /readyz %d %s; lag %v bytes", code, body, lag)
	})
	t.Logf("walsender stopped: %s", body)
	if n := scrape(t, e.srv.URL).sum("pgoutbox_events_produced_total"); n != float64(before) {
		t.Fatalf("%v events produced with the walsender stopped, want %d", n, before)
	}
	resume()
	produced(w.Events())
	t.Logf("walsender resumed: %s", e.waitReady(t, 30*time.Second, "walsender resumed"))
	if err := stop(); err != nil {
		t.Fatalf("relay stopped with %v", err)
	}
}
