package relay_test

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pgoutbox/pgoutbox/checkpoint"
	"github.com/pgoutbox/pgoutbox/pkg/outboxtest"
	"github.com/pgoutbox/pgoutbox/pkg/relay"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
	"github.com/pgoutbox/pgoutbox/replication"
)

// inproc is a relay running in the test's process.
type inproc struct {
	cancel context.CancelFunc
	done   chan error
}

func runInProcess(t *testing.T, cfg relay.Config) *inproc {
	t.Helper()
	r, err := relay.New(cfg, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &inproc{cancel: cancel, done: make(chan error, 1)}
	go func() { p.done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-p.done:
		case <-time.After(time.Minute):
			t.Error("relay did not stop within a minute")
		}
	})
	return p
}

// stop stops the relay and returns Run's error.
func (p *inproc) stop(t *testing.T) error {
	t.Helper()
	p.cancel()
	select {
	case err := <-p.done:
		p.done <- err // for the cleanup
		return err
	case <-time.After(time.Minute):
		t.Fatal("relay did not stop within a minute")
		return nil
	}
}

// exited waits up to timeout for the relay to stop by itself.
func (p *inproc) exited(t *testing.T, timeout time.Duration) error {
	t.Helper()
	select {
	case err := <-p.done:
		p.done <- err
		return err
	case <-time.After(timeout):
		t.Fatalf("the relay did not stop within %s", timeout)
		return nil
	}
}

func (f *fixture) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	if _, err := f.conn.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func (f *fixture) walLSN(t *testing.T) checkpoint.LSN {
	t.Helper()
	return f.queryLSN(t, "SELECT pg_current_wal_lsn()::text")
}

