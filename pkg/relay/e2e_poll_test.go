package relay_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/migrations"
	"github.com/pgoutbox/pgoutbox/pkg/outboxtest"
	"github.com/pgoutbox/pgoutbox/pkg/relay"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
	"github.com/pgoutbox/pgoutbox/poll"
	"github.com/pgoutbox/pgoutbox/replication"
)

// TestPollDeliversEveryCommittedEventWithFourInstances runs four relays on
// the poll source at once while 10,000 events are written in transactions
// of 1-50 rows over 100 aggregates (some rolling back, some touching only
// another table): every committed event arrives exactly once with the
// right topic, key, value and id, in commit order per key, nothing rolled
// back, every row marked published, and the buckets are shared out.
func TestPollDeliversEveryCommittedEventWithFourInstances(t *testing.T) {
	env := testenv.Require(t)
	f := newPollFixture(t, env, 3)
	cfg := f.pollConfig()
	stops := f.runBalanced(t, cfg, 4)

	w := outboxtest.NewWriter(f.conn, "outbox", f.shape, 21)
	writeEvents(t, w, 10000, 5000)
	if len(w.RolledBack) == 0 {
		t.Fatal("the workload rolled nothing back")
	}
	c := env.NewConsumer(t, f.topics)
	waitAll(t, c, w, 3*time.Minute)
	for i, stop := range stops {
		if err := stop(); err != nil {
			t.Fatalf("relay %d stopped with %v", i, err)
		}
	}
	msgs := drain(t, c, f)
	rep := outboxtest.Check(w.Committed, w.RolledBack, delivered(msgs), nil)
	t.Logf("%d transactions: %s", w.Txns, rep)
	if !rep.OK() || rep.Duplicates != 0 || rep.Verified != w.Events() {
		t.Fatalf("delivery check failed: %s", rep)
	}
	if n := f.unpublished(t); n != 0 {
		t.Fatalf("%d rows still unpublished", n)
	}
}

// TestPollPublishesARowWhoseTransactionCommitsLate holds a transaction
// open after inserting a row, while later transactions insert and commit
// rows with higher sequence numbers, some of the same key: those are
// published, the held one is not (it is not visible), and once it commits
// it is published too. A relay that resumed from the highest sequence it
// had seen would skip it for good.
func TestPollPublishesARowWhoseTransactionCommitsLate(t *testing.T) {
	env := testenv.Require(t)
	f := newPollFixture(t, env, 1)
	topic := f.pollTopic(t)
	cfg := f.pollConfig()
	f.runBalanced(t, cfg, 4)
	ctx := context.Background()
	insert := `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, $3, 'T', '{}')`
	held, err := f.checkDB.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Rollback(ctx) //nolint:errcheck // committed below
	late := outboxtest.NewID()
	if _, err := held.Exec(ctx, insert, late, f.slot, "k1"); err != nil {
		t.Fatal(err)
	}
	var lateSeq int64
	if err := held.QueryRow(ctx, "SELECT seq FROM outbox WHERE id = $1", late).Scan(&lateSeq); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := range 100 {
		id := outboxtest.NewID()
		ids = append(ids, id)
		if _, err := f.conn.Exec(ctx, insert, id, f.slot, fmt.Sprintf("k%d", i%5)); err != nil {
			t.Fatal(err)
		}
	}
	c := env.NewConsumer(t, []string{topic})
	c.WaitFor(t, 100, time.Minute)
	var maxSeq int64
	if err := f.conn.QueryRow(ctx, "SELECT max(seq) FROM outbox WHERE published_at IS NOT NULL").Scan(&maxSeq); err != nil {
		t.Fatal(err)
	}
	if maxSeq <= lateSeq {
		t.Fatalf("published up to seq %d, not past the held row's %d", maxSeq, lateSeq)
	}
	if err := held.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	msgs := c.WaitFor(t, 101, time.Minute)
	last, _ := msgs[100].Header("id")
	if string(last) != late {
		t.Fatalf("record 101 is %s, want the late row %s", last, late)
	}
	// Per key, the records are in sequence order (the instances publish
	// different keys side by side).
	next := map[string]int{}
	for _, m := range msgs[:100] {
		id, _ := m.Header("id")
		k := string(m.Key)
		i := next[k]
		for i < len(ids) && fmt.Sprintf("k%d", i%5) != k {
			i++
		}
		if i >= len(ids) || ids[i] != string(id) {
			t.Fatalf("key %s: record %s is not the next of its key in sequence order", k, id)
		}
		next[k] = i + 1
	}
}

