package testenv

import (
	"context"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

func connect(t *testing.T, dsn string) *pgx.Conn { return ConnectPG(t, dsn) }

// replicationConn opens a logical replication connection (replication=database).
func replicationConn(t *testing.T, dsn string) *pgconn.PgConn {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("replication", "database")
	u.RawQuery = q.Encode()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgconn.Connect(ctx, u.String())
	if err != nil {
		t.Fatalf("replication connection: %v", err)
	}
	return conn
}

func databaseName(t *testing.T, dsn string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimPrefix(u.Path, "/")
}

func queryString(t *testing.T, conn *pgx.Conn, sql string, args ...any) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var s string
	if err := conn.QueryRow(ctx, sql, args...).Scan(&s); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return s
}

func TestPostgresIsSetUpForLogicalReplication(t *testing.T) {
	e := Require(t)
	dsn := e.NewDatabase(t)
	conn := connect(t, dsn)
	if got := queryString(t, conn, "SHOW wal_level"); got != "logical" {
		t.Errorf("wal_level = %s, want logical", got)
	}
	if got := queryString(t, conn, "SHOW max_replication_slots"); got != "32" {
		t.Errorf("max_replication_slots = %s, want 32", got)
	}
	if got := queryString(t, conn, "SELECT current_database()"); got != databaseName(t, dsn) {
		t.Errorf("connected to %s, want the test's database %s", got, databaseName(t, dsn))
	}

	rc := replicationConn(t, dsn)
	defer func() { _ = rc.Close(context.Background()) }()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sys, err := pglogrepl.IdentifySystem(ctx, rc)
	if err != nil {
		t.Fatalf("IDENTIFY_SYSTEM: %v", err)
	}
	if sys.DBName != databaseName(t, dsn) || sys.XLogPos == 0 {
		t.Errorf("IDENTIFY_SYSTEM = %+v, want database %s and a WAL position", sys, databaseName(t, dsn))
	}
}

func TestNewDatabaseCleanupDropsSlotsAndConnections(t *testing.T) {
	e := Require(t)
	var name, active, inactive string
	var rc *pgconn.PgConn
	t.Run("holder", func(t *testing.T) {
		dsn := e.NewDatabase(t)
		name = databaseName(t, dsn)
		conn := connect(t, dsn)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		active, inactive = UniqueName(t, "active"), UniqueName(t, "idle")
		for _, sql := range []string{
			"CREATE TABLE outbox (id bigint PRIMARY KEY)",
			"CREATE PUBLICATION pub FOR TABLE outbox",
			"SELECT pg_create_logical_replication_slot('" + inactive + "', 'pgoutput')",
		} {
			if _, err := conn.Exec(ctx, sql); err != nil {
				t.Fatalf("%s: %v", sql, err)
			}
		}
		// An open replication connection streaming from a slot: the cleanup
		// has to terminate it before it can drop the slot and the database.
		rc = replicationConn(t, dsn)
		if _, err := pglogrepl.CreateReplicationSlot(ctx, rc, active, "pgoutput", pglogrepl.CreateReplicationSlotOptions{}); err != nil {
			t.Fatalf("create slot: %v", err)
		}
		err := pglogrepl.StartReplication(ctx, rc, active, 0, pglogrepl.StartReplicationOptions{
			PluginArgs: []string{"proto_version '1'", "publication_names 'pub'"},
		})
		if err != nil {
			t.Fatalf("start replication: %v", err)
		}
		Eventually(t, 30*time.Second, 20*time.Millisecond, func() (bool, string) {
			on := queryString(t, conn, "SELECT active::text FROM pg_replication_slots WHERE slot_name = $1", active)
			return on == "true", "slot active: " + on
		})
	})
	defer func() { _ = rc.Close(context.Background()) }()

	admin := connect(t, e.PGDSN)
	left := queryString(t, admin, `SELECT (SELECT count(*) FROM pg_database WHERE datname = $1)::text || ' ' ||
		(SELECT count(*) FROM pg_replication_slots WHERE slot_name IN ($2, $3))::text`, name, active, inactive)
	if left != "0 0" {
		t.Errorf("after the test: databases, slots left = %s, want 0 0", left)
	}
}

func TestUniqueNameFitsPostgresAndKafka(t *testing.T) {
	valid := regexp.MustCompile(`^[a-z][a-z0-9_]*$`)
	seen := map[string]bool{}
	for _, prefix := range []string{"db", "Slot-Name", "", "9lives", strings.Repeat("long", 20)} {
		name := UniqueName(t, prefix)
		if len(name) > 63 || !valid.MatchString(name) {
			t.Errorf("UniqueName(%q) = %q: not a lower-case identifier of at most 63 bytes", prefix, name)
		}
		if seen[name] {
			t.Errorf("UniqueName(%q) = %q twice", prefix, name)
		}
		seen[name] = true
	}
}

func TestRequireSkipsWithoutEnvironment(t *testing.T) {
	t.Setenv(envPGDSN, "")
	t.Setenv(envKafka, "")
	t.Setenv(envRequire, "")
	t.Setenv(envMarker, "")
	skipped := false
	t.Run("inner", func(t *testing.T) {
		defer func() { skipped = t.Skipped() }()
		Require(t)
		t.Error("Require returned without an environment")
	})
	if !skipped {
		t.Error("Require did not skip the test")
	}
}