// queryLSN runs sql, which returns one LSN as text, on the check connection.
func (f *fixture) queryLSN(t *testing.T, sql string) checkpoint.LSN {
	t.Helper()
	var s string
	if err := f.checkDB.QueryRow(context.Background(), sql).Scan(&s); err != nil {
		t.Fatal(err)
	}
	l, err := parseLSN(s)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// insertEvents writes n events, one transaction each, for aggregate type
// f.shape.AggregateTypes[0], with created_at given by at(i) (nil: now), and
// returns their ids.
func (f *fixture) insertEvents(t *testing.T, prefix string, n int, at func(i int) string) []string {
	t.Helper()
	var ids []string
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("00000000-0000-4000-8000-%s%08d", prefix, i)
		created := "now()"
		if at != nil {
			created = at(i)
		}
		f.exec(t, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, created_at) VALUES ($1, $2, $3, 'T', '{}', `+created+`)`,
			id, f.shape.AggregateTypes[0], fmt.Sprintf("k%d", i%3))
		ids = append(ids, id)
	}
	return ids
}

// partitionedOutbox replaces the fixture's outbox table with one
// partitioned by by, and creates each of partitions ("name PARTITION OF
// outbox FOR VALUES ...").
func (f *fixture) partitionedOutbox(t *testing.T, by string, partitions ...string) {
	t.Helper()
	f.exec(t, "DROP TABLE outbox")
	f.exec(t, `CREATE TABLE outbox (id uuid NOT NULL, aggregatetype varchar(255) NOT NULL, aggregateid varchar(255) NOT NULL,
		type varchar(255) NOT NULL, payload jsonb, created_at timestamptz NOT NULL DEFAULT now()) PARTITION BY `+by)
	for _, p := range partitions {
		f.exec(t, "CREATE TABLE "+p)
	}
}

func receivedIDs(msgs []testenv.Message) []string {
	var ids []string
	for _, m := range msgs {
		id, _ := m.Header("id")
		ids = append(ids, string(id))
	}
	slices.Sort(ids)
	return slices.Compact(ids)
}

// TestPartitionedOutboxLosesNothing: range- and hash-partitioned outbox
// tables, with the publication pgoutbox creates (changes reported under the
// partitioned table) and with an existing one that reports each partition
// under its own name; under load a partition is attached, and an old one
// detached and dropped. Every event arrives.
func TestPartitionedOutboxLosesNothing(t *testing.T) {
	env := testenv.Require(t)
	for _, c := range []struct {
		name, partitionBy string
		partitions        []string
		existingPub       bool
	}{
		{"range", "RANGE (created_at)", []string{
			"outbox_old PARTITION OF outbox FOR VALUES FROM ('2000-01-01') TO ('2020-01-01')",
			"outbox_now PARTITION OF outbox FOR VALUES FROM ('2020-01-01') TO ('2100-01-01')"}, false},
		{"range, existing publication without publish_via_partition_root", "RANGE (created_at)", []string{
			"outbox_old PARTITION OF outbox FOR VALUES FROM ('2000-01-01') TO ('2020-01-01')",
			"outbox_now PARTITION OF outbox FOR VALUES FROM ('2020-01-01') TO ('2100-01-01')"}, true},
		{"hash", "HASH (id)", []string{
			"outbox_h0 PARTITION OF outbox FOR VALUES WITH (MODULUS 3, REMAINDER 0)",
			"outbox_h1 PARTITION OF outbox FOR VALUES WITH (MODULUS 3, REMAINDER 1)",
			"outbox_h2 PARTITION OF outbox FOR VALUES WITH (MODULUS 3, REMAINDER 2)"}, false},
		{"hash, existing publication without publish_via_partition_root", "HASH (id)", []string{
			"outbox_h0 PARTITION OF outbox FOR VALUES WITH (MODULUS 2, REMAINDER 0)",
			"outbox_h1 PARTITION OF outbox FOR VALUES WITH (MODULUS 2, REMAINDER 1)"}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, env, 1)
			f.partitionedOutbox(t, c.partitionBy, c.partitions...)
			if c.existingPub {
				f.exec(t, "CREATE PUBLICATION "+f.pub+" FOR TABLE outbox WITH (publish = 'insert')")
			}
			consumer := env.NewConsumer(t, f.topics[:1])
			p := runInProcess(t, f.config())
			f.waitStreaming(t)
			range_ := strings.HasPrefix(c.partitionBy, "RANGE")
			old := func(i int) string {
				if range_ && i%2 == 0 {
					return "'2010-06-01'"
				}
				return "now()"
			}
			want := f.insertEvents(t, "0001", 11, old)
			if range_ {
				// A partition attached while streaming, and the old one
				// detached and dropped between writes.
				f.exec(t, "CREATE TABLE outbox_next PARTITION OF outbox FOR VALUES FROM ('2100-01-01') TO ('2200-01-01')")
				want = append(want, f.insertEvents(t, "0002", 5, func(int) string { return "'2150-01-01'" })...)
				want = append(want, f.insertEvents(t, "0003", 5, nil)...)
				f.exec(t, "ALTER TABLE outbox DETACH PARTITION outbox_old")
				want = append(want, f.insertEvents(t, "0004", 5, nil)...)
				f.exec(t, "DROP TABLE outbox_old")
				want = append(want, f.insertEvents(t, "0005", 5, func(int) string { return "'2150-01-01'" })...)
			}
			// The last event, after a position taken before it was written:
			// the stop must confirm past it. (Not the server's end of WAL,
			// which other tests' writes keep moving.)
			beforeLast := f.walLSN(t)
			want = append(want, f.insertEvents(t, "0009", 1, nil)...)
			msgs := consumer.WaitFor(t, len(want), time.Minute)
			slices.Sort(want)
			if got := receivedIDs(msgs); !slices.Equal(got, want) {
				t.Fatalf("received %d distinct events %v, want %d", len(got), got, len(want))
			}
			if err := p.stop(t); err != nil {
				t.Fatalf("Run: %v", err)
			}
			if confirmed, _ := f.slotState(t); confirmed <= beforeLast {
				t.Fatalf("slot confirmed only %s, not past the last event (written after %s)", confirmed, beforeLast)
			}
		})
	}
}

// TestCatalogChangesStopTheRelayLoudly: a change that takes the outbox out
// of the stream stops the relay within seconds, with an error naming what
// changed, and the slot is not confirmed past the change: the events
// written since are still to be relayed (from the table).
// TestAllTablesPublicationNeedsPartitionsThroughTheRoot: a publication FOR
// ALL TABLES that reports partitions under their own names (Debezium's
// dbz_publication as it creates it) is refused at start, naming the fix:
// in a stream of every table, the rows of a partition detached before
// pgoutbox read them could not be told from another table's. With
// publish_via_partition_root on, the same outbox streams, the events
// written before the change included: PostgreSQL decodes them with the
// catalog of their moment, under their partitions' names (they were
// skipped as other tables' rows while one version of the fix stood).
func TestAllTablesPublicationNeedsPartitionsThroughTheRoot(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 1)
	f.partitionedOutbox(t, "HASH (id)", "outbox_h0 PARTITION OF outbox FOR VALUES WITH (MODULUS 2, REMAINDER 0)", "outbox_h1 PARTITION OF outbox FOR VALUES WITH (MODULUS 2, REMAINDER 1)")
	f.exec(t, "CREATE PUBLICATION "+f.pub+" FOR ALL TABLES WITH (publish = 'insert')")
	// A slot that already holds events (Debezium's, say).
	f.exec(t, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", f.slot)
	before := f.insertEvents(t, "0009", 4, nil)
	err := runInProcess(t, f.config()).exited(t, time.Minute)
	if !errors.Is(err, replication.ErrCatalogUnusable) || !strings.Contains(err.Error(), "is FOR ALL TABLES and reports the changes of partitions under their own names") ||
		!strings.Contains(err.Error(), "publish_via_partition_root = true") {
		t.Fatalf("want a refusal naming the fix, got %v", err)
	}
	f.exec(t, "ALTER PUBLICATION "+f.pub+" SET (publish_via_partition_root = true)")
	consumer := env.NewConsumer(t, f.topics[:1])
	p := runInProcess(t, f.config())
	f.waitStreaming(t)
	want := append(before, f.insertEvents(t, "0001", 8, nil)...)
	msgs := consumer.WaitFor(t, len(want), time.Minute)
	slices.Sort(want)
	if got := receivedIDs(msgs); !slices.Equal(got, want) {
		t.Fatalf("received %v, want %v", got, want)
	}
	if err := p.stop(t); err != nil {
		t.Fatal(err)
	}
}

// TestEventColumnsLogicalDecodingOmitsAreRefused: a key column that is
// not in the table, or that is generated (logical decoding never sends
// generated columns before PostgreSQL 18, and then only stored ones with
// publish_generated_columns), would give every record no key, so their
// order per key would be lost without a word; an id or payload column so
// would make every row poison. Each is refused at start, naming the
// option and the column.
func TestEventColumnsLogicalDecodingOmitsAreRefused(t *testing.T) {
	env := testenv.Require(t)
	for _, c := range []struct {
		name, ddl string
		set       func(*relay.Config)
		want      string
	}{
		{"generated key", `ALTER TABLE outbox DROP COLUMN aggregateid, ADD COLUMN aggregateid text GENERATED ALWAYS AS (payload->>'order') STORED`,
			func(*relay.Config) {}, `table.field.event.key "aggregateid" is a generated column of outbox table public.outbox`},
		{"key column not in the table", "", func(c *relay.Config) { c.Router.EventKeyField = "order_id" },
			`table.field.event.key "order_id" is not a column of outbox table public.outbox`},
		{"payload column not in the table", "", func(c *relay.Config) { c.Router.EventPayloadField = "body" },
			`table.field.event.payload "body" is not a column of outbox table public.outbox`},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, env, 1)
			if c.ddl != "" {
				f.exec(t, c.ddl)
			}
			cfg := f.config()
			c.set(&cfg)
			err := runInProcess(t, cfg).exited(t, time.Minute)
			var fe *relay.FatalError
			if !errors.As(err, &fe) || !errors.Is(err, replication.ErrCatalogUnusable) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("want a fatal refusal saying %q, got %v", c.want, err)
			}
		})
	}
	// The poll source reads the table with queries, which return generated
	// columns too; a column not in the table is refused there as well.
	t.Run("poll source, key column not in the table", func(t *testing.T) {
		f := newPollFixture(t, env, 1)
		cfg := f.pollConfig()
		cfg.Router.EventKeyField = "order_id"
		err := runInProcess(t, cfg).exited(t, time.Minute)
		var fe *relay.FatalError
		if !errors.As(err, &fe) || !strings.Contains(err.Error(), `table.field.event.key "order_id" is not a column of outbox table public.outbox`) {
			t.Fatalf("want a fatal refusal naming the key column, got %v", err)
		}
	})
}

// TestEventColumnRenamedWhileStreamingStopsTheRelay: the start-up check
// above, for a change made while the relay streams. A key column renamed
// (or dropped, or made generated) comes in a new relation message, and the
// rows after it have no such column: every record went out without a key,
// so their order per key was lost without a word (Debezium's task stops).
// The relay now stops there, naming the option and the column, with the
// slot before the change; run again with the option set to the new name, it
// relays the rows after the change with their keys.
func TestEventColumnRenamedWhileStreamingStopsTheRelay(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 1)
	topic := f.topics[0]
	c := env.NewConsumer(t, []string{topic})
	cfg := f.config()
	p := runInProcess(t, cfg)
	f.waitStreaming(t)
	const before, after = "00000000-0000-4000-8000-00000000000a", "00000000-0000-4000-8000-00000000000b"
	f.exec(t, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, 'k1', 'T', '{}')`, before, f.shape.AggregateTypes[0])
	c.WaitFor(t, 1, time.Minute)
	f.exec(t, "ALTER TABLE outbox RENAME COLUMN aggregateid TO aggregate_id")
	f.exec(t, `INSERT INTO outbox (id, aggregatetype, aggregate_id, type, payload) VALUES ($1, $2, 'k2', 'T', '{}')`, after, f.shape.AggregateTypes[0])
	at := f.walLSN(t)
	err := p.exited(t, time.Minute)
	var fe *relay.FatalError
	if !errors.As(err, &fe) || !errors.Is(err, replication.ErrCatalogUnusable) || !strings.Contains(err.Error(), `table.field.event.key "aggregateid"`) {
		t.Fatalf("want a fatal stop naming table.field.event.key \"aggregateid\", got %v", err)
	}
	if confirmed, _ := f.slotState(t); confirmed >= at {
		t.Fatalf("the slot was confirmed to %s, past the row after the rename (before %s)", confirmed, at)
	}
	for _, m := range c.Messages() {
		if id, _ := m.Header("id"); string(id) == after {
			t.Fatalf("the row after the rename was sent (key %q)", m.Key)
		}
	}
	cfg.Router.EventKeyField = "aggregate_id"
	runInProcess(t, cfg)
	testenv.Eventually(t, time.Minute, 50*time.Millisecond, func() (bool, string) {
		for _, m := range c.Messages() {
			if id, _ := m.Header("id"); string(id) == after {
				return string(m.Key) == "k2", fmt.Sprintf("the row after the rename came with key %q", m.Key)
			}
		}
		return false, "the row after the rename has not arrived"
	})
}

