package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/pgoutbox/pgoutbox/pkg/kafka"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
	"github.com/pgoutbox/pgoutbox/replication"
)

// testSecret is the password put into DSNs; no output may contain it.
const testSecret = "s3cret-pw-XYZ"

// cmdResult is what one command invocation produced.
type cmdResult struct {
	code           int
	stdout, stderr string
}

func (r cmdResult) String() string {
	return fmt.Sprintf("exit %d\n--- stdout:\n%s--- stderr:\n%s", r.code, r.stdout, r.stderr)
}

func invoke(cmd func(args, environ []string, stdout, stderr io.Writer) int, args, environ []string) cmdResult {
	var out, errOut bytes.Buffer
	code := cmd(args, environ, &out, &errOut)
	return cmdResult{code: code, stdout: out.String(), stderr: errOut.String()}
}

// assertNoSecret fails the test if the result shows testSecret.
func assertNoSecret(t *testing.T, r cmdResult) {
	t.Helper()
	if strings.Contains(r.stdout+r.stderr, testSecret) {
		t.Fatalf("output shows the password %q:\n%s", testSecret, r)
	}
}

// wantLine fails the test unless the output has a line matching the
// regular expression.
func wantLine(t *testing.T, r cmdResult, re string) {
	t.Helper()
	if !regexp.MustCompile(`(?m)` + re).MatchString(r.stdout + r.stderr) {
		t.Fatalf("no line matches %s in\n%s", re, r)
	}
}

func noLine(t *testing.T, r cmdResult, re string) {
	t.Helper()
	if regexp.MustCompile(`(?m)` + re).MatchString(r.stdout + r.stderr) {
		t.Fatalf("a line matches %s in\n%s", re, r)
	}
}

// withPassword returns dsn (a URL) with user's password set to testSecret
// and, if user is not empty, that user. The test server trusts 127.0.0.1,
// so the password is accepted and ignored.
func withPassword(t *testing.T, dsn, user string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	if user == "" {
		user = u.User.Username()
	}
	u.User = url.UserPassword(user, testSecret)
	return u.String()
}

