package relay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/pgoutbox/checkpoint"
	"github.com/pgoutbox/pgoutbox/pkg/outboxtest"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// waitAll waits until every committed event has arrived at least once and
// returns everything consumed so far.
func waitAll(t *testing.T, c *testenv.Consumer, w *outboxtest.Writer, timeout time.Duration) []testenv.Message {
	t.Helper()
	want := make(map[string]bool, len(w.Committed))
	for _, e := range w.Committed {
		want[e.ID] = true
	}
	var msgs []testenv.Message
	testenv.Eventually(t, timeout, 50*time.Millisecond, func() (bool, string) {
		msgs = c.Messages()
		seen := make(map[string]bool, len(want))
		for _, m := range msgs {
			if id, ok := m.Header("id"); ok && want[string(id)] {
				seen[string(id)] = true
			}
		}
		if len(seen) == len(want) {
			return true, ""
		}
		first, last := -1, -1
		for _, e := range w.Committed {
			if !seen[e.ID] {
				if first < 0 {
					first = e.Seq
				}
				last = e.Seq
			}
		}
		return false, fmt.Sprintf("%d of %d committed events delivered (%d records); missing seq %d..%d", len(seen), len(want), len(msgs), first, last)
	})
	return msgs
}

// drain waits until the consumer has read every record the test's topics
// hold (their high-water marks; the topics are the test's own, so they
// start at offset 0) and returns all of them.
func drain(t *testing.T, c *testenv.Consumer, f *fixture) []testenv.Message {
	t.Helper()
	var total int64
	for _, hw := range f.env.HighWater(t, f.topics) {
		total += hw
	}
	testenv.Eventually(t, time.Minute, 50*time.Millisecond, func() (bool, string) {
		return int64(c.Len()) >= total, fmt.Sprintf("read %d of %d records", c.Len(), total)
	})
	return c.Messages()
}

// waitDelivered waits until c has read n records; when is the moment of
// the test, and w's events written so far are in the failure.
func waitDelivered(t *testing.T, c *testenv.Consumer, n int, timeout time.Duration, w interface{ Events() int }, when string) {
	t.Helper()
	testenv.Eventually(t, timeout, 5*time.Millisecond, func() (bool, string) {
		return c.Len() >= n, fmt.Sprintf("%s: %d records delivered, want %d (%d events written)", when, c.Len(), n, w.Events())
	})
}

// requireNoLoss fails unless every committed event arrived, in commit
// order per key, with nothing rolled back or unknown. Duplicates are
// allowed: the caller checks them as its scenario permits.
func requireNoLoss(t *testing.T, when string, rep outboxtest.Report) {
	t.Helper()
	if len(rep.Missing)+len(rep.Unexpected)+len(rep.Mismatched)+len(rep.OutOfOrder) > 0 {
		t.Fatalf("%s: %s", when, rep)
	}
}

// slotReleased waits until the killed relay's walsender let go of the slot
// and returns the slot's confirmed position.
func slotReleased(t *testing.T, f *fixture) checkpoint.LSN {
	t.Helper()
	var confirmed checkpoint.LSN
	testenv.Eventually(t, 30*time.Second, 20*time.Millisecond, func() (bool, string) {
		var active bool
		confirmed, active = f.slotState(t)
		return !active, "slot still active"
	})
	return confirmed
}

// TestSIGKILLMidStreamLosesNothing kills the binary with SIGKILL five times
// while a writer is busy and restarts it each time: nothing may be lost, the
// first deliveries per key must be in commit order, and every duplicate must
// belong to a transaction the slot had not confirmed at the kill.
func TestSIGKILLMidStreamLosesNothing(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 3)
	w := outboxtest.NewWriter(f.conn, "outbox", f.shape, 3)
	c := env.NewConsumer(t, f.topics)
	p := startBinary(t, f, "pgoutbox-0.log")
	logs := []string{p.log}
	bw := startWriter(w, 3000)
	for kill := 1; kill <= 5; kill++ {
		// Kill once the relay is delivering, at a moment that moves with
		// each round.
		waitDelivered(t, c, c.Len()+1500+397*kill, 90*time.Second, bw, fmt.Sprintf("round %d", kill))
		if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		p.wait(t, 30*time.Second)
		t.Logf("kill %d: slot confirmed at %s after %d records delivered", kill, slotReleased(t, f), c.Len())
		p = startBinary(t, f, fmt.Sprintf("pgoutbox-%d.log", kill))
		logs = append(logs, p.log)
	}
	bw.Stop(t)
	msgs := waitAll(t, c, w, 3*time.Minute)
	p.terminate(t, 60*time.Second)
	msgs = drain(t, c, f)
	// Duplicates are explained by each session's logged start: a produce
	// request of a killed relay may still be appended after the high-water
	// marks looked stable.
	rep := outboxtest.Check(w.Committed, w.RolledBack, delivered(msgs), sessionStarts(t, logs...))
	t.Logf("5 SIGKILLs: %s", rep)
	if !rep.OK() {
		t.Fatalf("after SIGKILLs: %s", rep)
	}
}