// TestPublicationAlteredIsWarnedOf: the publication's catalog row written
// (ALTER PUBLICATION ... SET, OWNER TO, RENAME) may mean inserts were
// unpublished for a while (publish = 'update' and back), which leaves no
// other trace, or nothing at all (a SET that changes nothing, as tools
// that reconcile publications run): pgoutbox warns, once per change, at
// start for one made while it was stopped and while it streams, tells a
// relay.CatalogObserver (the metrics' pgoutbox_publication_altered_total,
// which PgoutboxPublicationAltered reads: a Warn alone reached no alert, an
// observability prober), and streams on.
func TestPublicationAlteredIsWarnedOf(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 1)
	consumer := env.NewConsumer(t, f.topics[:1])
	obs := &alteredObserver{}
	run := func() (*inproc, *observer.ObservedLogs) {
		core, logs := observer.New(zap.WarnLevel)
		r, err := relay.New(f.config(), zap.New(core), relay.WithObserver(obs))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		p := &inproc{cancel: cancel, done: make(chan error, 1)}
		go func() { p.done <- r.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-p.done; p.done <- nil })
		return p, logs
	}
	altered := func(logs *observer.ObservedLogs, since string, want int32) func() (bool, string) {
		return func() (bool, string) {
			n := logs.FilterMessageSnippet("was altered since " + since).Len()
			told := obs.n.Load()
			return n == 1 && told == want, fmt.Sprintf("%d warnings that the publication was altered since %s; the observer told %d times, want %d", n, since, told, want)
		}
	}
	p, _ := run()
	f.waitStreaming(t)
	want := f.insertEvents(t, "0001", 2, nil)
	consumer.WaitFor(t, len(want), time.Minute)
	if err := p.stop(t); err != nil {
		t.Fatal(err)
	}
	f.exec(t, "ALTER PUBLICATION "+f.pub+" SET (publish = 'update')")
	f.insertEvents(t, "0002", 1, nil) // never decoded
	f.exec(t, "ALTER PUBLICATION "+f.pub+" SET (publish = 'insert')")
	p, logs := run()
	testenv.Eventually(t, time.Minute, 20*time.Millisecond, altered(logs, "pgoutbox last streamed", 1))
	f.waitStreaming(t)
	// A SET that changes nothing, while streaming: warned of, and the
	// relay streams on.
	f.exec(t, "ALTER PUBLICATION "+f.pub+" SET (publish = 'insert')")
	testenv.Eventually(t, time.Minute, 20*time.Millisecond, altered(logs, "the session started", 2))
	want = append(want, f.insertEvents(t, "0003", 3, nil)...)
	msgs := consumer.WaitFor(t, len(want), time.Minute)
	slices.Sort(want)
	if got := receivedIDs(msgs); !slices.Equal(got, want) {
		t.Fatalf("received %v, want %v", got, want)
	}
	if err := p.stop(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// alteredObserver counts what a relay.CatalogObserver is told.
type alteredObserver struct {
	relay.NopObserver
	n atomic.Int32
}

func (o *alteredObserver) PublicationAltered(string) { o.n.Add(1) }

func TestCatalogChangesStopTheRelayLoudly(t *testing.T) {
	env := testenv.Require(t)
	// The outbox in a schema of its own (the state table stays in public),
	// which the search path finds, as it finds the table while it is away.
	const inSchema = "CREATE SCHEMA ev; CREATE SCHEMA away; ALTER TABLE outbox SET SCHEMA ev; SET search_path = ev, public, away; CREATE PUBLICATION $PUB FOR TABLES IN SCHEMA ev WITH (publish = 'insert')"
	const moveAway = "ALTER TABLE outbox SET SCHEMA away | ALTER TABLE away.outbox SET SCHEMA ev"
	recreate := `DROP TABLE outbox; CREATE TABLE outbox (id uuid PRIMARY KEY, aggregatetype varchar(255) NOT NULL,
		aggregateid varchar(255) NOT NULL, type varchar(255) NOT NULL, payload jsonb, created_at timestamptz NOT NULL DEFAULT now())`
	for _, c := range []struct {
		name, ddl, want string
		// restart: the change is made while the relay is stopped.
		restart bool
		// setup runs before the relay starts.
		setup string
	}{
		{"table dropped and created again", recreate, "was dropped and created again", false, ""},
		{"table renamed", "ALTER TABLE outbox RENAME TO outbox_old; CREATE TABLE outbox (LIKE outbox_old INCLUDING ALL)", "outbox", false, ""},
		{"table dropped from the publication", "ALTER PUBLICATION $PUB DROP TABLE outbox", "does not include table public.outbox", false, ""},
		{"publication dropped and created again", "DROP PUBLICATION $PUB; CREATE PUBLICATION $PUB FOR TABLE outbox WITH (publish = 'insert')", "publication", false, ""},
		{"table dropped and created again while stopped", recreate + "; ALTER PUBLICATION $PUB ADD TABLE outbox", "since pgoutbox last streamed", true, ""},
		// Table inheritance: the child's rows are decoded under its own
		// name, and a publication takes in only the children it was made
		// with (inserts into this one would pass unseen).
		{"table inheriting from the outbox created", "CREATE TABLE outbox_2026 () INHERITS (outbox)", "table public.outbox_2026 inherits from outbox table public.outbox", false, ""},
		{"table inheriting from the outbox created while stopped", "CREATE TABLE outbox_2026 () INHERITS (outbox)", "table public.outbox_2026 inherits from outbox table public.outbox", true, ""},
		// Changes undone before a check: the catalog looks as before, but
		// the event written in between (at |) was never decoded.
		{"table taken out of the publication and put back", "ALTER PUBLICATION $PUB DROP TABLE outbox | ALTER PUBLICATION $PUB ADD TABLE outbox", "was taken out of publication", false, ""},
		{"table taken out of the publication and put back while stopped", "ALTER PUBLICATION $PUB DROP TABLE outbox | ALTER PUBLICATION $PUB ADD TABLE outbox", "was taken out of publication", true, ""},
		// A publication of the table's schema: the table moved to another
		// schema and back keeps its OID, its name and the schema's
		// membership row, and PostgreSQL decoded nothing of it while it
		// was elsewhere.
		{"table moved out of the published schema and back", moveAway, "was moved to another schema and back", false, inSchema},
		{"table moved out of the published schema and back while stopped", moveAway, "was moved to another schema and back", true, inSchema},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, env, 1)
			if c.setup != "" {
				f.exec(t, strings.ReplaceAll(c.setup, "$PUB", f.pub))
			}
			consumer := env.NewConsumer(t, f.topics[:1])
			cfg := f.config()
			if c.setup == inSchema {
				cfg.Postgres.Tables = []string{"ev.outbox"}
			}
			p := runInProcess(t, cfg)
			f.waitStreaming(t)
			consumer.WaitFor(t, len(f.insertEvents(t, "0001", 3, nil)), time.Minute)
			if c.restart {
				if err := p.stop(t); err != nil {
					t.Fatalf("Run: %v", err)
				}
			}
			ddl := strings.ReplaceAll(c.ddl, "$PUB", f.pub)
			steps := strings.Split(ddl, "|")
			var after checkpoint.LSN
			switch {
			case len(steps) == 1:
				f.exec(t, ddl)
				after = f.walLSN(t)
			case !c.restart:
				// One transaction, so that no check can see the table out,
				// with an event (never decoded) in the middle.
				f.exec(t, strings.Join(steps, fmt.Sprintf(`; INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
					VALUES ('00000000-0000-4000-8000-000900000000', '%s', 'k', 'T', '{}'); `, f.shape.AggregateTypes[0])))
				after = f.walLSN(t)
			default:
				for i, step := range steps {
					if i > 0 {
						f.insertEvents(t, "0009", 1, nil)
					}
					f.exec(t, step)
					if i == 0 {
						// The slot stays where the stop left it, before this.
						after = f.walLSN(t)
					}
				}
			}
			// Writes after the change, and other WAL for idle keepalives to
			// report, which must not be confirmed either.
			f.insertEvents(t, "0002", 5, nil)
			f.exec(t, "INSERT INTO outbox_other (note) SELECT repeat('x', 1000) FROM generate_series(1, 2000)")
			if c.restart {
				p = runInProcess(t, cfg)
			}
			err := p.exited(t, 30*time.Second)
			var fe *relay.FatalError
			if !errors.As(err, &fe) || !errors.Is(err, replication.ErrCatalogChanged) && !errors.Is(err, replication.ErrCatalogUnusable) {
				t.Fatalf("want a fatal catalog error, got %v", err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error does not say %q: %v", c.want, err)
			}
			if confirmed, _ := f.slotState(t); confirmed > after {
				t.Fatalf("slot confirmed %s, past %s where the change was", confirmed, after)
			}
			t.Logf("%v", err)
		})
	}
}