// fixture is a database with an outbox table, and names for the slot,
// publication and topic of one test.
type fixture struct {
	env                    *testenv.Env
	dsn                    string // superuser, no password
	slot, publication      string
	conn                   *pgx.Conn
	brokers                string
	outboxTable, topicName string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	env := testenv.Require(t)
	f := &fixture{
		env:         env,
		dsn:         env.NewDatabase(t),
		slot:        testenv.UniqueName(t, "slot"),
		publication: testenv.UniqueName(t, "pub"),
		brokers:     strings.Join(env.KafkaBrokers, ","),
		outboxTable: "public.outbox",
		topicName:   testenv.UniqueName(t, "topic"),
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	f.conn = conn
	f.exec(t, `CREATE TABLE public.outbox (
		id uuid PRIMARY KEY, aggregatetype text NOT NULL, aggregateid text NOT NULL,
		type text NOT NULL, payload jsonb)`)
	return f
}

func (f *fixture) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := f.conn.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// ready creates the publication of the outbox table and a pgoutput slot.
func (f *fixture) ready(t *testing.T) {
	t.Helper()
	f.exec(t, "CREATE PUBLICATION "+f.publication+" FOR TABLE public.outbox WITH (publish = 'insert')")
	f.exec(t, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", f.slot)
}

// environ is the environment of a command run against the fixture, with
// dsn as the DSN, and extra settings.
func (f *fixture) environ(dsn string, extra ...string) []string {
	return append([]string{
		"PGOUTBOX_POSTGRES_DSN=" + dsn,
		"PGOUTBOX_POSTGRES_SLOT_NAME=" + f.slot,
		"PGOUTBOX_POSTGRES_PUBLICATION_NAME=" + f.publication,
		"PGOUTBOX_POSTGRES_TABLE_INCLUDE_LIST=" + f.outboxTable,
		"PGOUTBOX_KAFKA_BROKERS=" + f.brokers,
	}, extra...)
}

func TestValidatePassesWhenEverythingIsReady(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.ready(t)
	f.env.CreateTopic(t, f.topicName, 2)

	r := invoke(cmdValidate, []string{"--topics", f.topicName}, f.environ(withPassword(t, f.dsn, "")))
	if r.code != exitOK {
		t.Fatalf("want exit 0:\n%s", r)
	}
	assertNoSecret(t, r)
	for _, re := range []string{
		`^PASS config: valid$`,
		`^PASS postgres: connected to 127\.0\.0\.1:\d+/db_\w+ as postgres \(PostgreSQL 1\d+\.\d+\)$`,
		`^PASS wal_level: logical$`,
		`^PASS role: "postgres" is a superuser$`,
		`^PASS max_replication_slots: \d+ of \d+ slots in use$`,
		`^PASS max_wal_senders: `,
		`^PASS table public\.outbox: exists`,
		`^PASS publication: "` + f.publication + `" publishes inserts of 1 table\(s\)$`,
		`^PASS publication table public\.outbox: published$`,
		`^PASS slot: "` + f.slot + `" exists, confirmed_flush_lsn [0-9A-F]+/[0-9A-F]+, lag_bytes \d+`,
		`^PASS slot plugin: pgoutput$`,
		`^PASS slot database: db_`,
		`^PASS slot wal_status: reserved, safe_wal_size unlimited$`,
		`^PASS slot active: `,
		`^PASS kafka: reachable at `,
		`^PASS topic ` + f.topicName + `: exists, 2 partition\(s\)$`,
	} {
		wantLine(t, r, re)
	}
	noLine(t, r, `^FAIL `)
	// The test servers keep defaults the durability audit warns about (one
	// replica, no max_slot_wal_keep_size); nothing else may warn.
	onlyDurabilityWarnings(t, r)
}

// TestValidateWarnsOfAnAnchorLeftByAnUnfinishedSnapshot: the anchor slot
// of an initial snapshot that did not finish holds WAL back until a start
// with snapshot.mode initial finishes it; validate names it and both ways
// on.
func TestValidateWarnsOfAnAnchorLeftByAnUnfinishedSnapshot(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.ready(t)
	f.env.CreateTopic(t, f.topicName, 2)
	anchor := replication.AnchorSlot(f.slot)
	f.exec(t, "SELECT pg_create_logical_replication_slot('"+anchor+"', 'pgoutput')")
	t.Cleanup(func() { _, _ = f.conn.Exec(context.Background(), "SELECT pg_drop_replication_slot($1)", anchor) })
	r := invoke(cmdValidate, []string{"--topics", f.topicName}, f.environ(withPassword(t, f.dsn, "")))
	wantLine(t, r, `^WARN snapshot anchor: slot "`+anchor+`" keeps [0-9A-F]+/[0-9A-F]+, where an initial snapshot of slot "`+f.slot+`" that did not finish started`)
	wantLine(t, r, `pg_drop_replication_slot\('`+anchor+`'\)`)
}

func TestValidateAcceptsWhatPgoutboxWillCreate(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	// No publication, no slot: both are created by run with the defaults.
	r := invoke(cmdValidate, nil, f.environ(f.dsn))
	if r.code != exitOK {
		t.Fatalf("want exit 0:\n%s", r)
	}
	wantLine(t, r, `^PASS publication: "`+f.publication+`" does not exist yet; pgoutbox will create it \(publication.autocreate.mode=filtered\): CREATE PUBLICATION "`+f.publication+`" FOR TABLE "public"."outbox" WITH \(publish = 'insert', publish_via_partition_root = true\);$`)
	wantLine(t, r, `^PASS slot: "`+f.slot+`" does not exist yet; pgoutbox will create it`)
	// The default route.topic.replacement depends on the row: say that
	// nothing was checked rather than pass silently.
	wantLine(t, r, `^WARN topics: none checked: each row's aggregatetype column picks its topic through route.topic.replacement "outbox.event.\$\{routedByValue\}"`)
	wantLine(t, r, `^  fix: pass --topics a,b`)
}

func TestValidateFailsOnMissingPublicationWhenAutocreateIsDisabled(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.exec(t, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", f.slot)
	r := invoke(cmdValidate, nil, f.environ(f.dsn, "PGOUTBOX_POSTGRES_PUBLICATION_AUTOCREATE_MODE=disabled"))
	if r.code != exitRuntime {
		t.Fatalf("want exit 1:\n%s", r)
	}
	wantLine(t, r, `^FAIL publication: "`+f.publication+`" does not exist and publication.autocreate.mode is disabled$`)
	wantLine(t, r, `^  fix: run CREATE PUBLICATION "`+f.publication+`" FOR TABLE "public"."outbox" WITH \(publish = 'insert', publish_via_partition_root = true\); or set publication.autocreate.mode=filtered$`)
}

func TestValidateFailsOnTableNotInPublicationAndMissingTable(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.exec(t, "CREATE TABLE public.other (id int PRIMARY KEY)")
	f.exec(t, "CREATE PUBLICATION "+f.publication+" FOR TABLE public.other WITH (publish = 'insert')")
	f.outboxTable = "public.outbox,public.nothere"
	r := invoke(cmdValidate, nil, f.environ(f.dsn))
	if r.code != exitRuntime {
		t.Fatalf("want exit 1:\n%s", r)
	}
	wantLine(t, r, `^FAIL publication table public\.outbox: publication "`+f.publication+`" does not include table public\.outbox$`)
	wantLine(t, r, `^  fix: ALTER PUBLICATION "`+f.publication+`" ADD TABLE "public"."outbox"$`)
	wantLine(t, r, `^FAIL table public\.nothere: does not exist$`)
	wantLine(t, r, `^  fix: create it: pgoutbox migrate --tables public\.nothere`)
}

func TestValidateFailsOnPublicationWithoutInserts(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.exec(t, "CREATE PUBLICATION "+f.publication+" FOR TABLE public.outbox WITH (publish = 'update')")
	r := invoke(cmdValidate, nil, f.environ(f.dsn))
	wantLine(t, r, `^FAIL publication: "`+f.publication+`" does not publish inserts$`)
	wantLine(t, r, `^  fix: run ALTER PUBLICATION "`+f.publication+`" SET \(publish = 'insert'\);$`)
}

func TestValidateFailsOnOutboxTableWithoutRouterColumns(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.exec(t, "CREATE TABLE public.events (id uuid PRIMARY KEY, body jsonb)")
	f.outboxTable = "public.events"
	r := invoke(cmdValidate, nil, f.environ(f.dsn))
	wantLine(t, r, `^FAIL table public\.events: lacks column\(s\) payload, aggregatetype that the router needs \(it has id, body\)$`)
	wantLine(t, r, `^  fix: add the column\(s\) to public\.events, or set router\.table\.field\.event\.payload=payload, router\.route\.by\.field=aggregatetype to the right column names$`)
}

func TestValidateFailsOnSlotWithAnotherPlugin(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.exec(t, "CREATE PUBLICATION "+f.publication+" FOR TABLE public.outbox WITH (publish = 'insert')")
	f.exec(t, "SELECT pg_create_logical_replication_slot($1, 'test_decoding')", f.slot)
	r := invoke(cmdValidate, nil, f.environ(f.dsn))
	if r.code != exitRuntime {
		t.Fatalf("want exit 1:\n%s", r)
	}
	wantLine(t, r, `^FAIL slot plugin: "`+f.slot+`" uses plugin "test_decoding"; pgoutbox needs pgoutput$`)
	wantLine(t, r, `^  fix: if nothing else uses it, drop it \(SELECT pg_drop_replication_slot\('`+f.slot+`'\);\) and let pgoutbox create it, or choose another postgres.slot.name$`)
}

func TestValidateFailsOnMissingSlotWhenCreateIsOff(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	r := invoke(cmdValidate, nil, f.environ(f.dsn, "PGOUTBOX_POSTGRES_SLOT_CREATE=false"))
	wantLine(t, r, `^FAIL slot: "`+f.slot+`" does not exist and postgres.slot.create is false$`)
	wantLine(t, r, `^  fix: run SELECT pg_create_logical_replication_slot\('`+f.slot+`', 'pgoutput'\); or set postgres.slot.create=true$`)
}

func TestValidateWarnsWhenTheSlotIsActive(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.ready(t)
	rc := replication.DefaultConfig()
	rc.DSN, rc.Slot, rc.Publication = f.dsn, f.slot, f.publication
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stream, err := replication.Open(ctx, rc, 0, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = stream.Close(context.Background()) }()
	var pid int32
	testenv.Eventually(t, 30*time.Second, 50*time.Millisecond, func() (bool, string) {
		err := f.conn.QueryRow(ctx, "SELECT coalesce(active_pid, 0) FROM pg_replication_slots WHERE slot_name = $1", f.slot).Scan(&pid)
		return err == nil && pid != 0, fmt.Sprintf("slot active_pid %d, %v", pid, err)
	})

	r := invoke(cmdValidate, nil, f.environ(f.dsn))
	if r.code != exitOK {
		t.Fatalf("a slot in use is a warning, want exit 0:\n%s", r)
	}
	wantLine(t, r, fmt.Sprintf(`^WARN slot active: in use by PID %d \(application_name pgoutbox from 127\.0\.0\.1\) — a running pgoutbox\? this instance would wait as standby$`, pid))
}

func TestValidateFailsForRoleWithoutReplication(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	role := testenv.UniqueName(t, "role")
	f.exec(t, "CREATE ROLE "+role+" LOGIN NOSUPERUSER NOREPLICATION")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		conn, err := pgx.Connect(ctx, f.env.PGDSN)
		if err != nil {
			t.Errorf("drop role: %v", err)
			return
		}
		defer func() { _ = conn.Close(context.Background()) }()
		if _, err := conn.Exec(ctx, "DROP ROLE IF EXISTS "+role); err != nil {
			t.Errorf("drop role: %v", err)
		}
	})

	r := invoke(cmdValidate, nil, f.environ(withPassword(t, f.dsn, role)))
	if r.code != exitRuntime {
		t.Fatalf("want exit 1:\n%s", r)
	}
	assertNoSecret(t, r)
	wantLine(t, r, `^PASS postgres: connected to 127\.0\.0\.1:\d+/db_\w+ as `+role+` `)
	wantLine(t, r, `^FAIL role: "`+role+`" has neither REPLICATION nor SUPERUSER, so it can neither create nor stream from a replication slot$`)
	wantLine(t, r, `^  fix: as a superuser: ALTER ROLE "`+role+`" WITH REPLICATION;$`)
	// It cannot create the publication either.
	wantLine(t, r, `^FAIL publication: "`+f.publication+`" does not exist and "`+role+`" may not create it: it lacks CREATE on database "db_`)
	wantLine(t, r, `^FAIL slot: "`+f.slot+`" does not exist, and "`+role+`" may not create it \(no REPLICATION attribute\)$`)
	wantLine(t, r, `^  fix: as a superuser: ALTER ROLE "`+role+`" WITH REPLICATION; or create the slot yourself: SELECT pg_create_logical_replication_slot\('`+f.slot+`', 'pgoutput'\);$`)
}

func TestValidateFailsOnMissingTopicAndChecksAFixedTopic(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.ready(t)
	missing := testenv.UniqueName(t, "missing")
	f.env.CreateTopic(t, f.topicName, 3)
	// A replacement without group references names the one topic.
	r := invoke(cmdValidate, []string{"--topics", missing}, f.environ(f.dsn, "PGOUTBOX_ROUTER_ROUTE_TOPIC_REPLACEMENT="+f.topicName))
	if r.code != exitRuntime {
		t.Fatalf("want exit 1:\n%s", r)
	}
	wantLine(t, r, `^FAIL topic `+missing+`: does not exist \(kafka.auto.create.topics is false\)$`)
	wantLine(t, r, `^  fix: create it: kafka-topics.sh --bootstrap-server `+regexp.QuoteMeta(f.brokers)+` --create --topic `+missing+` --partitions N --replication-factor R$`)
	wantLine(t, r, `^PASS topic `+f.topicName+`: exists, 3 partition\(s\)$`)
	// Asking did not create it.
	states, err := kafka.CheckTopics(context.Background(), kafka.Config{Brokers: f.env.KafkaBrokers}, []string{missing})
	if err != nil || states[0].Err == nil {
		t.Fatalf("validate created topic %s: %+v %v", missing, states, err)
	}
}

func TestValidateUnreachableKafkaExits3(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.ready(t)
	f.brokers = "127.0.0.1:1"
	r := invoke(cmdValidate, nil, f.environ(f.dsn))
	if r.code != exitStartup {
		t.Fatalf("want exit 3:\n%s", r)
	}
	wantLine(t, r, `^FAIL kafka: unreachable: kafka: no broker reachable among 127\.0\.0\.1:1: `)
	wantLine(t, r, `^  fix: check kafka.brokers`)
	noLine(t, r, `^(PASS|FAIL|WARN) topic`)
}

func TestValidateUnreachablePostgresExits3WithoutThePassword(t *testing.T) {
	t.Parallel()
	for _, dsn := range []string{
		"postgres://app:" + testSecret + "@127.0.0.1:1/appdb?connect_timeout=5",
		"host=127.0.0.1 port=1 user=app dbname=appdb password=" + testSecret + " connect_timeout=5",
		"host=127.0.0.1 port=1 user=app dbname=appdb password='" + testSecret + "' connect_timeout=5",
	} {
		r := invoke(cmdValidate, nil, []string{"PGOUTBOX_POSTGRES_DSN=" + dsn, "PGOUTBOX_KAFKA_BROKERS=127.0.0.1:1"})
		if r.code != exitStartup {
			t.Fatalf("want exit 3:\n%s", r)
		}
		assertNoSecret(t, r)
		wantLine(t, r, `^FAIL postgres: unreachable: connect to PostgreSQL at 127\.0\.0\.1:1/appdb as app: `)
		wantLine(t, r, `^  fix: check that PostgreSQL runs and listens on 127\.0\.0\.1:1 .* and the host and port in postgres.dsn`)
	}
}

func TestValidateUnparsableDSNIsNotShown(t *testing.T) {
	t.Parallel()
	dsn := "postgres://app:" + testSecret + "@127.0.0.1:notaport/appdb"
	r := invoke(cmdValidate, nil, []string{"PGOUTBOX_POSTGRES_DSN=" + dsn, "PGOUTBOX_KAFKA_BROKERS=127.0.0.1:1"})
	assertNoSecret(t, r)
	wantLine(t, r, `^FAIL postgres: postgres.dsn is not a valid connection string \(its text is not shown because it may hold a password\)$`)
	if r.code != exitStartup { // Kafka at 127.0.0.1:1 is unreachable
		t.Fatalf("want exit 3:\n%s", r)
	}
}

func TestValidateReportsEveryConfigProblem(t *testing.T) {
	t.Parallel()
	r := invoke(cmdValidate, []string{"--slot", "Bad-Name", "--dsn", ""}, nil)
	if r.code != exitRuntime {
		t.Fatalf("want exit 1:\n%s", r)
	}
	wantLine(t, r, `^FAIL config: replication: dsn is empty`)
	wantLine(t, r, `^FAIL config: kafka: brokers: at least one broker`)
	wantLine(t, r, `^  fix: correct the setting named above`)
	// Nothing to connect to: no server checks.
	noLine(t, r, `^\w+ (postgres|kafka):`)
}

func TestValidateHelpAndBadFlags(t *testing.T) {
	t.Parallel()
	if r := invoke(cmdValidate, []string{"--help"}, nil); r.code != exitOK || !strings.Contains(r.stderr, "--topics") {
		t.Fatalf("--help:\n%s", r)
	}
	if r := invoke(cmdValidate, []string{"--nope"}, nil); r.code != exitConfig {
		t.Fatalf("unknown flag:\n%s", r)
	}
}

func TestValidateWALLevelMessage(t *testing.T) {
	t.Parallel()
	got := checkWALLevel("replica")
	want := checkResult{
		Status: checkFail,
		Name:   "wal_level",
		Detail: `is "replica"; logical decoding needs "logical"`,
		Fix:    "run ALTER SYSTEM SET wal_level = logical; as a superuser (or set wal_level = logical in postgresql.conf), then restart PostgreSQL",
	}
	if got != want {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
	if got := checkWALLevel("logical"); got.Status != checkPass {
		t.Fatalf("logical: %+v", got)
	}
	var out bytes.Buffer
	v := &validation{out: &out}
	v.report(want)
	if out.String() != "FAIL wal_level: is \"replica\"; logical decoding needs \"logical\"\n  fix: "+want.Fix+"\n" || !v.failed {
		t.Fatalf("printed %q", out.String())
	}
}

func TestValidateSlotStateMessages(t *testing.T) {
	t.Parallel()
	lost := checkSlotWALStatus("s", "lost", nil)
	if lost.Status != checkFail || !strings.Contains(lost.Fix, "SELECT pg_drop_replication_slot('s');") {
		t.Errorf("lost: %+v", lost)
	}
	if r := checkSlotWALStatus("s", "unreserved", nil); r.Status != checkWarn {
		t.Errorf("unreserved: %+v", r)
	}
	n := int64(2048)
	if r := checkSlotWALStatus("s", "extended", &n); r.Status != checkPass || r.Detail != "extended, safe_wal_size 2048 (2.0 KiB)" {
		t.Errorf("extended: %+v", r)
	}
	f := pgFacts{usedSlots: 10, maxSlots: 10, slot: slotStatus{Name: "s"}}
	if r := checkSlotCapacity(f, replication.Config{Slot: "s"}, false, false); r.Status != checkFail {
		t.Errorf("no free slot for a missing slot: %+v", r)
	}
	f.usedSlots = 9
	if r := checkSlotCapacity(f, replication.Config{Slot: "s"}, false, false); r.Status != checkPass {
		t.Errorf("one free slot for a missing slot: %+v", r)
	}
	if r := checkSlotCapacity(f, replication.Config{Slot: "s"}, true, false); r.Status != checkFail || !strings.Contains(r.Detail, "needs 2") {
		t.Errorf("one free slot for a missing slot and its initial snapshot: %+v", r)
	}
	// An earlier attempt's anchor is among those in use: the snapshot
	// needs only its temporary slot more.
	if r := checkSlotCapacity(f, replication.Config{Slot: "s"}, true, true); r.Status != checkPass {
		t.Errorf("one free slot for a missing slot whose snapshot's anchor is there: %+v", r)
	}
	f.usedSlots = 10
	if r := checkSlotCapacity(f, replication.Config{Slot: "s"}, true, true); r.Status != checkFail || !strings.Contains(r.Detail, "do not drop that one") {
		t.Errorf("no free slot for a missing slot whose snapshot's anchor is there: %+v", r)
	}
	f.slot.Exists = true
	if r := checkSlotCapacity(f, replication.Config{Slot: "s"}, true, false); r.Status != checkPass {
		t.Errorf("full, but the slot exists: %+v", r)
	}
	if r := checkWALSenders(pgFacts{usedSender: 4, maxSenders: 4}); r.Status != checkWarn {
		t.Errorf("walsenders full: %+v", r)
	}
}

func TestValidateFixedTopic(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		repl, want string
		ok         bool
	}{
		{"outbox.event.${routedByValue}", "", false},
		{"events.$1", "", false},
		{"orders", "orders", true},
		{`price\$s`, "price$s", true},
		{`a\.b`, "a.b", true},
		{"", "", false},
	} {
		got, ok := fixedTopic(c.repl)
		if got != c.want || ok != c.ok {
			t.Errorf("fixedTopic(%q) = %q, %v; want %q, %v", c.repl, got, ok, c.want, c.ok)
		}
	}
}

// The test server trusts 127.0.0.1, so a wrong password cannot be tried;
// an unknown role and an unknown database are refusals at the same stage
// (SQLSTATE 28000 and 3D000), with the password in the DSN.
func TestValidateRefusedConnectionExits3WithoutThePassword(t *testing.T) {
	t.Parallel()
	env := testenv.Require(t)
	base := env.NewDatabase(t)
	u, err := url.Parse(withPassword(t, base, testenv.UniqueName(t, "nobody")))
	if err != nil {
		t.Fatal(err)
	}
	noRole := u.String()
	u, err = url.Parse(withPassword(t, base, ""))
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + testenv.UniqueName(t, "nodb")
	noDB := u.String()
	for _, c := range []struct {
		dsn, reason, fix string
	}{
		{noRole, `role "nobody_\w+" does not exist`, `check that the role exists and that pg_hba.conf has a line for it`},
		{noDB, `database "nodb_\w+" does not exist`, `create the database or correct the database name in postgres.dsn`},
	} {
		environ := []string{"PGOUTBOX_POSTGRES_DSN=" + c.dsn, "PGOUTBOX_KAFKA_BROKERS=" + strings.Join(env.KafkaBrokers, ",")}
		r := invoke(cmdValidate, nil, environ)
		if r.code != exitStartup {
			t.Fatalf("want exit 3:\n%s", r)
		}
		assertNoSecret(t, r)
		wantLine(t, r, `^FAIL postgres: refused: connect to PostgreSQL at 127\.0\.0\.1:\d+/\w+ as \w+: .*`+c.reason)
		wantLine(t, r, `^  fix: `+c.fix)

		r = invoke(cmdStatus, nil, environ)
		if r.code != exitStartup || strings.Count(r.stderr, "\n") != 1 {
			t.Fatalf("status: want exit 3 and one line:\n%s", r)
		}
		assertNoSecret(t, r)
		wantLine(t, r, `^pgoutbox: replication: connect to PostgreSQL at 127\.0\.0\.1:\d+/\w+ as \w+: .*`+c.reason)
	}
}

// TestRunStartupErrorsSayWhatToCheck: `pgoutbox run` against the real
// PostgreSQL with a role that does not exist, and against a Kafka address
// nothing listens on, exits 3 with a last line that names the target and
// says what to check, and never shows the password.
func TestRunStartupErrorsSayWhatToCheck(t *testing.T) {
	env := testenv.Require(t)
	dsn := env.NewDatabase(t)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(t.Context(), "CREATE TABLE outbox (id uuid PRIMARY KEY, aggregatetype text, aggregateid text, type text, payload jsonb)"); err != nil {
		t.Fatal(err)
	}
	noRole := *u
	noRole.User = url.UserPassword("nobody_at_all", testSecret)
	// A role that may do everything but replicate.
	norep := strings.ToLower(testenv.UniqueName(t, "norep"))
	for _, sql := range []string{
		"CREATE ROLE " + norep + " LOGIN",
		"GRANT CREATE ON SCHEMA public TO " + norep,
		"GRANT CREATE ON DATABASE " + strings.TrimPrefix(u.Path, "/") + " TO " + norep,
		"CREATE TABLE norep_outbox (id uuid PRIMARY KEY, aggregatetype text, aggregateid text, type text, payload jsonb)",
		"ALTER TABLE norep_outbox OWNER TO " + norep,
	} {
		if _, err := conn.Exec(t.Context(), sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	t.Cleanup(func() {
		_, _ = conn.Exec(context.Background(), "DROP OWNED BY "+norep)
		_, _ = conn.Exec(context.Background(), "DROP ROLE "+norep)
	})
	noRepl := *u
	noRepl.User = url.User(norep)
	deadBroker := "127.0.0.1:1" // nothing listens there; a freed port could be taken by another test
	brokers := strings.Join(env.KafkaBrokers, ",")
	cases := []struct {
		name, dsn, brokers, tables string
		want                       []string
	}{
		{"no such role", noRole.String(), brokers, "public.outbox",
			[]string{"as nobody_at_all", `role "nobody_at_all" does not exist`, "pg_hba.conf"}},
		{"role without REPLICATION", noRepl.String(), brokers, "public.norep_outbox",
			[]string{"as " + norep, "replication role", "ALTER ROLE " + `"` + norep + `" REPLICATION`}},
		{"no outbox table", dsn, brokers, "public.orders_outbox",
			[]string{`relation "public.orders_outbox" does not exist`, "pgoutbox migrate"}},
		{"Kafka refuses", dsn, deadBroker, "public.outbox",
			[]string{"kafka: no broker reachable among " + deadBroker, "check that Kafka runs"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := run([]string{"run", "--slot", strings.ToLower(testenv.UniqueName(t, "s")), "--publication", testenv.UniqueName(t, "p")},
				[]string{"PGOUTBOX_POSTGRES_DSN=" + c.dsn, "PGOUTBOX_KAFKA_BROKERS=" + c.brokers,
					"PGOUTBOX_POSTGRES_TABLE_INCLUDE_LIST=" + c.tables, "PGOUTBOX_METRICS_LISTEN="},
				&out, &errOut)
			all := out.String() + errOut.String()
			if strings.Contains(all, testSecret) {
				t.Fatalf("output shows the password:\n%s", all)
			}
			if code != exitStartup {
				t.Fatalf("exit %d, want %d:\n%s", code, exitStartup, all)
			}
			lines := strings.Split(strings.TrimSpace(errOut.String()), "\n")
			last := lines[len(lines)-1]
			if !strings.HasPrefix(last, "pgoutbox: start-up: ") {
				t.Fatalf("last line %q is not the start-up reason", last)
			}
			for _, w := range c.want {
				if !strings.Contains(last, w) {
					t.Errorf("last line %q lacks %q", last, w)
				}
			}
		})
	}
}

// TestValidateFailsOnColumnsOfTypesRefusedThroughAConnectConverter: a
// column placed through a Kafka Connect converter whose type pgoutbox
// refuses there (point, an array of an enum) is named, as a FAIL under
// poison.policy=fail and a WARN under dead-letter; the types it writes as
// Debezium does (an enum, a domain over numeric, information_schema's
// domain over int4) are not.
func TestValidateFailsOnColumnsOfTypesRefusedThroughAConnectConverter(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.ready(t)
	// The fixture's database is its own.
	f.exec(t, "CREATE TYPE mood_t AS ENUM ('a', 'b'); CREATE DOMAIN amt_d AS numeric(12,2)")
	f.exec(t, "ALTER TABLE public.outbox ADD COLUMN pt point, ADD COLUMN moods mood_t[], ADD COLUMN m mood_t"+
		", ADD COLUMN amt amt_d, ADD COLUMN card information_schema.cardinal_number")
	settings := []string{
		"PGOUTBOX_ROUTER_TABLE_FIELDS_ADDITIONAL_PLACEMENT=pt:envelope,moods:header,m:header,amt:envelope,card:envelope",
		"PGOUTBOX_ROUTER_VALUE_CONVERTER=org.apache.kafka.connect.json.JsonConverter",
		"PGOUTBOX_ROUTER_VALUE_CONVERTER_SCHEMAS_ENABLE=false",
		"PGOUTBOX_ROUTER_HEADER_CONVERTER=org.apache.kafka.connect.storage.SimpleHeaderConverter",
	}
	r := invoke(cmdValidate, nil, f.environ(f.dsn, settings...))
	if r.code != exitRuntime {
		t.Fatalf("want exit 1:\n%s", r)
	}
	wantLine(t, r, `^FAIL types: public\.outbox: column pt goes into envelope field pt \(value\.converter\), but its type is refused there: point .*relay\.poison\.policy=fail stops the relay on the first$`)
	wantLine(t, r, `^FAIL types: public\.outbox: column moods goes into header moods \(header\.converter\), but its type is refused there: a user-defined type`)
	noLine(t, r, `column (m|amt|card|payload|id) goes into`)
	r = invoke(cmdValidate, nil, f.environ(f.dsn, append(settings, "PGOUTBOX_RELAY_POISON_POLICY=dead-letter")...))
	wantLine(t, r, `^WARN types: public\.outbox: column pt goes into envelope field pt .*, dead-lettered$`)
	noLine(t, r, `^FAIL types`)
	r = invoke(cmdValidate, nil, f.environ(f.dsn, "PGOUTBOX_ROUTER_TABLE_FIELDS_ADDITIONAL_PLACEMENT=m:envelope,amt:envelope,card:envelope",
		"PGOUTBOX_ROUTER_VALUE_CONVERTER=org.apache.kafka.connect.json.JsonConverter", "PGOUTBOX_ROUTER_VALUE_CONVERTER_SCHEMAS_ENABLE=false"))
	wantLine(t, r, `^PASS types: public\.outbox: every column written through a Kafka Connect converter`)
	// A table named with capitals is read as named, not as the table its
	// name folds to (public.outbox has no pt2).
	f.exec(t, `CREATE TABLE public."Outbox" (LIKE public.outbox); ALTER TABLE public."Outbox" ADD COLUMN pt2 point`)
	f.outboxTable = "public.Outbox"
	r = invoke(cmdValidate, nil, f.environ(f.dsn, "PGOUTBOX_ROUTER_TABLE_FIELDS_ADDITIONAL_PLACEMENT=pt2:envelope",
		"PGOUTBOX_ROUTER_VALUE_CONVERTER=org.apache.kafka.connect.json.JsonConverter", "PGOUTBOX_ROUTER_VALUE_CONVERTER_SCHEMAS_ENABLE=false"))
	wantLine(t, r, `^FAIL types: public\.Outbox: column pt2 goes into envelope field pt2 \(value\.converter\), but its type is refused there: point`)
}