// TestPollCleanupUnderLoadBlocksNoWriter runs the relay's cleanup every
// 100 ms with a retention of 1 s while four writers insert as fast as they
// can, each with lock_timeout = 100ms: a writer that waited longer than
// that for a lock would fail. The cleanup must delete published rows (the
// table stays small), and no unpublished row: every event arrives.
func TestPollCleanupUnderLoadBlocksNoWriter(t *testing.T) {
	env := testenv.Require(t)
	f := newPollFixture(t, env, 3)
	cfg := f.pollConfig()
	cfg.Poll.Retention, cfg.Poll.CleanupInterval, cfg.Poll.CleanupBatchSize = time.Second, 100*time.Millisecond, 200
	for range 2 {
		runRelay(t, cfg)
	}
	ctx := context.Background()
	shape := f.shape
	shape.MinRows, shape.MaxRows = 1, 10
	var writers []*outboxtest.Writer
	var bws []*backgroundWriter
	for i := range 4 {
		conn, err := pgx.Connect(ctx, f.dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close(context.Background()) })
		if _, err := conn.Exec(ctx, "SET lock_timeout = '100ms'"); err != nil {
			t.Fatal(err)
		}
		w := outboxtest.NewWriter(conn, "outbox", shape, uint64(40+i))
		writers = append(writers, w)
		bws = append(bws, startWriter(w, 100_000))
	}
	start := time.Now()
	var deleted int
	testenv.Eventually(t, 2*time.Minute, 100*time.Millisecond, func() (bool, string) {
		var rows, events int
		for _, bw := range bws {
			events += bw.Events()
		}
		if err := f.checkDB.QueryRow(ctx, "SELECT count(*) FROM outbox").Scan(&rows); err != nil {
			t.Fatal(err)
		}
		deleted = events - rows
		return time.Since(start) > 10*time.Second && deleted > 1000, fmt.Sprintf("%d events written, %d rows in the table", events, rows)
	})
	for _, bw := range bws {
		bw.Stop(t) // fails the test on a writer's error: a lock timeout
	}
	c := env.NewConsumer(t, f.topics)
	for i, w := range writers {
		waitAll(t, c, w, 2*time.Minute)
		t.Logf("writer %d: %d transactions, %d events", i, w.Txns, w.Events())
	}
	t.Logf("the cleanup deleted %d published rows while the writers ran", deleted)
}