// TestRecreatedOutboxInAnAllTablesStreamIsNotSkipped: with a publication of
// every table, an outbox table dropped and created again while pgoutbox
// streams (in exactly-once mode) has its new rows in the stream under a new
// OID. The relay stops on the change before it passes the first of them
// (it asks the catalog about an outbox table's name it does not know,
// instead of reading the rows as another table's), so the position the
// offsets topic stores stays before them, although a second outbox table's
// events keep Kafka transactions committing meanwhile; after `migrate
// --accept-catalog` the next session relays them. Read with read_committed,
// every event arrives exactly once. (Before, the stored position passed
// them, and the next session skipped them.)
func TestRecreatedOutboxInAnAllTablesStreamIsNotSkipped(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 1)
	ctx := context.Background()
	f.exec(t, "CREATE TABLE outbox2 (LIKE outbox INCLUDING ALL)")
	f.exec(t, "CREATE PUBLICATION "+f.pub+" FOR ALL TABLES WITH (publish = 'insert')")
	tables := "PGOUTBOX_POSTGRES_TABLE_INCLUDE_LIST=public.outbox,public.outbox2"
	committed := func(n int) func() (bool, string) {
		return func() (bool, string) {
			got := receivedIDs(readToEnd(t, env, f.topics[:1], sarama.ReadCommitted))
			return len(got) >= n, fmt.Sprintf("%d of %d events committed to Kafka", len(got), n)
		}
	}
	p := startEOS(t, f, "first.log", tables)
	want := f.insertEvents(t, "0001", 3, nil)
	testenv.Eventually(t, time.Minute, 50*time.Millisecond, committed(len(want)))

	// Events into the second table, one transaction each, until the relay
	// stops (at most 20,000 or a minute).
	wconn, err := pgx.Connect(ctx, f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer wconn.Close(context.Background())
	var others []string
	writerDone := make(chan error, 1)
	go func() {
		deadline := time.Now().Add(time.Minute)
		for i := 0; i < 20000 && time.Now().Before(deadline); i++ {
			select {
			case <-p.done:
				writerDone <- nil
				return
			default:
			}
			id := fmt.Sprintf("00000000-0000-4000-8000-0005%08d", i)
			if _, err := wconn.Exec(ctx, `INSERT INTO outbox2 (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, 'k2', 'T', '{}')`,
				id, f.shape.AggregateTypes[0]); err != nil {
				writerDone <- err
				return
			}
			others = append(others, id)
		}
		writerDone <- nil
	}()
	testenv.Eventually(t, time.Minute, 20*time.Millisecond, committed(len(want)+20))

	// Dropped and created again with two events, in one transaction.
	f.exec(t, `DROP TABLE outbox; CREATE TABLE outbox (id uuid PRIMARY KEY, aggregatetype varchar(255) NOT NULL,
		aggregateid varchar(255) NOT NULL, type varchar(255) NOT NULL, payload jsonb, created_at timestamptz NOT NULL DEFAULT now());
		INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
		VALUES ('00000000-0000-4000-8000-000200000000', '`+f.shape.AggregateTypes[0]+`', 'k0', 'T', '{}'),
			('00000000-0000-4000-8000-000200000001', '`+f.shape.AggregateTypes[0]+`', 'k1', 'T', '{}')`)
	want = append(want, "00000000-0000-4000-8000-000200000000", "00000000-0000-4000-8000-000200000001")
	if code := p.wait(t, time.Minute); code == 0 {
		t.Fatal("exit 0 after the outbox table was dropped and created again")
	}
	if err := <-writerDone; err != nil {
		t.Fatal(err)
	}
	want = append(want, others...)
	if last := lastLine(t, p); !strings.Contains(last, "was dropped and created again") {
		t.Fatalf("last line %q does not name the change", last)
	}
	cmd := exec.Command(pgoutboxBinary(t), "migrate", "--accept-catalog")
	cmd.Env = append(f.environ(), append(eosEnviron(f), tables)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("migrate --accept-catalog: %v\n%s", err, out)
	}
	p = startEOS(t, f, "second.log", tables)
	want = append(want, f.insertEvents(t, "0003", 2, nil)...)
	testenv.Eventually(t, time.Minute, 50*time.Millisecond, committed(len(want)))
	p.terminate(t, time.Minute)
	slices.Sort(want)
	msgs := readToEnd(t, env, f.topics[:1], sarama.ReadCommitted)
	if got := receivedIDs(msgs); !slices.Equal(got, want) || len(msgs) != len(want) {
		missing := 0
		for _, id := range want {
			if _, found := slices.BinarySearch(got, id); !found {
				missing++
				t.Logf("missing: %s", id)
			}
		}
		t.Fatalf("read_committed: %d records of %d events, %d missing; want each once", len(msgs), len(want), missing)
	}
}