// TestKafkaDownHoldsTheSlotAndRecovers stops Kafka for 30 s mid-stream. The
// slot must not be confirmed past the first transaction Kafka did not
// acknowledge, the relay's memory stays bounded by its in-flight caps, and
// after Kafka returns everything arrives without help.
func TestKafkaDownHoldsTheSlotAndRecovers(t *testing.T) {
	env := testenv.RequireExclusive(t)
	f := newFixture(t, env, 3)
	w := outboxtest.NewWriter(f.conn, "outbox", f.shape, 4)
	c := env.NewConsumer(t, f.topics)
	p := startBinary(t, f, "pgoutbox.log")
	ctx := context.Background()
	for i := 0; i < 3000 && c.Len() < 2000; i++ {
		if err := w.Txn(ctx); err != nil {
			t.Fatal(err)
		}
	}
	waitAll(t, c, w, 2*time.Minute)

	env.KafkaStop(t, "TERM")
	downAt := len(w.Committed)
	stopped := time.Now()
	// The first transaction written while Kafka is down cannot have been
	// acknowledged; the slot must stay below its commit.
	var firstDown checkpoint.LSN
	var maxRSS int64
	tick := time.NewTicker(20 * time.Millisecond) // a write rate, not synchronisation
	defer tick.Stop()
	for time.Since(stopped) < 30*time.Second {
		<-tick.C
		if err := w.Txn(ctx); err != nil {
			t.Fatal(err)
		}
		if firstDown == 0 && len(w.Committed) > downAt {
			firstDown = w.Committed[downAt].TxnHigh
		}
		if confirmed, _ := f.slotState(t); firstDown != 0 && confirmed >= firstDown {
			t.Fatalf("slot confirmed %s, at or past the first unacknowledged transaction (commit end <= %s)", confirmed, firstDown)
		}
		maxRSS = max(maxRSS, p.peakRSS())
		if w.Txns > 100000 {
			break
		}
	}
	// 5,000 records or 8 MiB in flight by default, plus the process itself.
	if maxRSS > 128<<20 {
		t.Fatalf("peak RSS %d MB while Kafka was down", maxRSS>>20)
	}
	t.Logf("Kafka down %s; %d events written meanwhile; peak RSS %d MB", time.Since(stopped).Round(time.Second), len(w.Committed)-downAt, maxRSS>>20)
	env.KafkaStart(t)
	msgs := waitAll(t, c, w, 3*time.Minute)
	p.terminate(t, 60*time.Second)
	msgs = drain(t, c, f)
	rep := outboxtest.Check(w.Committed, w.RolledBack, delivered(msgs), nil)
	t.Logf("%s", rep)
	// A resend after the outage may duplicate what Kafka had appended but not
	// acknowledged; nothing may be missing or out of order.
	requireNoLoss(t, "after Kafka outage", rep)
}

// TestDatabaseFastShutdownIsNotHeldUpByTheRelay stops PostgreSQL with
// pg_ctl stop -m fast while the relay is connected: the walsender waits for
// its client to confirm the end of WAL, so a relay that never confirms idle
// keepalives would hold the shutdown up. Then the relay must reconnect by
// itself once the server is back.
func TestDatabaseFastShutdownIsNotHeldUpByTheRelay(t *testing.T) {
	env := testenv.RequireExclusive(t)
	f := newFixture(t, env, 1)
	w := outboxtest.NewWriter(f.conn, "outbox", f.shape, 5)
	c := env.NewConsumer(t, f.topics)
	p := startBinary(t, f, "pgoutbox.log")
	ctx := context.Background()
	for i := 0; i < 20; i++ {
		if err := w.Txn(ctx); err != nil {
			t.Fatal(err)
		}
	}
	waitAll(t, c, w, time.Minute)
	start := time.Now()
	env.PGCtl(t, "stop", "-m", "fast", "-t", "30")
	took := time.Since(start)
	t.Logf("pg_ctl stop -m fast took %s", took)
	if took > 10*time.Second {
		t.Fatalf("pg_ctl stop -m fast took %s with the relay connected", took)
	}
	env.PGCtl(t, "start", "-w", "-t", "60")
	// The writer's connection died with the server.
	f.reconnect(t)
	w2 := outboxtest.NewWriter(f.conn, "outbox", f.shape, 6)
	for i := 0; i < 20; i++ {
		if err := w2.Txn(ctx); err != nil {
			t.Fatal(err)
		}
	}
	waitAll(t, c, w2, 2*time.Minute)
	p.terminate(t, 60*time.Second)
}