func produce(t *testing.T, e *Env, topic string, key, value string) (partition int32, offset int64) {
	t.Helper()
	p := e.syncProducer(t)
	defer func() { _ = p.Close() }()
	partition, offset, err := p.SendMessage(&sarama.ProducerMessage{
		Topic:   topic,
		Key:     sarama.StringEncoder(key),
		Value:   sarama.StringEncoder(value),
		Headers: []sarama.RecordHeader{{Key: []byte("h"), Value: []byte("v-" + value)}},
	})
	if err != nil {
		t.Fatalf("produce to %s: %v", topic, err)
	}
	return partition, offset
}

func TestKafkaRoundTrip(t *testing.T) {
	e := Require(t)
	topic := UniqueName(t, "topic")
	e.CreateTopic(t, topic, 3)
	c := e.NewConsumer(t, []string{topic})
	partition, offset := produce(t, e, topic, "k1", "one")

	msgs := c.WaitFor(t, 1, 30*time.Second)
	if len(msgs) != 1 {
		t.Fatalf("got %d messages, want 1: %+v", len(msgs), msgs)
	}
	m := msgs[0]
	if m.Topic != topic || m.Partition != partition || m.Offset != offset ||
		string(m.Key) != "k1" || string(m.Value) != "one" || m.Timestamp.IsZero() {
		t.Errorf("got %+v, want k1=one at %s/%d@%d", m, topic, partition, offset)
	}
	if h, ok := m.Header("h"); !ok || string(h) != "v-one" {
		t.Errorf("header h = %q, %v; want v-one", h, ok)
	}
	if got := c.Poll(); len(got) != 1 {
		t.Errorf("first Poll: %d messages, want 1", len(got))
	}
	produce(t, e, topic, "k2", "two")
	c.WaitFor(t, 2, 30*time.Second)
	if got := c.Poll(); len(got) != 1 || string(got[0].Value) != "two" {
		t.Errorf("second Poll: %+v, want just two", got)
	}

	all := e.ConsumeAll(t, []string{topic}, 30*time.Second, func(n int) bool { return n >= 2 })
	if len(all) != 2 {
		t.Errorf("ConsumeAll: %d messages, want 2", len(all))
	}
	var sum int64
	hw := e.HighWater(t, []string{topic})
	for _, off := range hw {
		sum += off
	}
	if len(hw) != 3 || sum != 2 {
		t.Errorf("HighWater = %v, want 3 partitions holding 2 records", hw)
	}
}

func TestKafkaKeepsTopicsAcrossStopAndStart(t *testing.T) {
	e := RequireExclusive(t)
	topic := UniqueName(t, "topic")
	e.CreateTopic(t, topic, 2)
	produce(t, e, topic, "a", "before-term")

	e.KafkaStop(t, "TERM")
	e.KafkaStart(t)
	produce(t, e, topic, "b", "before-kill")

	e.KafkaStop(t, "KILL")
	e.KafkaStart(t)
	produce(t, e, topic, "c", "after-kill")

	msgs := e.ConsumeAll(t, []string{topic}, 60*time.Second, func(n int) bool { return n >= 3 })
	values := map[string]bool{}
	for _, m := range msgs {
		values[string(m.Value)] = true
	}
	for _, want := range []string{"before-term", "before-kill", "after-kill"} {
		if !values[want] {
			t.Errorf("message %q lost across restarts; got %v", want, values)
		}
	}
}

func TestKafkaPauseAndResume(t *testing.T) {
	e := RequireExclusive(t)
	topic := UniqueName(t, "topic")
	e.CreateTopic(t, topic, 1)
	e.KafkaPause(t)
	e.KafkaResume(t)
	produce(t, e, topic, "k", "after-pause")
	e.ConsumeAll(t, []string{topic}, 30*time.Second, func(n int) bool { return n >= 1 })
}

func TestPostgresSurvivesImmediateRestart(t *testing.T) {
	e := RequireExclusive(t)
	dsn := e.NewDatabase(t)
	conn := connect(t, dsn)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := conn.Exec(ctx, "CREATE TABLE t (id int); INSERT INTO t VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	e.PGCtl(t, "restart", "-m", "immediate")
	// A commit acknowledged before the crash survives it (synchronous_commit
	// is on even though fsync is off).
	conn2 := connect(t, dsn)
	if got := queryString(t, conn2, "SELECT count(*)::text FROM t"); got != "1" {
		t.Errorf("rows after immediate restart = %s, want 1", got)
	}
}

func TestRequireExclusiveRestartsWhatATestLeftDown(t *testing.T) {
	outer := RequireExclusive(t)
	t.Run("leaves servers down", func(t *testing.T) {
		e := RequireExclusive(t)
		e.NewDatabase(t) // dropping it at the end needs PostgreSQL back up
		e.KafkaPause(t)
		e.PGCtl(t, "stop", "-m", "fast")
	})
	conn := connect(t, outer.PGDSN)
	if got := queryString(t, conn, "SELECT 'up'"); got != "up" {
		t.Errorf("PostgreSQL answered %q", got)
	}
	topic := UniqueName(t, "topic")
	outer.CreateTopic(t, topic, 1)
	produce(t, outer, topic, "k", "v")
}

func TestDisruptingNeedsRequireExclusive(t *testing.T) {
	e := Require(t)
	ft := &fatalRecorder{TB: t}
	func() {
		defer func() { _ = recover() }()
		e.KafkaPause(ft)
	}()
	if !strings.Contains(ft.msg, "RequireExclusive") {
		t.Errorf("KafkaPause under Require: message %q, want it to point at RequireExclusive", ft.msg)
	}
}

// fatalRecorder records Fatalf instead of ending the test.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (f *fatalRecorder) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	panic("fatal")
}

func (f *fatalRecorder) Helper() {}