// TestATableThatHadAnOutboxNameForAWhileIsRefusedByName: with a publication
// of every table, a table that had an outbox table's name only for a while
// (the outbox renamed away, another created under its name with two events,
// then dropped, and the outbox renamed back, all before any check) leaves
// the catalog as it was, so no check reports a change; its rows arrive
// under the outbox table's name with an OID pgoutbox does not know. They
// are refused by name (poison, here: the relay stops), not skipped as
// another table's.
func TestATableThatHadAnOutboxNameForAWhileIsRefusedByName(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 1)
	f.exec(t, "CREATE PUBLICATION "+f.pub+" FOR ALL TABLES WITH (publish = 'insert')")
	consumer := env.NewConsumer(t, f.topics[:1])
	p := runInProcess(t, f.config())
	f.waitStreaming(t)
	consumer.WaitFor(t, len(f.insertEvents(t, "0001", 3, nil)), time.Minute)
	f.exec(t, `ALTER TABLE outbox RENAME TO outbox_kept; CREATE TABLE outbox (LIKE outbox_kept INCLUDING ALL);
		INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
		VALUES ('00000000-0000-4000-8000-000200000000', '`+f.shape.AggregateTypes[0]+`', 'k0', 'T', '{}');
		DROP TABLE outbox; ALTER TABLE outbox_kept RENAME TO outbox`)
	err := p.exited(t, 30*time.Second)
	if err == nil || !strings.Contains(err.Error(), "has the name of an outbox table but is not the table pgoutbox streams") {
		t.Fatalf("want the rows refused by name, got %v", err)
	}
}

// TestAllTablesPublicationNamesTheTablesItSkips: in a FOR ALL TABLES
// publication the changes of tables that are not outbox tables are
// skipped (a counter counts them); an outbox table left out of
// postgres.table.include.list would be skipped the same way, so each such
// table is named in the log, once per session.
func TestAllTablesPublicationNamesTheTablesItSkips(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 1)
	f.exec(t, "CREATE PUBLICATION "+f.pub+" FOR ALL TABLES WITH (publish = 'insert')")
	core, logs := observer.New(zapcore.InfoLevel)
	consumer := env.NewConsumer(t, f.topics[:1])
	stop := runRelayLog(t, f.config(), zap.New(zapcore.NewTee(core, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)).Core())))
	f.waitStreaming(t)
	// An outbox table left out of the list: its events are skipped, and
	// the line says so at Warn.
	if err := outboxtest.Setup(context.Background(), f.conn, "outbox_left_out"); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		f.exec(t, "INSERT INTO outbox_other (note) VALUES ('business')")
		f.exec(t, "INSERT INTO outbox_left_out (id, aggregatetype, aggregateid, type, payload) VALUES (gen_random_uuid(), 'A', 'k', 'T', '{}')")
	}
	want := f.insertEvents(t, "0001", 1, nil)
	consumer.WaitFor(t, len(want), time.Minute)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	lines := logs.FilterMessageSnippet("not an outbox table").All()
	levels := map[string]zapcore.Level{}
	var got []string
	for _, l := range lines {
		levels[fmt.Sprint(l.ContextMap()["table"])] = l.Level
		got = append(got, fmt.Sprint(l.Level, l.Message, l.ContextMap()))
	}
	if len(lines) != 2 || levels["public.outbox_other"] != zapcore.InfoLevel || levels["public.outbox_left_out"] != zapcore.WarnLevel {
		t.Fatalf("log lines naming skipped tables: %v, want one each for public.outbox_other (info) and public.outbox_left_out (warn)", got)
	}
}

// TestTableJoiningWithOlderRowsIsRefused: an outbox table added to the
// relay's tables later is streamed from its joining the publication on;
// rows committed into it before that were never decoded, so never relayed,
// and pgoutbox cleanup, which deletes by the slot's position, would delete
// them as relayed. A table that joins empty, with rows written after it
// joined the publication, streams as before (its rows arrive); one that
// joins with older rows stops the start (fatal, naming it and the way on)
// and holds cleanup. (Before, nothing was said, and cleanup deleted them.)
func TestTableJoiningWithOlderRowsIsRefused(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 1)
	ctx := context.Background()
	c := env.NewConsumer(t, f.topics)
	cfg := f.config()
	w := runInProcess(t, cfg)
	f.waitStreaming(t)
	first := f.insertEvents(t, "0001", 2, nil)
	c.WaitFor(t, len(first), time.Minute)
	if err := w.stop(t); err != nil {
		t.Fatal(err)
	}
	insert := func(table, id string) {
		f.exec(t, "INSERT INTO "+table+" (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, 'k', 'T', '{}')", id, f.shape.AggregateTypes[0])
	}
	pub := pgx.Identifier{f.pub}.Sanitize()

	// Joins first, then written into: streamed.
	if err := outboxtest.Setup(ctx, f.conn, "outbox3"); err != nil {
		t.Fatal(err)
	}
	f.exec(t, "ALTER PUBLICATION "+pub+" ADD TABLE outbox3")
	later := "00000000-0000-4000-8000-000300000001"
	insert("outbox3", later)
	cfg.Postgres.Tables = []string{"public.outbox", "public.outbox3"}
	w = runInProcess(t, cfg)
	c.WaitFor(t, len(first)+1, time.Minute)
	if err := w.stop(t); err != nil {
		t.Fatal(err)
	}
	if hold := f.cleanupHold(t); hold != "" {
		t.Fatalf("cleanup held after a table joined empty: %q", hold)
	}

	// Written into, then joins: refused.
	if err := outboxtest.Setup(ctx, f.conn, "outbox2"); err != nil {
		t.Fatal(err)
	}
	older := "00000000-0000-4000-8000-000200000001"
	insert("outbox2", older)
	f.exec(t, "ALTER PUBLICATION "+pub+" ADD TABLE outbox2")
	cfg.Postgres.Tables = []string{"public.outbox", "public.outbox2", "public.outbox3"}
	err := runInProcess(t, cfg).exited(t, time.Minute)
	var fe *relay.FatalError
	if !errors.As(err, &fe) || !errors.Is(err, replication.ErrCatalogChanged) || !strings.Contains(err.Error(), "outbox table public.outbox2 is new to pgoutbox") ||
		strings.Contains(err.Error(), "public.outbox3 is new") {
		t.Fatalf("start with public.outbox2 joining with an older row: %v; want a fatal ErrCatalogChanged naming it alone", err)
	}
	if hold := f.cleanupHold(t); hold == "" {
		t.Fatal("cleanup is not held after the refused start")
	}
}

