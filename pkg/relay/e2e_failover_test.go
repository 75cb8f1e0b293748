package relay_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/pkg/outboxtest"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// TestFailoverSlotSurvivesAPromotion runs pgoutbox against a primary and a
// streaming standby, given both hosts (target_session_attrs=read-write), with
// a steady writer; then the primary is killed and the standby promoted.
// With postgres.slot.failover (PostgreSQL 17+) pgoutbox goes on from the
// synchronized slot on the new primary: every event the new primary has
// reaches Kafka, per key in order, duplicates only for what was not
// confirmed. Without it the slot does not exist on the new primary, and
// pgoutbox stops loudly instead of creating a new one.
func TestFailoverSlotSurvivesAPromotion(t *testing.T) {
	env := testenv.RequireExclusive(t)
	if major, _ := env.ServerVersion(t); major < 17 {
		t.Run("without slot.failover", func(t *testing.T) { failover(t, env, false) })
		t.Skipf("failover slots need PostgreSQL 17; this is %d (the case without them ran)", major)
	}
	t.Run("with slot.failover", func(t *testing.T) { failover(t, env, true) })
	t.Run("without slot.failover", func(t *testing.T) { failover(t, env, false) })
}

func failover(t *testing.T, env *testenv.Env, withFailover bool) {
	pair := env.NewPair(t)
	ctx := context.Background()
	name := strings.ToLower(testenv.UniqueName(t, "f"))
	pair.CreateDatabase(t, "app")
	dsn := pair.DSN("app")
	shape := outboxtest.DefaultShape()
	shape.DeletePct = 0 // the rows stay, so the new primary tells what it has
	var topics []string
	for i, a := range shape.AggregateTypes {
		shape.AggregateTypes[i] = name + "_" + a
		topic := "outbox.event." + shape.AggregateTypes[i]
		env.CreateTopic(t, topic, 3)
		topics = append(topics, topic)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	if err := outboxtest.Setup(ctx, conn, "outbox"); err != nil {
		t.Fatal(err)
	}
	c := env.NewConsumer(t, topics)
	logPath := filepath.Join(t.TempDir(), "relay.log")
	lf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	environ := append(os.Environ(),
		"PGOUTBOX_POSTGRES_DSN="+dsn,
		"PGOUTBOX_POSTGRES_SLOT_NAME="+name,
		"PGOUTBOX_POSTGRES_PUBLICATION_NAME="+name,
		"PGOUTBOX_POSTGRES_TABLE_INCLUDE_LIST=public.outbox",
		fmt.Sprintf("PGOUTBOX_POSTGRES_SLOT_FAILOVER=%v", withFailover),
		"PGOUTBOX_KAFKA_BROKERS="+strings.Join(env.KafkaBrokers, ","),
		"PGOUTBOX_RELAY_RESTART_BACKOFF=200ms",
		"PGOUTBOX_RELAY_RESTART_BACKOFF_MAX=1s",
		"PGOUTBOX_LOG_FORMAT=json",
	)
	p := startProcess(t, pgoutboxBinary(t), []string{"run"}, environ, lf, logPath)
	slotOn := func(port int, synced bool) (bool, string) {
		var n int
		q := "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '" + name + "'"
		if synced {
			// Synchronized and persisted: a synced slot that is still
			// temporary (not caught up) is dropped at a promotion.
			q += " AND (to_jsonb(pg_replication_slots) ->> 'synced')::bool AND NOT temporary AND (to_jsonb(pg_replication_slots) ->> 'failover')::bool"
		} else {
			q += " AND active"
		}
		err := pair.QueryRow(port, "postgres", q, &n)
		return err == nil && n == 1, fmt.Sprintf("slot on port %d (synced %v): %d, %v", port, synced, n, err)
	}
	testenv.Eventually(t, time.Minute, 50*time.Millisecond, func() (bool, string) { return slotOn(pair.PrimaryPort, false) })
	// A second instance: the standby of the first, on the same hosts.
	standbyLog := filepath.Join(t.TempDir(), "standby.log")
	sf, err := os.Create(standbyLog)
	if err != nil {
		t.Fatal(err)
	}
	standby := startProcess(t, pgoutboxBinary(t), []string{"run"}, environ, sf, standbyLog)

	// A steady writer that follows the primary.
	w := outboxtest.NewWriter(conn, "outbox", shape, 31)
	var mu sync.Mutex
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(20 * time.Millisecond) // a write rate
		defer tick.Stop()
		for i := 0; i < 5000; i++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			mu.Lock()
			err := w.Txn(ctx)
			mu.Unlock()
			if err != nil {
				// The primary went away: reconnect to whichever server
				// accepts writes, for at most a minute.
				deadline := time.Now().Add(time.Minute)
				for time.Now().Before(deadline) {
					select {
					case <-stop:
						return
					case <-tick.C:
					}
					if nc, err := pgx.Connect(ctx, dsn); err == nil {
						mu.Lock()
						w.SetConn(nc)
						mu.Unlock()
						break
					}
				}
			}
		}
	}()
	written := func() int { mu.Lock(); defer mu.Unlock(); return w.Events() }
	testenv.Eventually(t, time.Minute, 50*time.Millisecond, func() (bool, string) { return written() >= 100, "writer" })
	if withFailover {
		// The standby persists its copy once it has caught up with the
		// slot, which its sync worker checks every few seconds at first
		// and less often later: up to a minute or more here.
		testenv.Eventually(t, 3*time.Minute, 100*time.Millisecond, func() (bool, string) { return slotOn(pair.StandbyPort, true) })
	}
	pair.KillPrimary(t)
	pair.Promote(t)

	if !withFailover {
		code := p.wait(t, 2*time.Minute)
		close(stop)
		<-done
		out, _ := os.ReadFile(logPath)
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		last := lines[len(lines)-1]
		if code == 0 || !strings.Contains(last, "does not exist, but pgoutbox used it") {
			t.Fatalf("exit %d, last line %q: want the loud stop about the vanished slot", code, last)
		}
		if ok, _ := slotOn(pair.StandbyPort, false); ok {
			t.Fatal("a slot was created on the new primary")
		}
		return
	}
	before := written()
	testenv.Eventually(t, 2*time.Minute, 50*time.Millisecond, func() (bool, string) {
		return written() >= before+100, "the writer did not get going on the new primary"
	})
	close(stop)
	<-done
	// What the new primary has is what must be delivered.
	nc, err := pgx.Connect(ctx, pair.ServerDSN(pair.StandbyPort, "app"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close(ctx)
	rows, err := nc.Query(ctx, "SELECT id::text FROM outbox")
	if err != nil {
		t.Fatal(err)
	}
	has, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	present := map[string]bool{}
	for _, id := range has {
		present[id] = true
	}
	var onPrimary []outboxtest.Event
	for _, e := range w.Committed {
		if present[e.ID] {
			onPrimary = append(onPrimary, e)
		}
	}
	for id, e := range w.Uncertain {
		if present[id] {
			onPrimary = append(onPrimary, e)
		}
	}
	waitAll(t, c, &outboxtest.Writer{Committed: onPrimary}, 2*time.Minute)
	select {
	case <-standby.done:
		out, _ := os.ReadFile(standbyLog)
		t.Fatalf("the standby instance exited across the promotion: %v\n%s", standby.err, out)
	default:
	}
	p.terminate(t, time.Minute)
	standby.terminate(t, time.Minute)
	var total int64
	for _, hw := range env.HighWater(t, topics) {
		total += hw
	}
	testenv.Eventually(t, time.Minute, 50*time.Millisecond, func() (bool, string) {
		return int64(c.Len()) >= total, "consumer"
	})
	// Expected: what the new primary has, and what pgoutbox relayed from
	// the old one before it died (those events may be missing on the new
	// primary, which the old one had not sent them to yet).
	got := map[string]bool{}
	for _, m := range c.Messages() {
		id, _ := m.Header("id")
		got[string(id)] = true
	}
	var committed []outboxtest.Event
	for _, e := range w.Committed {
		if present[e.ID] || got[e.ID] {
			committed = append(committed, e)
		}
	}
	for id, e := range w.Uncertain {
		if present[id] || got[id] {
			committed = append(committed, e)
		}
	}
	sort.Slice(committed, func(i, j int) bool { return committed[i].Seq < committed[j].Seq })
	rep := outboxtest.Check(committed, w.RolledBack, delivered(c.Messages()), sessionStarts(t, logPath, standbyLog))
	t.Logf("%d events written, %d on the new primary: %s", len(w.Committed), len(onPrimary), rep)
	if !rep.OK() {
		t.Fatalf("after the promotion: %s", rep)
	}
	if out, _ := os.ReadFile(logPath); !strings.Contains(string(out), "replication started") {
		t.Fatal("no session started")
	}
	// The instance that took over after the promotion read where the old
	// timeline ended from the new primary's history (TIMELINE_HISTORY):
	// exactly-once relies on it.
	forked := regexp.MustCompile(`"msg":"PostgreSQL changed timeline[^\n]*"recorded_timeline":1,"timeline":2,"fork_lsn":"[0-9A-F]+/[0-9A-F]+"`)
	primaryOut, _ := os.ReadFile(logPath)
	standbyOut, _ := os.ReadFile(standbyLog)
	if !forked.Match(primaryOut) && !forked.Match(standbyOut) {
		t.Fatal("no instance logged the timeline change with where the old timeline ended")
	}
}