// TestDatabaseFastShutdownWithKafkaFrozenIsNotHeldUp stops PostgreSQL with
// pg_ctl stop -m fast while the broker is frozen (SIGSTOP) and the relay
// has records in flight. The walsender waits for its client to confirm the
// end of WAL, which the relay cannot: Kafka has not acknowledged it. The
// relay must notice the shutdown (its catalog check is refused with 57P03)
// and end the stream, so that the server stops within seconds, not when
// Kafka comes back; and nothing may be lost: what was in flight is sent
// again once both are back.
func TestDatabaseFastShutdownWithKafkaFrozenIsNotHeldUp(t *testing.T) {
	env := testenv.RequireExclusive(t)
	f := newFixture(t, env, 1)
	ctx := context.Background()
	w := outboxtest.NewWriter(f.conn, "outbox", f.shape, 7)
	c := env.NewConsumer(t, f.topics)
	p := startBinary(t, f, "pgoutbox.log")
	writeTxns(t, w, 20)
	waitAll(t, c, w, time.Minute)
	env.KafkaPause(t)
	resumed := false
	defer func() {
		if !resumed {
			env.KafkaResume(t)
		}
	}()
	writeTxns(t, w, 20)
	// The relay has read them (records in flight that Kafka does not
	// answer), so the walsender has sent WAL the relay cannot confirm.
	want := f.walLSN(t)
	testenv.Eventually(t, 30*time.Second, 50*time.Millisecond, func() (bool, string) {
		var sent string
		err := f.checkDB.QueryRow(ctx, "SELECT coalesce(sent_lsn::text, '') FROM pg_stat_replication r JOIN pg_replication_slots s ON s.active_pid = r.pid WHERE s.slot_name = $1", f.slot).Scan(&sent)
		end, _ := parseLSN(sent)
		return err == nil && end >= want, fmt.Sprintf("the walsender has not sent the WAL written while Kafka is frozen, up to %s (sent %q, err %v)", want, sent, err)
	})
	start := time.Now()
	env.PGCtl(t, "stop", "-m", "fast", "-t", "60")
	took := time.Since(start)
	t.Logf("pg_ctl stop -m fast with Kafka frozen took %s", took.Round(time.Millisecond))
	if took > 10*time.Second {
		t.Fatalf("pg_ctl stop -m fast took %s with Kafka frozen and the relay connected: the relay held the shutdown up", took)
	}
	env.KafkaResume(t)
	resumed = true
	// The session's end is logged once its producer is closed, which
	// waits for what Kafka still held.
	line := p.waitLog(t, "PostgreSQL is shutting down", time.Minute)
	t.Logf("the relay: %s", line)
	env.PGCtl(t, "start", "-w", "-t", "60")
	f.reconnect(t)
	// One writer throughout, so that per key its sequence is commit order.
	w.SetConn(f.conn)
	writeTxns(t, w, 20)
	waitAll(t, c, w, 2*time.Minute)
	p.terminate(t, time.Minute)
	// What Kafka had not acknowledged when the stream ended is resent by
	// the next session: duplicates, explained by its start.
	requireOK(t, "after a fast shutdown with Kafka frozen", outboxtest.Check(w.Committed, w.RolledBack, delivered(drain(t, c, f)), sessionStarts(t, p.log)))
}

// requireOK logs rep and fails the test unless it is OK (duplicates
// explained by restarts are).
func requireOK(t *testing.T, when string, rep outboxtest.Report) {
	t.Helper()
	t.Logf("%s: %s", when, rep)
	if !rep.OK() {
		t.Fatalf("%s: %s", when, rep)
	}
}