// TestTableJoiningAnAllTablesStreamWithSkippedRowsIsRefused: in a FOR ALL
// TABLES publication an outbox table pgoutbox is not configured for is
// decoded and skipped (named at Warn). Added to the configuration later,
// its rows written while it was skipped were never relayed: the start
// refuses, as for rows older than a table's membership.
func TestTableJoiningAnAllTablesStreamWithSkippedRowsIsRefused(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 1)
	ctx := context.Background()
	f.exec(t, "CREATE PUBLICATION "+f.pub+" FOR ALL TABLES WITH (publish = 'insert', publish_via_partition_root = true)")
	if err := outboxtest.Setup(ctx, f.conn, "outbox_later"); err != nil {
		t.Fatal(err)
	}
	c := env.NewConsumer(t, f.topics)
	cfg := f.config()
	w := runInProcess(t, cfg)
	f.waitStreaming(t)
	f.exec(t, "INSERT INTO outbox_later (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, 'k', 'T', '{}')",
		"00000000-0000-4000-8000-000400000001", f.shape.AggregateTypes[0])
	first := f.insertEvents(t, "0001", 1, nil)
	c.WaitFor(t, len(first), time.Minute)
	if err := w.stop(t); err != nil {
		t.Fatal(err)
	}
	cfg.Postgres.Tables = []string{"public.outbox", "public.outbox_later"}
	err := runInProcess(t, cfg).exited(t, time.Minute)
	var fe *relay.FatalError
	if !errors.As(err, &fe) || !errors.Is(err, replication.ErrCatalogChanged) || !strings.Contains(err.Error(), "its changes were skipped") {
		t.Fatalf("start with public.outbox_later joining after its rows were skipped: %v; want a fatal ErrCatalogChanged naming it", err)
	}
}

// TestPartitionAttachedWithOlderRowsIsRefused: a table written into and
// then attached as a partition of the outbox table (ATTACH PARTITION)
// brings rows PostgreSQL decoded as that table's own, never as the
// outbox's: they are not in the stream, and cleanup would delete them as
// relayed. Attached while the relay streams, it stops, naming the
// partition, and holds cleanup; attached while it is stopped, cleanup
// refuses before any start, and the start refuses, until migrate
// --accept-catalog records the partition. A table attached empty and
// written into afterwards streams as any partition.
func TestPartitionAttachedWithOlderRowsIsRefused(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 1)
	ctx := context.Background()
	f.partitionedOutbox(t, "RANGE (created_at)", "outbox_now PARTITION OF outbox FOR VALUES FROM ('2020-01-01') TO ('2100-01-01')")
	c := env.NewConsumer(t, f.topics[:1])
	cfg := f.config()
	w := runInProcess(t, cfg)
	f.waitStreaming(t)
	want := f.insertEvents(t, "0001", 2, nil)
	// Attached empty, then written into: streamed, nothing held.
	f.exec(t, "CREATE TABLE outbox_2100 (LIKE outbox INCLUDING DEFAULTS)")
	f.exec(t, "ALTER TABLE outbox ATTACH PARTITION outbox_2100 FOR VALUES FROM ('2100-01-01') TO ('2200-01-01')")
	at := func(year string) func(int) string { return func(int) string { return "'" + year + "-06-01'" } }
	want = append(want, f.insertEvents(t, "0002", 2, at("2150"))...)
	slices.Sort(want)
	if got := receivedIDs(c.WaitFor(t, len(want), time.Minute)); !slices.Equal(got, want) {
		t.Fatalf("received %v, want %v", got, want)
	}
	// Looked at once: the state row records it for the next start and
	// for cleanup.
	testenv.Eventually(t, time.Minute, 20*time.Millisecond, func() (bool, string) {
		var recorded bool
		err := f.checkDB.QueryRow(ctx, "SELECT coalesce(membership -> 'partitions' ? ('outbox_2100'::regclass::oid)::text, false) FROM pgoutbox_state WHERE slot_name = $1", f.slot).Scan(&recorded)
		return recorded, fmt.Sprintf("the partition attached while streaming is not recorded in the state row (%v)", err)
	})
	before := func(table, year, id string) {
		f.exec(t, "CREATE TABLE "+table+" (LIKE outbox INCLUDING DEFAULTS)")
		f.exec(t, "INSERT INTO "+table+" (id, aggregatetype, aggregateid, type, payload, created_at) VALUES ($1, $2, 'k', 'T', '{}', '"+year+"-06-01')",
			id, f.shape.AggregateTypes[0])
	}

	// Written into, then attached while the relay streams: it stops.
	before("outbox_2200", "2250", "00000000-0000-4000-8000-000300000001")
	f.exec(t, "ALTER TABLE outbox ATTACH PARTITION outbox_2200 FOR VALUES FROM ('2200-01-01') TO ('2300-01-01')")
	err := w.exited(t, time.Minute)
	var fe *relay.FatalError
	if !errors.As(err, &fe) || !errors.Is(err, replication.ErrCatalogChanged) || !strings.Contains(err.Error(), "partition public.outbox_2200") ||
		!strings.Contains(err.Error(), "holds rows written before it became part of it") || strings.Contains(err.Error(), "outbox_2100") {
		t.Fatalf("relay with public.outbox_2200 attached holding a row: %v; want a fatal ErrCatalogChanged naming it alone", err)
	}
	if hold := f.cleanupHold(t); hold == "" {
		t.Fatal("cleanup is not held after the relay stopped on the attached rows")
	}
	if err := runInProcess(t, cfg).exited(t, time.Minute); !errors.Is(err, replication.ErrCatalogChanged) || !strings.Contains(err.Error(), "partition public.outbox_2200") {
		t.Fatalf("the next start: %v; want it refused as well", err)
	}
	accept := func() {
		t.Helper()
		cmd := exec.Command(pgoutboxBinary(t), "migrate", "--accept-catalog")
		cmd.Env = f.environ()
		if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "accepted: partition public.outbox_2") {
			t.Fatalf("migrate --accept-catalog: %v\n%s", err, out)
		}
	}
	accept()
	w = runInProcess(t, cfg)
	f.waitStreaming(t)
	want = append(want, f.insertEvents(t, "0004", 1, at("2250"))...)
	slices.Sort(want)
	// The attached row is not among them: it is the user's to relay.
	// (The stop re-sends what it had not confirmed: duplicates.)
	waitIDs(t, c, want, time.Minute)
	if got := receivedIDs(c.Messages()); !slices.Equal(got, want) {
		t.Fatalf("received %v, want %v", got, want)
	}
	if err := w.stop(t); err != nil {
		t.Fatal(err)
	}
	if _, err := f.checkDB.Exec(ctx, "UPDATE pgoutbox_state SET cleanup_hold = NULL WHERE slot_name = $1", f.slot); err != nil {
		t.Fatal(err)
	}

	// Written into, then attached while the relay is stopped: cleanup
	// deletes nothing before any start, and the start refuses.
	before("outbox_2300", "2350", "00000000-0000-4000-8000-000500000001")
	f.exec(t, "ALTER TABLE outbox ATTACH PARTITION outbox_2300 FOR VALUES FROM ('2300-01-01') TO ('2400-01-01')")
	cl := exec.Command(pgoutboxBinary(t), "cleanup", "--retention", "0s")
	cl.Env = f.environ()
	if out, err := cl.CombinedOutput(); err == nil || !strings.Contains(string(out), "nothing was deleted") || !strings.Contains(string(out), "partition public.outbox_2300") {
		t.Fatalf("cleanup with public.outbox_2300 attached holding a row: %v\n%s", err, out)
	}
	if err := runInProcess(t, cfg).exited(t, time.Minute); !errors.Is(err, replication.ErrCatalogChanged) ||
		!strings.Contains(err.Error(), "partition public.outbox_2300") || strings.Contains(err.Error(), "outbox_2200") {
		t.Fatalf("start with public.outbox_2300 attached holding a row: %v; want a refusal naming it alone", err)
	}
	if hold := f.cleanupHold(t); hold == "" {
		t.Fatal("cleanup is not held after the refused start")
	}
	accept()
}