// TestPollNotificationWakesTheRelayAtOnce sets poll.interval to 30 s:
// without the notification a row would wait for it. With it the row is
// published within a few seconds; after the listener's connection is
// killed the relay listens again, and a row is still published at once.
func TestPollNotificationWakesTheRelayAtOnce(t *testing.T) {
	env := testenv.Require(t)
	f := newPollFixture(t, env, 1)
	topic := f.pollTopic(t)
	cfg := f.pollConfig()
	cfg.Poll.Interval = 30 * time.Second
	cfg.Poll.RebalanceInterval = 30 * time.Second
	f.runBalanced(t, cfg, 1)
	ctx := context.Background()
	c := env.NewConsumer(t, []string{topic})
	insert := func() time.Time {
		t.Helper()
		if _, err := f.conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES (gen_random_uuid(), $1, 'k', 'T', '{}')`, f.slot); err != nil {
			t.Fatal(err)
		}
		return time.Now()
	}
	listening := func() {
		t.Helper()
		testenv.Eventually(t, 30*time.Second, 20*time.Millisecond, func() (bool, string) {
			var n int
			if err := f.checkDB.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgoutbox-poll-listen' AND datname = current_database() AND query LIKE 'LISTEN%'").Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n == 1, "the relay does not listen"
		})
	}
	listening()
	at := insert()
	c.WaitFor(t, 1, 5*time.Second)
	t.Logf("published %s after the commit", time.Since(at).Round(time.Millisecond))
	if _, err := f.checkDB.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'pgoutbox-poll-listen' AND datname = current_database()"); err != nil {
		t.Fatal(err)
	}
	listening()
	at = insert()
	c.WaitFor(t, 2, 5*time.Second)
	t.Logf("after the listener was killed: published %s after the commit", time.Since(at).Round(time.Millisecond))
}

// TestPollPartitionedTablePublishesEachRowOnce: with a partitioned outbox
// table two rows in different partitions can have the same position
// (ctid); the claim records each row in its own partition, and the
// cleanup deletes each published row in its own, so every event arrives
// once and every row is marked (or deleted once published).
func TestPollPartitionedTablePublishesEachRowOnce(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 3)
	f.shape.DeletePct = 0
	ctx := context.Background()
	_, err := f.conn.Exec(ctx, `DROP TABLE outbox;
		CREATE TABLE outbox (id uuid NOT NULL, aggregatetype varchar(255) NOT NULL, aggregateid varchar(255) NOT NULL,
			type varchar(255) NOT NULL, payload jsonb, created_at timestamptz NOT NULL DEFAULT now(),
			seq bigint GENERATED ALWAYS AS IDENTITY, published_at timestamptz, attempts integer NOT NULL DEFAULT 0, last_error text)
			PARTITION BY HASH (aggregateid);
		CREATE TABLE outbox_p0 PARTITION OF outbox FOR VALUES WITH (MODULUS 3, REMAINDER 0);
		CREATE TABLE outbox_p1 PARTITION OF outbox FOR VALUES WITH (MODULUS 3, REMAINDER 1);
		CREATE TABLE outbox_p2 PARTITION OF outbox FOR VALUES WITH (MODULUS 3, REMAINDER 2);
		CREATE INDEX ON outbox (seq) WHERE published_at IS NULL;`)
	if err != nil {
		t.Fatal(err)
	}
	// The keep triggers, as pgoutbox migrate adds them to a table made by
	// hand (it leaves the columns as they are).
	defaults := relay.DefaultConfig()
	p := migrations.PollParams{Table: "public.outbox", Notify: true, Channel: defaults.Poll.Channel("public.outbox")}
	if err := migrations.ApplyPoll(ctx, f.conn, p); err != nil {
		t.Fatal(err)
	}
	cfg := f.pollConfig()
	// The cleanup deletes published rows at once: it must find them in
	// their own partitions too.
	cfg.Poll.Retention, cfg.Poll.CleanupInterval = time.Millisecond, 100*time.Millisecond
	stop := runRelay(t, cfg)
	w := outboxtest.NewWriter(f.conn, "outbox", f.shape, 22)
	writeEvents(t, w, 3000, 2000)
	c := env.NewConsumer(t, f.topics)
	waitAll(t, c, w, 2*time.Minute)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	exactlyOnce(t, c, f, w)
	if n := f.unpublished(t); n != 0 {
		t.Fatalf("%d rows unpublished", n)
	}
}

// TestPollRefusesATableWhoseRowSecurityHidesRows: logical decoding ignores
// row-level security, queries do not: a poll relay (or an initial
// snapshot) whose role is subject to the outbox table's policies would
// never see the rows they hide, and say nothing. It stops, naming the
// table, the role and the fix; once the role is no longer subject to them
// (here: the owner, without FORCE ROW LEVEL SECURITY), every row arrives,
// the ones the policy hides too.
func TestPollRefusesATableWhoseRowSecurityHidesRows(t *testing.T) {
	env := testenv.Require(t)
	f := newPollFixture(t, env, 1)
	topic := f.pollTopic(t)
	role := "rls_" + f.slot
	f.exec(t, "CREATE ROLE "+role+" LOGIN NOSUPERUSER NOBYPASSRLS")
	t.Cleanup(func() {
		_, _ = f.checkDB.Exec(context.Background(), "DROP OWNED BY "+role+"; DROP ROLE "+role)
	})
	f.exec(t, "ALTER TABLE outbox OWNER TO "+role)
	f.exec(t, "ALTER TABLE outbox ENABLE ROW LEVEL SECURITY")
	f.exec(t, "ALTER TABLE outbox FORCE ROW LEVEL SECURITY")
	f.exec(t, "CREATE POLICY shown ON outbox USING (aggregateid <> 'hidden')")
	insert := `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, $3, 'T', '{}')`
	var want []string
	for i := range 6 {
		id := outboxtest.NewID()
		key := "shown"
		if i%2 == 0 {
			key = "hidden"
		}
		f.exec(t, insert, id, f.slot, key)
		want = append(want, id)
	}
	cfg := f.pollConfig()
	u, err := url.Parse(cfg.Postgres.DSN)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	cfg.Postgres.DSN = u.String()
	refused := func(cfg relay.Config) {
		t.Helper()
		err := runInProcess(t, cfg).exited(t, time.Minute)
		var fe *relay.FatalError
		if !errors.As(err, &fe) || !errors.Is(err, replication.ErrRowSecurity) || !strings.Contains(err.Error(), role) || !strings.Contains(err.Error(), "BYPASSRLS") {
			t.Fatalf("want a fatal row-security error naming the role and the fix, got %v", err)
		}
	}
	refused(cfg)
	// The WAL source's initial snapshot reads the table the same way.
	f.exec(t, "ALTER ROLE "+role+" REPLICATION")
	f.exec(t, "CREATE PUBLICATION "+f.pub+" FOR TABLE outbox WITH (publish = 'insert')")
	snap := f.config()
	snap.Postgres.DSN, snap.Postgres.StateTable = cfg.Postgres.DSN, ""
	snap.Snapshot.Mode = relay.SnapshotInitial
	refused(snap)
	if confirmed, _ := f.slotState(t); confirmed != 0 {
		t.Fatalf("the refused snapshot left a slot (confirmed %s)", confirmed)
	}
	if n := f.unpublished(t); n != len(want) {
		t.Fatalf("%d rows unpublished after the refusal, want all %d", n, len(want))
	}

	f.exec(t, "ALTER TABLE outbox NO FORCE ROW LEVEL SECURITY")
	c := env.NewConsumer(t, []string{topic})
	p := runInProcess(t, cfg)
	msgs := c.WaitFor(t, len(want), time.Minute)
	if err := p.stop(t); err != nil {
		t.Fatal(err)
	}
	slices.Sort(want)
	if got := receivedIDs(msgs); !slices.Equal(got, want) {
		t.Fatalf("received %v, want every row %v", got, want)
	}
}

// TestPollSeesAColumnTypeChangedWhileItRuns: the claim reads its rows'
// column types from the query's result, and keeps them while the columns
// stay the same. A column whose type changes while the relay runs
// (payload from jsonb to bytea) keeps its name: the relay must route the
// rows written after the change by the new type, as a relay started after
// it does, not by the one it first saw (a bytea's hex text sent as if it
// were JSON). With pgx's statement cache (the default) the first claim
// after the change fails (the prepared statement's result changed) and the
// session starts again; with default_query_exec_mode=exec in the DSN (as
// behind PgBouncer) every claim is described afresh and nothing fails.
func TestPollSeesAColumnTypeChangedWhileItRuns(t *testing.T) {
	env := testenv.Require(t)
	for _, mode := range []string{"cache_statement", "exec"} {
		t.Run(mode, func(t *testing.T) { testPollColumnTypeChange(t, env, mode) })
	}
}

func testPollColumnTypeChange(t *testing.T, env *testenv.Env, mode string) {
	f, topic := newPollTopicFixture(t, env)
	cfg := f.pollConfig()
	u, err := url.Parse(cfg.Postgres.DSN)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("default_query_exec_mode", mode)
	u.RawQuery = q.Encode()
	cfg.Postgres.DSN = u.String()
	ctx := context.Background()
	c := env.NewConsumer(t, []string{topic})
	insert := func(id, payload string) {
		t.Helper()
		if _, err := f.conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, 'k', 'T', `+payload+`)`, id, f.slot); err != nil {
			t.Fatal(err)
		}
	}
	stop := runRelay(t, cfg)
	insert("00000000-0000-4000-8000-000000000001", `'{"a":1}'`)
	c.WaitFor(t, 1, time.Minute)
	f.exec(t, "ALTER TABLE outbox ALTER COLUMN payload TYPE bytea USING convert_to(payload::text, 'UTF8')")
	insert("00000000-0000-4000-8000-000000000002", `convert_to('{"b":2}', 'UTF8')`)
	msgs := c.WaitFor(t, 2, time.Minute)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	// The oracle: a relay started after the change.
	stop = runRelay(t, cfg)
	insert("00000000-0000-4000-8000-000000000003", `convert_to('{"b":2}', 'UTF8')`)
	msgs = c.WaitFor(t, 3, time.Minute)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	byID := map[string][]byte{}
	for _, m := range msgs {
		id, _ := m.Header("id")
		byID[string(id)] = m.Value
	}
	during, after := byID["00000000-0000-4000-8000-000000000002"], byID["00000000-0000-4000-8000-000000000003"]
	if string(during) != string(after) {
		t.Fatalf("a row written after payload became bytea, relayed by the relay that ran through the change: %q; by a relay started after it: %q", during, after)
	}
	t.Logf("payload after the change: %q", after)
}