// TestServerShutdownKeepsTheSlotWithinTheFence: PostgreSQL's fast shutdown
// waits for the relay to confirm the end of its WAL, and refuses the
// connection the fence is raised on (and the catalog check). The relay
// must not confirm past either then: it ends the stream instead (see
// TestDatabaseFastShutdownWithKafkaFrozenIsNotHeldUp). Killed while the
// server is down, it must find the slot within its fence once the server
// is back, start without a warning or a cleanup hold, and deliver what
// comes next. Then the slot is moved to the server's shutdown checkpoint,
// as earlier versions left it when they confirmed the end of WAL at a
// shutdown (or as someone would who advanced it to the end of WAL after
// the restart): the start must warn, naming both positions, hold cleanup
// and go on.
func TestServerShutdownKeepsTheSlotWithinTheFence(t *testing.T) {
	env := testenv.RequireExclusive(t)
	f := newFixture(t, env, 1)
	ctx := context.Background()
	c := env.NewConsumer(t, f.topics)
	w := outboxtest.NewWriter(f.conn, "outbox", f.shape, 41)
	p := startBinary(t, f, "first.log")
	writeTxns(t, w, 20)
	waitAll(t, c, w, time.Minute)
	env.PGCtl(t, "stop", "-m", "fast", "-t", "30")
	// Killed while it retries: it records no stop.
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	p.wait(t, 30*time.Second)
	env.PGCtl(t, "start", "-w", "-t", "60")
	f.reconnect(t)
	confirmed, _ := f.slotState(t)
	fence := f.fence(t)
	ckpt := f.shutdownCheckpoint(t)
	t.Logf("after the fast shutdown: slot at %s, fence at %s, shutdown checkpoint at %s", confirmed, fence, ckpt)
	if confirmed > fence {
		t.Fatalf("the relay confirmed %s, past its fence %s, as the server shut down", confirmed, fence)
	}
	q := startBinary(t, f, "second.log")
	w2 := outboxtest.NewWriter(f.conn, "outbox", f.shape, 42)
	writeTxns(t, w2, 20)
	waitAll(t, c, w2, time.Minute)
	q.terminate(t, time.Minute)
	if lines := q.logLines(t, "past the recorded fence"); len(lines) > 0 {
		t.Fatalf("a start after a fast shutdown warned of the fence:\n%s", strings.Join(lines, "\n"))
	}
	if hold := f.cleanupHold(t); hold != "" {
		t.Fatalf("cleanup held after a fast shutdown: %s", hold)
	}

	// The slot where an earlier version left it: at the shutdown
	// checkpoint of a restart since the last session began.
	env.PGCtl(t, "stop", "-m", "fast", "-t", "30")
	env.PGCtl(t, "start", "-w", "-t", "60")
	f.reconnect(t)
	fence, ckpt = f.fence(t), f.shutdownCheckpoint(t)
	if _, err := f.checkDB.Exec(ctx, "SELECT pg_replication_slot_advance($1, $2::text::pg_lsn)", f.slot, ckpt.String()); err != nil {
		t.Fatal(err)
	}
	confirmed, _ = f.slotState(t)
	if confirmed <= fence {
		t.Fatalf("the slot advanced to the shutdown checkpoint %s is at %s, not past the fence %s", ckpt, confirmed, fence)
	}
	r := startBinary(t, f, "third.log")
	line := r.waitLog(t, "past the recorded fence", time.Minute)
	if !strings.Contains(line, `"at_shutdown_checkpoint":true`) || !strings.Contains(line, confirmed.String()) || !strings.Contains(line, fence.String()) {
		t.Fatalf("the start's warning does not name the slot at the shutdown checkpoint %s and the fence %s: %s", confirmed, fence, line)
	}
	w3 := outboxtest.NewWriter(f.conn, "outbox", f.shape, 43)
	writeTxns(t, w3, 20)
	waitAll(t, c, w3, time.Minute)
	r.terminate(t, time.Minute)
	if hold := f.cleanupHold(t); !strings.Contains(hold, "may never have been relayed") {
		t.Errorf("cleanup hold %q after a start with the slot past the fence at the shutdown checkpoint, want one", hold)
	}
}