// TestOutboxTableThatIsAPartitionUnderItsRootIsRefused: with
// publish_via_partition_root, a publication reports a partition's changes
// under the topmost table it carries (the root, in a FOR ALL TABLES one).
// An outbox table that is itself a partition then streams as that table,
// which is not an outbox table: in a stream of every table its events were
// skipped as another table's, with nothing but a warning. Refused at start;
// and an outbox table attached to a partitioned table while the relay
// streams stops it, with nothing confirmed past the attach.
func TestOutboxTableThatIsAPartitionUnderItsRootIsRefused(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 1)
	f.exec(t, "CREATE PUBLICATION "+f.pub+" FOR ALL TABLES WITH (publish = 'insert', publish_via_partition_root = true)")
	c := env.NewConsumer(t, f.topics[:1])
	w := runInProcess(t, f.config())
	f.waitStreaming(t)
	want := f.insertEvents(t, "0001", 2, nil)
	c.WaitFor(t, len(want), time.Minute)
	f.exec(t, `CREATE TABLE events (id uuid NOT NULL, aggregatetype varchar(255) NOT NULL, aggregateid varchar(255) NOT NULL,
		type varchar(255) NOT NULL, payload jsonb, created_at timestamptz NOT NULL DEFAULT now()) PARTITION BY LIST (aggregatetype)`)
	f.exec(t, "ALTER TABLE events ATTACH PARTITION outbox FOR VALUES IN ('"+f.shape.AggregateTypes[0]+"')")
	attached := f.walLSN(t)
	f.insertEvents(t, "0002", 2, nil)
	err := w.exited(t, time.Minute)
	var fe *relay.FatalError
	if !errors.As(err, &fe) || !errors.Is(err, replication.ErrCatalogChanged) || !strings.Contains(err.Error(), "outbox table public.outbox is a partition of public.events") {
		t.Fatalf("relay with its outbox table attached to public.events: %v; want a fatal ErrCatalogChanged naming both", err)
	}
	if confirmed, _ := f.slotState(t); confirmed > attached {
		t.Fatalf("slot confirmed %s, past %s, where the outbox table became a partition", confirmed, attached)
	}
	err = runInProcess(t, f.config()).exited(t, time.Minute)
	if !errors.Is(err, replication.ErrCatalogUnusable) || !strings.Contains(err.Error(), "outbox table public.outbox is a partition of public.events") {
		t.Fatalf("start with the outbox table a partition of public.events: %v; want ErrCatalogUnusable naming both", err)
	}
}

// TestInsertsKeptFromTheOutboxTableAreRefusedOrNamed: a rule ON INSERT DO
// INSTEAD replaces the inserts into the outbox table, so their events never
// reach the WAL as the outbox's; the start refuses, naming it. A BEFORE
// INSERT row trigger may skip a row (returning NULL), which no relay can
// see: the start names it at Warn (the writer library fails such a write:
// TestWriteReportsDatabaseErrors).
func TestInsertsKeptFromTheOutboxTableAreRefusedOrNamed(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 1)
	f.exec(t, "CREATE RULE swallow AS ON INSERT TO outbox DO INSTEAD NOTHING")
	err := runInProcess(t, f.config()).exited(t, time.Minute)
	if !errors.Is(err, replication.ErrCatalogUnusable) || !strings.Contains(err.Error(), "rule public.outbox: swallow replaces the inserts into outbox table public.outbox") {
		t.Fatalf("start with an INSTEAD rule on the outbox table: %v; want ErrCatalogUnusable naming it", err)
	}
	f.exec(t, "DROP RULE swallow ON outbox")
	f.exec(t, `CREATE FUNCTION skip_some() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$`)
	f.exec(t, "CREATE TRIGGER maybe_skip BEFORE INSERT ON outbox FOR EACH ROW EXECUTE FUNCTION skip_some()")
	f.exec(t, "CREATE TRIGGER after_insert AFTER INSERT ON outbox FOR EACH ROW EXECUTE FUNCTION skip_some()")
	core, logs := observer.New(zapcore.WarnLevel)
	consumer := env.NewConsumer(t, f.topics[:1])
	stop := runRelayLog(t, f.config(), zap.New(zapcore.NewTee(core, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)).Core())))
	f.waitStreaming(t)
	want := f.insertEvents(t, "0001", 1, nil)
	consumer.WaitFor(t, len(want), time.Minute)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	lines := logs.FilterMessageSnippet("has BEFORE INSERT row triggers").All()
	if len(lines) != 1 || fmt.Sprint(lines[0].ContextMap()["triggers"]) != "[public.outbox: maybe_skip]" {
		t.Fatalf("warnings naming BEFORE INSERT triggers: %v, want one naming maybe_skip alone", lines)
	}
}