// TestPollKeepsOrderPastAForeignKeyCheck: a table whose rows reference an
// outbox row makes PostgreSQL lock that row FOR KEY SHARE while a
// transaction inserts a referencing row (the foreign key check). The
// claim locks the rows it claims, skipping locked ones; a lock that
// conflicts with the key share would make it skip that event and publish
// the next one of its key first. The claim must lock only what marking a
// row published needs (FOR NO KEY UPDATE), so that the key share does not
// stop it.
func TestPollKeepsOrderPastAForeignKeyCheck(t *testing.T) {
	env := testenv.Require(t)
	f, topic := newPollTopicFixture(t, env)
	ctx := context.Background()
	f.exec(t, "CREATE TABLE refs (event_id uuid NOT NULL REFERENCES outbox (id))")
	first, second := "00000000-0000-4000-8000-000000000001", "00000000-0000-4000-8000-000000000002"
	for _, id := range []string{first, second} {
		f.exec(t, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, 'k', 'T', '{}')`, id, f.slot)
	}
	// An open transaction that references the first event: the foreign key
	// check holds FOR KEY SHARE on its row until it ends.
	app, err := f.checkDB.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer app.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	if _, err := app.Exec(ctx, "INSERT INTO refs VALUES ($1)", first); err != nil {
		t.Fatal(err)
	}
	c := env.NewConsumer(t, []string{topic})
	stop := runRelay(t, f.pollConfig())
	msgs := c.WaitFor(t, 1, time.Minute)
	if id, _ := msgs[0].Header("id"); string(id) != first {
		t.Fatalf("first record of key k: event %s, want %s: the claim skipped the row the foreign key check locks", id, first)
	}
	if err := app.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	msgs = c.WaitFor(t, 2, time.Minute)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if id, _ := msgs[1].Header("id"); string(id) != second {
		t.Fatalf("second record of key k: event %s, want %s", id, second)
	}
}

// TestPollKeepsOrderPastARowAnotherTransactionLocks: an application that
// locks an unpublished row (SELECT ... FOR UPDATE) makes the claim skip
// it. The later rows of its key must wait for it (not go first), and the
// other keys must go on meanwhile.
func TestPollKeepsOrderPastARowAnotherTransactionLocks(t *testing.T) {
	env := testenv.Require(t)
	f, topic := newPollTopicFixture(t, env)
	ctx := context.Background()
	ids := map[string][]string{}
	for i := range 6 {
		key := []string{"k", "other"}[i%2]
		id := fmt.Sprintf("00000000-0000-4000-8000-%012d", i+1)
		ids[key] = append(ids[key], id)
		f.exec(t, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, $3, 'T', '{}')`, id, f.slot, key)
	}
	app, err := f.checkDB.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer app.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	if _, err := app.Exec(ctx, "SELECT 1 FROM outbox WHERE id = $1 FOR UPDATE", ids["k"][0]); err != nil {
		t.Fatal(err)
	}
	c := env.NewConsumer(t, []string{topic})
	stop := runRelay(t, f.pollConfig())
	// The other key's three go out while k's first row is locked.
	msgs := c.WaitFor(t, 3, time.Minute)
	for _, m := range msgs {
		if string(m.Key) != "other" {
			id, _ := m.Header("id")
			t.Fatalf("event %s of key %s went out while the first row of its key was locked", id, m.Key)
		}
	}
	if err := app.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	msgs = c.WaitFor(t, 6, time.Minute)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range msgs {
		if string(m.Key) == "k" {
			id, _ := m.Header("id")
			got = append(got, string(id))
		}
	}
	if !slices.Equal(got, ids["k"]) {
		t.Fatalf("key k delivered as %v, want %v", got, ids["k"])
	}
}