// writeTxns writes n transactions with w.
func writeTxns(t *testing.T, w *outboxtest.Writer, n int) {
	t.Helper()
	for range n {
		if err := w.Txn(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// shutdownCheckpoint is the server's latest checkpoint, which just after
// a start is its shutdown checkpoint.
func (f *fixture) shutdownCheckpoint(t *testing.T) checkpoint.LSN {
	t.Helper()
	return f.queryLSN(t, "SELECT checkpoint_lsn::text FROM pg_control_checkpoint()")
}

// logLines returns the lines of the process's log that contain substr.
func (p *process) logLines(t testing.TB, substr string) []string {
	t.Helper()
	data, err := os.ReadFile(p.log)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		if strings.Contains(line, substr) {
			out = append(out, line)
		}
	}
	return out
}

// waitLog waits until the process has logged a line containing substr and
// returns the first such line.
// sigterm sends the process SIGTERM and waits at most timeout for its
// exit: its code, and how long it took from the signal's sending.
func (p *process) sigterm(t testing.TB, timeout time.Duration, what string) (code int, took time.Duration) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	sent := time.Now()
	code = p.wait(t, timeout)
	took = time.Since(sent)
	t.Logf("%s: exit %d after %s", what, code, took.Round(time.Millisecond))
	return code, took
}

func (p *process) waitLog(t testing.TB, substr string, timeout time.Duration) string {
	t.Helper()
	var line string
	testenv.Eventually(t, timeout, 20*time.Millisecond, func() (bool, string) {
		if l := p.logLines(t, substr); len(l) > 0 {
			line = l[0]
			return true, ""
		}
		return false, fmt.Sprintf("no log line with %q in %s", substr, p.log)
	})
	return line
}

// metricsAddr is the address the process serves /readyz on (it was started
// with PGOUTBOX_METRICS_LISTEN=127.0.0.1:0).
func (p *process) metricsAddr(t testing.TB) string {
	t.Helper()
	var rec struct {
		Addr string `json:"addr"`
	}
	line := p.waitLog(t, `"msg":"serving /metrics`, 30*time.Second)
	if err := json.Unmarshal([]byte(line), &rec); err != nil || rec.Addr == "" {
		t.Fatalf("no address in %s (%v)", line, err)
	}
	return rec.Addr
}

// readyz asks the process's /readyz.
func readyz(t testing.TB, addr string) (code int, body string) {
	t.Helper()
	client := http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get("http://" + addr + "/readyz")
	if err != nil {
		t.Fatalf("GET /readyz: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET /readyz: %v", err)
	}
	return resp.StatusCode, strings.TrimSpace(string(b))
}

// withOptions returns the URL dsn with PostgreSQL settings for the session
// (libpq's options, e.g. "-c wal_sender_timeout=5s"): a replication
// connection made with it runs its walsender with them.
func withOptions(t testing.TB, dsn, options string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("options", options)
	// pgconn does not read "+" in a query as a space.
	u.RawQuery = strings.ReplaceAll(q.Encode(), "+", "%20")
	return u.String()
}

// replicationConn opens a replication=database connection as the relay does
// (pgconn's parse of the DSN, plus replication=database and an application
// name).
func replicationConn(t testing.TB, dsn, applicationName string) *pgconn.PgConn {
	t.Helper()
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["replication"] = "database"
	cfg.RuntimeParams["application_name"] = applicationName
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("replication connection: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// walSenderTimeout is the wal_sender_timeout a walsender started with dsn
// runs with.
func walSenderTimeout(t testing.TB, dsn string) time.Duration {
	t.Helper()
	conn := replicationConn(t, dsn, "pgoutbox-test-show")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := conn.Exec(ctx, "SHOW wal_sender_timeout").ReadAll()
	if err != nil || len(res) != 1 || len(res[0].Rows) != 1 {
		t.Fatalf("SHOW wal_sender_timeout on a replication connection: %v %v", res, err)
	}
	text := string(res[0].Rows[0][0])
	// SHOW prints the largest unit that divides the value: 5s, 1min, 500ms.
	d, err := time.ParseDuration(strings.Replace(strings.Replace(text, "min", "m", 1), "d", "h", 1))
	if err != nil {
		t.Fatalf("wal_sender_timeout %q: %v", text, err)
	}
	if strings.HasSuffix(text, "d") {
		d *= 24
	}
	return d
}

// probeName is the application name of startSilentClient's walsender.
const probeName = "pgoutbox-silent-probe"

// startSilentClient starts a replication client that never answers, on a
// slot of its own in f's database: its walsender must end with "replication
// timeout" after wal_sender_timeout, which shows that the test can see
// such an end in the server's log.
func startSilentClient(t testing.TB, f *fixture, dsn string) {
	t.Helper()
	slot := strings.ToLower(testenv.UniqueName(t, "probe"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := f.checkDB.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", slot); err != nil {
		t.Fatal(err)
	}
	conn := replicationConn(t, dsn, probeName)
	err := pglogrepl.StartReplication(ctx, conn, slot, 0, pglogrepl.StartReplicationOptions{
		Mode: pglogrepl.LogicalReplication, PluginArgs: []string{"proto_version '1'", "publication_names '" + f.pub + "'"}})
	if err != nil {
		t.Fatalf("start the silent replication client: %v", err)
	}
}

// frozenKafka is a relay streaming the fixture's first topic while Kafka
// is paused and its other topics are new to the session.
type frozenKafka struct {
	r      *faultRun
	log    testenv.PGLog
	dsn    string // the relay's DSN (with the walsender's timeout)
	wst    time.Duration
	addr   string // /readyz
	first  *outboxtest.Writer
	others *outboxtest.Writer
	paused time.Time
}

// freezeKafka starts the relay with a DSN that gives its walsender
// wal_sender_timeout wst (0: the server's, which the test checks is
// 60 s), delivers events of the first topic only, starts a silent
// replication client, pauses Kafka and writes events of every topic.
func freezeKafka(t *testing.T, env *testenv.Env, wst time.Duration, environ ...string) *frozenKafka {
	t.Helper()
	r := prepareFaultRun(t, env)
	fk := &frozenKafka{r: r, log: env.MarkPGLog(t), dsn: r.f.dsn, wst: wst}
	if wst > 0 {
		fk.dsn = withOptions(t, r.f.dsn, fmt.Sprintf("-c wal_sender_timeout=%dms", wst.Milliseconds()))
	} else {
		fk.wst = time.Minute
	}
	if got := walSenderTimeout(t, fk.dsn); got != fk.wst {
		t.Fatalf("a walsender of the relay's DSN runs with wal_sender_timeout %s, want %s", got, fk.wst)
	}
	r.environ = append(r.environ, "PGOUTBOX_POSTGRES_DSN="+fk.dsn, "PGOUTBOX_METRICS_LISTEN=127.0.0.1:0",
		"PGOUTBOX_METRICS_READY_STALE_AFTER=2s")
	r.environ = append(r.environ, environ...)
	r.restart()
	fk.addr = r.p.metricsAddr(t)

	// Events of the first topic only, delivered: the session knows that
	// topic and no other.
	first, others := r.f.shape, r.f.shape
	first.AggregateTypes = first.AggregateTypes[:1]
	others.AggregateTypes = others.AggregateTypes[1:]
	fk.first = outboxtest.NewWriter(r.f.conn, "outbox", first, 21)
	fk.others = outboxtest.NewWriter(r.f.conn, "outbox", others, 22)
	ctx := context.Background()
	for i := 0; i < 20; i++ {
		if err := fk.first.Txn(ctx); err != nil {
			t.Fatal(err)
		}
	}
	waitAll(t, r.c, fk.first, time.Minute)

	startSilentClient(t, r.f, fk.dsn)
	env.KafkaPause(t)
	fk.paused = time.Now()
	// Records for topics the session has not seen, and for the one it has.
	for i := 0; i < 10; i++ {
		if err := fk.others.Txn(ctx); err != nil {
			t.Fatal(err)
		}
		if err := fk.first.Txn(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return fk
}

// hold keeps writing (a transaction of each writer every 200 ms) until
// Kafka has been paused for d, checking /readyz: it must turn 503, naming
// Kafka, once the confirmed position has stood still for
// metrics.ready.stale.after (2 s).
func (fk *frozenKafka) hold(t *testing.T, d time.Duration) {
	t.Helper()
	ctx := context.Background()
	tick := time.NewTicker(200 * time.Millisecond) // a write rate, not synchronisation
	defer tick.Stop()
	var code int
	var body string
	for i := 0; time.Since(fk.paused) < d && i < 10_000; i++ {
		<-tick.C
		if err := fk.others.Txn(ctx); err != nil {
			t.Fatal(err)
		}
		if err := fk.first.Txn(ctx); err != nil {
			t.Fatal(err)
		}
		fk.r.peakRSS = max(fk.r.peakRSS, fk.r.p.peakRSS())
		if code != http.StatusServiceUnavailable {
			code, body = readyz(t, fk.addr)
		}
	}
	if code != http.StatusServiceUnavailable || !strings.Contains(strings.ToLower(body), "kafka") {
		t.Fatalf("/readyz with Kafka paused for %s: %d %q, want 503 naming Kafka", d.Round(time.Second), code, body)
	}
	t.Logf("/readyz with Kafka paused: %d %s", code, body)
}

// checkWalsenders checks the server's log since the test began: the
// relay's walsender was never ended for a replication timeout, and the
// silent client's was (so the check can see one).
func (fk *frozenKafka) checkWalsenders(t *testing.T) {
	t.Helper()
	db := "@" + databaseOf(t, fk.r.f.dsn) + " "
	testenv.Eventually(t, fk.wst+30*time.Second, 200*time.Millisecond, func() (bool, string) {
		n := len(fk.log.Lines(t, db+probeName+":", "replication timeout"))
		return n > 0, fmt.Sprintf("the silent client's walsender (wal_sender_timeout %s) did not end with a replication timeout in the server's log", fk.wst)
	})
	if lines := fk.log.Lines(t, db+"pgoutbox:", "timeout"); len(lines) > 0 {
		t.Fatalf("the relay's walsender timed out with Kafka paused:\n%s", strings.Join(lines, "\n"))
	}
}

func databaseOf(t testing.TB, dsn string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimPrefix(u.Path, "/")
}

// finish waits for every event after Kafka is back, stops the relay and
// checks what arrived; duplicates must be explained by the sessions the
// logs show.
func (fk *frozenKafka) finish(t *testing.T) outboxtest.Report {
	t.Helper()
	r := fk.r
	waitAll(t, r.c, fk.first, 5*time.Minute)
	waitAll(t, r.c, fk.others, 5*time.Minute)
	r.peakRSS = max(r.peakRSS, r.p.peakRSS())
	r.p.terminate(t, time.Minute)
	// The writers' topics are disjoint, so their sequences never meet in
	// one key's order.
	committed := append(slices.Clone(fk.first.Committed), fk.others.Committed...)
	rolledBack := maps.Clone(fk.first.RolledBack)
	maps.Copy(rolledBack, fk.others.RolledBack)
	rep := outboxtest.Check(committed, rolledBack, delivered(drain(t, r.c, r.f)), sessionStarts(t, r.logs...))
	report(t, rep, time.Since(r.start), r.peakRSS)
	if !rep.OK() {
		t.Fatalf("%s", rep)
	}
	return rep
}

// TestKafkaFrozen freezes the broker (SIGSTOP: connections stay open, no
// request is answered) while the relay has records in flight, including
// records for topics it has not seen in the session, which it must check
// off its loop. The relay must keep answering PostgreSQL (its walsender is
// never ended for a replication timeout, while a silent client's is),
// report Kafka in /readyz, and stop within relay.shutdown.timeout when told
// to. The fast form gives the relay's walsender wal_sender_timeout=5s
// through the DSN's options and pauses Kafka 15 s; the full form keeps
// the server's 60 s and pauses it 90 s and 2 minutes.
func TestKafkaFrozen(t *testing.T) {
	wst := pick(5*time.Second, 0)
	t.Run("kafka-frozen-new-topics", func(t *testing.T) {
		env := testenv.RequireExclusive(t)
		fk := freezeKafka(t, env, wst)
		fk.hold(t, pick(15*time.Second, 90*time.Second))
		env.KafkaResume(t)
		fk.checkWalsenders(t)
		rep := fk.finish(t)
		if n := len(fk.r.p.logLines(t, `"msg":"replication started"`)); n != 1 || rep.Duplicates != 0 {
			t.Fatalf("%d sessions and %d duplicates: the session did not ride out the pause", n, rep.Duplicates)
		}
	})

	t.Run("kafka-frozen-sigterm", func(t *testing.T) {
		env := testenv.RequireExclusive(t)
		const shutdown = 5 * time.Second
		fk := freezeKafka(t, env, wst, "PGOUTBOX_RELAY_SHUTDOWN_TIMEOUT=5s")
		fk.hold(t, pick(3*wst, 2*time.Minute))
		fk.checkWalsenders(t)
		code, took := fk.r.p.sigterm(t, time.Minute, "SIGTERM with Kafka paused")
		if code != 0 || took > shutdown+2*time.Second {
			t.Fatalf("SIGTERM with Kafka paused: exit %d after %s, want 0 within relay.shutdown.timeout (%s) + 2 s", code, took, shutdown)
		}
		fk.r.p.waitLog(t, "stopping with events not confirmed to PostgreSQL", time.Second)
		env.KafkaResume(t)
		fk.r.restart()
		fk.finish(t)
	})

	t.Run("servers-frozen-sigterm", func(t *testing.T) {
		// Both servers hang: the broker, and every backend of the relay
		// (its walsender, the catalog watcher's, the slot membership's),
		// held with SIGSTOP, which a real server cannot be made to do on
		// demand. The stop's budget still holds: every step past the
		// drain gives up at its end.
		env := testenv.RequireExclusive(t)
		const shutdown = 5 * time.Second
		fk := freezeKafka(t, env, wst, "PGOUTBOX_RELAY_SHUTDOWN_TIMEOUT=5s")
		fk.hold(t, 3*time.Second)
		ctx := context.Background()
		rows, err := fk.r.f.checkDB.Query(ctx, "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name LIKE 'pgoutbox%' AND pid <> pg_backend_pid()")
		if err != nil {
			t.Fatal(err)
		}
		pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		if err != nil || len(pids) < 2 {
			t.Fatalf("the relay's backends: %v %v; want its walsender and its catalog watcher's at least", pids, err)
		}
		for _, pid := range pids {
			if err := syscall.Kill(int(pid), syscall.SIGSTOP); err != nil {
				t.Fatalf("hold backend %d: %v", pid, err)
			}
		}
		resumed := false
		resume := func() {
			if !resumed {
				resumed = true
				for _, pid := range pids {
					_ = syscall.Kill(int(pid), syscall.SIGCONT)
				}
			}
		}
		defer resume()
		code, took := fk.r.p.sigterm(t, time.Minute, "SIGTERM with Kafka and the relay's backends held")
		resume()
		env.KafkaResume(t)
		// (Counted from the signal's sending, not its receipt.)
		if code != 0 || took > shutdown+300*time.Millisecond {
			t.Fatalf("SIGTERM with both servers held: exit %d after %s, want 0 within relay.shutdown.timeout (%s)", code, took, shutdown)
		}
		fk.r.restart()
		fk.finish(t)
	})

	t.Run("kafka-frozen-second-sigterm", func(t *testing.T) {
		env := testenv.RequireExclusive(t)
		// A budget far longer than the test waits: only the second
		// signal can end the stop in time.
		fk := freezeKafka(t, env, wst, "PGOUTBOX_RELAY_SHUTDOWN_TIMEOUT=2m")
		fk.hold(t, 3*time.Second)
		p := fk.r.p
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		p.waitLog(t, "stopping at the next transaction boundary", 10*time.Second)
		_, took := p.sigterm(t, 3*time.Minute, "second SIGTERM with Kafka paused")
		if took > 5*time.Second {
			t.Fatalf("the second SIGTERM took %s to stop the relay, want at once (under 5 s)", took)
		}
		line := p.waitLog(t, "stopping with events not confirmed to PostgreSQL", time.Second)
		var rec struct {
			InFlight int    `json:"records_in_flight"`
			Forced   bool   `json:"forced"`
			Lsn      string `json:"confirmed_lsn"`
		}
		if err := json.Unmarshal([]byte(line), &rec); err != nil || rec.InFlight == 0 || !rec.Forced || rec.Lsn == "" {
			t.Fatalf("the forced stop's log line does not say what was not confirmed (%v): %s", err, line)
		}
		env.KafkaResume(t)
		fk.r.restart()
		fk.finish(t)
	})
}

// TestSIGHUPStopsCleanlyAndARestartRepeatsNothing: SIGHUP is a clean stop
// like SIGTERM (a terminal that goes away must not kill the relay half-way):
// exit 0 at a transaction boundary with everything delivered confirmed, so
// that the next start repeats nothing.
func TestSIGHUPStopsCleanlyAndARestartRepeatsNothing(t *testing.T) {
	env := testenv.Require(t)
	r := newFaultRun(t, env, 17, 2*time.Millisecond)
	r.progress(1000)
	if err := r.p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	if code := r.p.wait(t, time.Minute); code != 0 {
		t.Fatalf("SIGHUP: exit code %d, want 0", code)
	}
	r.p.waitLog(t, "pgoutbox stopped", time.Second)
	r.restart()
	if rep := r.finish(); rep.Duplicates != 0 {
		t.Fatalf("a restart after SIGHUP repeated %d records", rep.Duplicates)
	}
}