// TestPartitionDetachedWhileStreamingIsNoLongerTheOutbox: a partition
// the publication carries on its own (listed, or its schema) keeps
// streaming once detached, under its own OID. With partitions reported
// under their own names that OID was all that told its rows from the
// outbox's, before and after the detach alike: such a publication is
// refused, naming the fix. With publish_via_partition_root on, an attached
// partition's rows arrive as its table's, so rows under the partition's
// own name are no outbox rows: the relay stops on them, naming the table,
// where it relayed them as events before.
func TestPartitionDetachedWhileStreamingIsNoLongerTheOutbox(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 1)
	f.partitionedOutbox(t, "RANGE (created_at)", "outbox_old PARTITION OF outbox FOR VALUES FROM ('2000-01-01') TO ('2020-01-01')", "outbox_now PARTITION OF outbox FOR VALUES FROM ('2020-01-01') TO ('2100-01-01')")
	f.exec(t, "CREATE PUBLICATION "+f.pub+" FOR TABLE outbox, outbox_old WITH (publish = 'insert')")
	err := runInProcess(t, f.config()).exited(t, time.Minute)
	if !errors.Is(err, replication.ErrCatalogUnusable) || !strings.Contains(err.Error(), "carries partition public.outbox_old of outbox table public.outbox on its own") {
		t.Fatalf("start with a partition published on its own, under its own name: %v; want ErrCatalogUnusable naming it", err)
	}
	f.exec(t, "ALTER PUBLICATION "+f.pub+" SET (publish_via_partition_root = true)")
	c := env.NewConsumer(t, f.topics[:1])
	w := runInProcess(t, f.config())
	f.waitStreaming(t)
	want := f.insertEvents(t, "0001", 4, func(i int) string {
		if i%2 == 0 {
			return "'2010-06-01'"
		}
		return "now()"
	})
	slices.Sort(want)
	if got := receivedIDs(c.WaitFor(t, len(want), time.Minute)); !slices.Equal(got, want) {
		t.Fatalf("received %v, want %v", got, want)
	}
	f.exec(t, "ALTER TABLE outbox DETACH PARTITION outbox_old")
	const notAnEvent = "00000000-0000-4000-8000-000600000001"
	f.exec(t, "INSERT INTO outbox_old (id, aggregatetype, aggregateid, type, payload, created_at) VALUES ($1, $2, 'k', 'T', '{}', '2010-06-01')",
		notAnEvent, f.shape.AggregateTypes[0])
	err = w.exited(t, time.Minute)
	var fe *relay.FatalError
	if !errors.As(err, &fe) || !strings.Contains(err.Error(), "table public.outbox_old") || !strings.Contains(err.Error(), "is not one any more") {
		t.Fatalf("relay after outbox_old was detached and written into: %v; want a fatal error naming it", err)
	}
	for _, id := range receivedIDs(c.Messages()) {
		if id == notAnEvent {
			t.Fatalf("the row written into the detached table was relayed as an event")
		}
	}
}

// TestTableLeftOutOfTheConfigurationIsRefused: a relay whose configuration
// lost one of the outbox tables the last session on its slot relayed (a
// blue/green deployment whose green side drifted, a list overridden by a
// Helm value), under a FOR ALL TABLES publication that still carries it,
// skipped the table's events as another table's with one Warn, confirmed
// past them and recorded the shorter list (a reviewer showed it). The start
// is refused, naming the table, until it is configured again or migrate
// --accept-catalog records that it is no longer an outbox table.
func TestTableLeftOutOfTheConfigurationIsRefused(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 1)
	ctx := context.Background()
	if err := outboxtest.Setup(ctx, f.conn, "outbox_b"); err != nil {
		t.Fatal(err)
	}
	f.exec(t, "CREATE PUBLICATION "+f.pub+" FOR ALL TABLES WITH (publish = 'insert')")
	both := f.config()
	both.Postgres.Tables = []string{"public.outbox", "public.outbox_b"}
	p := runInProcess(t, both)
	f.waitStreaming(t)
	if err := p.stop(t); err != nil {
		t.Fatal(err)
	}
	one := f.config() // public.outbox alone, as f.environ() says too
	for _, what := range []string{"the first start without it", "the start after"} {
		err := runInProcess(t, one).exited(t, time.Minute)
		if !errors.Is(err, replication.ErrCatalogUnusable) || !strings.Contains(err.Error(), "outbox table public.outbox_b") || !strings.Contains(err.Error(), "--accept-catalog") {
			t.Fatalf("%s: %v; want a refusal naming public.outbox_b and migrate --accept-catalog", what, err)
		}
	}
	cmd := exec.Command(pgoutboxBinary(t), "migrate", "--accept-catalog")
	cmd.Env = f.environ()
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "accepted: outbox table public.outbox_b") {
		t.Fatalf("migrate --accept-catalog: %v\n%s", err, out)
	}
	p = runInProcess(t, one)
	f.waitStreaming(t)
	if err := p.stop(t); err != nil {
		t.Fatal(err)
	}
	// Configured again: accepted as a table new to the relay (it holds no
	// rows it never relayed).
	p = runInProcess(t, both)
	f.waitStreaming(t)
	if err := p.stop(t); err != nil {
		t.Fatal(err)
	}
}

// TestMessagePrefixChangedIsRefused: table-less messages belong to no
// table, so nothing but the state row's record says a relay read them. A
// relay started with another messages.prefix (a drifted configuration, or
// "" for none) skipped the messages written with the old one since its last
// session, with one Warn, and confirmed past them (a reviewer showed it).
// The start is refused, naming both prefixes, until the prefix is set back
// or migrate --accept-catalog records the new one.
func TestMessagePrefixChangedIsRefused(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 1)
	first := f.config() // messages.prefix "outbox", the default
	p := runInProcess(t, first)
	f.waitStreaming(t)
	testenv.Eventually(t, time.Minute, 20*time.Millisecond, func() (bool, string) {
		var prefix *string
		err := f.checkDB.QueryRow(context.Background(), "SELECT messages_prefix FROM pgoutbox_state WHERE slot_name = $1", f.slot).Scan(&prefix)
		return err == nil && prefix != nil && *prefix == "outbox", fmt.Sprintf("the session has not recorded its prefix yet (%v)", err)
	})
	if err := p.stop(t); err != nil {
		t.Fatal(err)
	}
	f.emitEvent(t, "00000000-0000-4000-8000-000900000031") // with "outbox", after the session
	other := f.config()
	other.Messages.Prefix = "evt"
	err := runInProcess(t, other).exited(t, time.Minute)
	var fe *relay.FatalError
	if !errors.As(err, &fe) || !strings.Contains(err.Error(), `prefix "outbox", and messages.prefix is now "evt"`) || !strings.Contains(err.Error(), "--accept-catalog") {
		t.Fatalf("start with another prefix: %v; want a fatal error naming both prefixes and migrate --accept-catalog", err)
	}
	// Set back: the message arrives.
	c := env.NewConsumer(t, f.topics[:1])
	p = runInProcess(t, first)
	c.WaitFor(t, 1, time.Minute)
	if err := p.stop(t); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(pgoutboxBinary(t), "migrate", "--accept-catalog")
	cmd.Env = append(f.environ(), "PGOUTBOX_MESSAGES_PREFIX=evt")
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), `accepted: table-less messages with prefix "outbox" are no longer relayed`) ||
		!strings.Contains(string(out), "pgoutbox cleanup is not held") {
		t.Fatalf("migrate --accept-catalog: %v\n%s", err, out)
	}
	// Refused before anything was skipped: no gap, and no hold, which
	// would also stop the cleanup of every other slot on the table.
	if hold := f.cleanupHold(t); hold != "" {
		t.Fatalf("cleanup held after accepting another prefix: %q", hold)
	}
	p = runInProcess(t, other)
	f.waitStreaming(t)
	if err := p.stop(t); err != nil {
		t.Fatal(err)
	}
}