// newPollTopicFixture is newPollFixture with one topic of one partition
// for the events it writes (aggregate type: the fixture's slot name).
func newPollTopicFixture(t *testing.T, env *testenv.Env) (*fixture, string) {
	t.Helper()
	f := newPollFixture(t, env, 1)
	topic := f.pollTopic(t)
	return f, topic
}

// TestPollClaimOutlivesTheServersTransactionTimeouts: a claim keeps its
// transaction open while Kafka acknowledges its rows. A database whose
// sessions end transactions idle for 1 ms (managed services set such
// defaults) ended every claim there, released its buckets and had the
// rows claimed and sent again: the poll session turns the timeouts off for
// itself, and every event arrives once.
func TestPollClaimOutlivesTheServersTransactionTimeouts(t *testing.T) {
	env := testenv.Require(t)
	f := newPollFixture(t, env, 1)
	ctx := context.Background()
	f.exec(t, "DO $$BEGIN EXECUTE format('ALTER DATABASE %I SET idle_in_transaction_session_timeout = ''1ms''', current_database()); END$$")
	topic := f.pollTopic(t)
	f.runBalanced(t, f.pollConfig(), 1)
	c := env.NewConsumer(t, []string{topic})
	const n = 30
	for range n {
		if _, err := f.conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES (gen_random_uuid(), $1, 'k', 'T', '{}')`, f.slot); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, time.Minute, 20*time.Millisecond, func() (bool, string) {
		left := f.unpublished(t)
		return left == 0, fmt.Sprintf("%d rows still unpublished", left)
	})
	msgs := c.WaitFor(t, n, time.Minute)
	if ids := receivedIDs(msgs); len(ids) != n || len(c.Messages()) != n {
		t.Fatalf("%d records, %d distinct events; want %d once each", len(c.Messages()), len(ids), n)
	}
}

// TestPollKeepsARowItsWriterDeletes: a writer still in the WAL source's
// delete-after-insert mode (its row deleted in its own transaction) left
// nothing for the poll source to read: its events were lost without a
// word. The poll table's trigger skips the delete of an unpublished row,
// with a warning, and the event is published; a purge meant as one sets
// pgoutbox.delete_unpublished first.
func TestPollKeepsARowItsWriterDeletes(t *testing.T) {
	env := testenv.Require(t)
	f := newPollFixture(t, env, 1)
	ctx := context.Background()
	topic := f.pollTopic(t)
	c := env.NewConsumer(t, []string{topic})
	const kept = "00000000-0000-4000-8000-000700000001"
	if _, err := f.conn.Exec(ctx, `BEGIN; INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ('`+kept+`', '`+f.slot+`', 'k', 'T', '{}');
		DELETE FROM outbox WHERE id = '`+kept+`'; COMMIT`); err != nil {
		t.Fatal(err)
	}
	const purged = "00000000-0000-4000-8000-000700000002"
	if _, err := f.conn.Exec(ctx, `BEGIN; INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ('`+purged+`', '`+f.slot+`', 'k', 'T', '{}');
		SET LOCAL pgoutbox.delete_unpublished = on; DELETE FROM outbox WHERE id = '`+purged+`'; COMMIT`); err != nil {
		t.Fatal(err)
	}
	// TRUNCATE fires no row trigger: refused while a row is unpublished.
	if _, err := f.conn.Exec(ctx, "TRUNCATE outbox"); err == nil || !strings.Contains(err.Error(), "TRUNCATE would discard their events") {
		t.Fatalf("TRUNCATE of a table with an unpublished row: %v, want the trigger's refusal", err)
	}
	cfg := f.pollConfig()
	f.runBalanced(t, cfg, 1)
	waitIDs(t, c, []string{kept}, time.Minute)
	if f.unpublished(t) != 0 {
		t.Fatal("rows left unpublished")
	}
	for _, id := range receivedIDs(c.Messages()) {
		if id == purged {
			t.Fatal("the purged row was published")
		}
	}
}

// TestPollOnPublishDeleteDeletesWhatItPublished: with poll.on.publish
// delete the relay deletes the rows it published in the claim's
// transaction, past the trigger that keeps unpublished rows (which takes
// them for unpublished: their published_at is never set).
func TestPollOnPublishDeleteDeletesWhatItPublished(t *testing.T) {
	env := testenv.Require(t)
	f := newPollFixture(t, env, 1)
	ctx := context.Background()
	topic := f.pollTopic(t)
	c := env.NewConsumer(t, []string{topic})
	cfg := f.pollConfig()
	cfg.Poll.OnPublish = poll.OnPublishDelete
	f.runBalanced(t, cfg, 1)
	var ids []string
	for i := range 5 {
		id := fmt.Sprintf("00000000-0000-4000-8000-0008%08d", i)
		ids = append(ids, id)
		if _, err := f.conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, 'k', 'T', '{}')`, id, f.slot); err != nil {
			t.Fatal(err)
		}
	}
	waitIDs(t, c, ids, time.Minute)
	testenv.Eventually(t, time.Minute, 20*time.Millisecond, func() (bool, string) {
		var n int
		if err := f.checkDB.QueryRow(ctx, "SELECT count(*) FROM outbox").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0, fmt.Sprintf("%d published rows not deleted", n)
	})
}
