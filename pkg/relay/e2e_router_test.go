package relay_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/pkg/relay"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// want is one expected record.
type want struct {
	topic, key, value string
	nilValue          bool
	headers           map[string]string
	partition         int32     // -1: any
	ts                time.Time // zero: any
}

// routerCase runs a relay with the given options over rows inserted by sql
// (with $TOPIC_PREFIX replaced by the test's prefix) and compares the
// records on topics with want, in order per topic.
func routerCase(t *testing.T, env *testenv.Env, alter string, topics []string, partitions int, setup func(*relay.Config, string), sql string, wants []want) {
	t.Helper()
	f := newFixture(t, env, 1)
	prefix := f.slot
	ctx := context.Background()
	if alter != "" {
		if _, err := f.conn.Exec(ctx, alter); err != nil {
			t.Fatal(err)
		}
	}
	var full []string
	for _, tp := range topics {
		name := strings.ReplaceAll(tp, "$P", prefix)
		env.CreateTopic(t, name, partitions)
		full = append(full, name)
	}
	cfg := f.config()
	setup(&cfg, prefix)
	runRelay(t, cfg)
	f.waitStreaming(t)
	if _, err := f.conn.Exec(ctx, strings.ReplaceAll(sql, "$P", prefix)); err != nil {
		t.Fatal(err)
	}
	c := env.NewConsumer(t, full)
	msgs := c.WaitFor(t, len(wants), time.Minute)
	if len(msgs) != len(wants) {
		t.Fatalf("got %d records, want %d", len(msgs), len(wants))
	}
	byTopic := map[string][]int{}
	for i, m := range msgs {
		byTopic[m.Topic] = append(byTopic[m.Topic], i)
	}
	seen := map[string]int{}
	for _, w := range wants {
		topic := strings.ReplaceAll(w.topic, "$P", prefix)
		idx := byTopic[topic]
		if seen[topic] >= len(idx) {
			t.Fatalf("no record on %s for %+v; got %+v", topic, w, msgs)
		}
		m := msgs[idx[seen[topic]]]
		seen[topic]++
		if string(m.Key) != w.key || (w.nilValue != (m.Value == nil)) || (!w.nilValue && string(m.Value) != w.value) {
			t.Errorf("%s: key %q value %q (nil %v); want key %q value %q (nil %v)", topic, m.Key, m.Value, m.Value == nil, w.key, w.value, w.nilValue)
		}
		if !w.ts.IsZero() && !m.Timestamp.Equal(w.ts) {
			t.Errorf("%s: timestamp %s, want %s", topic, m.Timestamp, w.ts)
		}
		if w.partition >= 0 && m.Partition != w.partition {
			t.Errorf("%s: partition %d, want %d", topic, m.Partition, w.partition)
		}
		for k, v := range w.headers {
			got, ok := m.Header(k)
			if !ok || string(got) != v {
				t.Errorf("%s: header %s = %q (present %v), want %q", topic, k, got, ok, v)
			}
		}
	}
}

const id1, id2 = "406c07f3-0000-4000-8000-000000000001", "406c07f3-0000-4000-8000-000000000002"

// TestRouterOptionFamiliesEndToEnd checks each family of router options
// against the real servers: routing, placements, payload handling and
// encodings, timestamps and tracing, and two outbox tables.
func TestRouterOptionFamiliesEndToEnd(t *testing.T) {
	env := testenv.Require(t)

	t.Run("regex routing with and without a match", func(t *testing.T) {
		routerCase(t, env, "", []string{"$P.orders.v2", "$P_Misc"}, 1, func(c *relay.Config, p string) {
			c.Router.RouteTopicRegex = `(?<kind>[a-z_0-9]+)_Order_(?<ver>v[0-9]+)`
			c.Router.RouteTopicReplacement = "${kind}.orders.${ver}"
		}, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES
			('`+id1+`', '$P_Order_v2', 'o-1', 'OrderCreated', '{"total": 12}'),
			('`+id2+`', '$P_Misc', 'm-1', 'Other', '{"x": 1}')`,
			[]want{
				{topic: "$P.orders.v2", key: "o-1", value: `{"total": 12}`, headers: map[string]string{"id": id1}, partition: -1},
				{topic: "$P_Misc", key: "m-1", value: `{"x": 1}`, headers: map[string]string{"id": id2}, partition: -1},
			})
	})

	t.Run("placements: header, envelope, partition", func(t *testing.T) {
		routerCase(t, env, "ALTER TABLE outbox ADD COLUMN part int, ADD COLUMN tenant text",
			[]string{"outbox.event.$P"}, 3, func(c *relay.Config, p string) {
				c.Router.AdditionalPlacement = "type:header:eventType,tenant:envelope:tenant,part:partition"
			}, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, part, tenant) VALUES
			('`+id1+`', '$P', 'k-1', 'OrderCreated', '{"total": 12}', 2, 'acme')`,
			[]want{{topic: "outbox.event.$P", key: "k-1", value: `{"payload":{"total": 12},"tenant":"acme"}`, headers: map[string]string{"id": id1, "eventType": "OrderCreated"}, partition: 2}})
	})

	t.Run("expanded payload, JsonConverter and tombstones", func(t *testing.T) {
		routerCase(t, env, "ALTER TABLE outbox ALTER COLUMN payload TYPE text", []string{"outbox.event.$P"}, 1, func(c *relay.Config, p string) {
			c.Router.ExpandJSONPayload = true
			c.Router.KeyConverter = "org.apache.kafka.connect.json.JsonConverter"
			c.Router.ValueConverter = "org.apache.kafka.connect.json.JsonConverter"
			f := false
			c.Router.KeyConverterSchemasEnable, c.Router.ValueConverterSchemasEnable = &f, &f
			c.Router.RouteTombstoneOnEmptyPayload = true
		}, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES
			('`+id1+`', '$P', 'k-1', 'T', '{"total": 12.50, "note": null}'),
			('`+id2+`', '$P', 'k-1', 'T', NULL)`,
			[]want{
				{topic: "outbox.event.$P", key: `"k-1"`, value: `{"total":12.5}`, headers: map[string]string{"id": id1}, partition: -1},
				{topic: "outbox.event.$P", key: `"k-1"`, nilValue: true, headers: map[string]string{"id": id2}, partition: -1},
			})
	})

	t.Run("timestamp column and trace context", func(t *testing.T) {
		routerCase(t, env, "ALTER TABLE outbox ADD COLUMN occurred timestamptz, ADD COLUMN trace text", []string{"outbox.event.$P"}, 1, func(c *relay.Config, p string) {
			c.Router.EventTimestampField = "occurred"
			c.Router.EventTraceField = "trace"
		}, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, occurred, trace) VALUES
			('`+id1+`', '$P', 'k-1', 'T', '{}', '2024-05-06 07:08:09.123+00', '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01')`,
			[]want{{topic: "outbox.event.$P", key: "k-1", value: `{}`, headers: map[string]string{"id": id1, "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}, partition: -1,
				ts: time.Date(2024, 5, 6, 7, 8, 9, 123e6, time.UTC)}})
	})

	// The stream names a domain column by the domain's type; Debezium
	// writes it as its base type's Connect value (the conformance suite's
	// d_* columns). The expected bytes are Debezium's for the base types,
	// which the suite confirmed: a date as its days since 1970 (19724 for
	// 2024-01-02), a timestamptz(3) in UTC with three digits of fraction. A
	// column given, while the relay streams, a domain created with it goes
	// through a catalog check before its row is routed.
	t.Run("domain columns, one changed while streaming", func(t *testing.T) {
		routerCase(t, env, `CREATE DOMAIN day_d AS date; CREATE DOMAIN day_dd AS day_d;
			CREATE DOMAIN ts3_d AS timestamptz(3) CHECK (VALUE > '2000-01-01');
			ALTER TABLE outbox ADD COLUMN day date, ADD COLUMN d_day day_d, ADD COLUMN dd_day day_dd, ADD COLUMN d_ts ts3_d,
				ADD COLUMN d_late numeric(20,10)`,
			[]string{"outbox.event.$P"}, 1, func(c *relay.Config, p string) {
				c.Router.AdditionalPlacement = "day:header,d_day:header,dd_day:header,d_ts:header,d_late:header"
				c.Router.HeaderConverter = "org.apache.kafka.connect.storage.SimpleHeaderConverter"
			}, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, day, d_day, dd_day, d_ts) VALUES
			('`+id1+`', '$P', 'k-1', 'T', '{}', '2024-01-02', '2024-01-02', '2024-01-02', '2024-01-02 03:04:05.123456+00');
			BEGIN;
			CREATE DOMAIN late_d AS numeric(20,10);
			ALTER TABLE outbox ALTER COLUMN d_late TYPE late_d;
			INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, d_late, d_day) VALUES
			('`+id2+`', '$P', 'k-1', 'T', '{}', 0.0000001, '1969-12-31');
			COMMIT`,
			[]want{
				{topic: "outbox.event.$P", key: "k-1", value: `{}`, partition: -1, headers: map[string]string{
					"id": id1, "day": "19724", "d_day": "19724", "dd_day": "19724", "d_ts": "2024-01-02T03:04:05.123Z"}},
				// numeric(20,10) as Java's BigDecimal.toString, where
				// PostgreSQL writes 0.0000001000.
				{topic: "outbox.event.$P", key: "k-1", value: `{}`, partition: -1, headers: map[string]string{
					"id": id2, "d_day": "-1", "d_late": "1.000E-7"}},
			})
	})

	t.Run("two outbox tables with different mappings", func(t *testing.T) {
		routerCase(t, env, `CREATE TABLE payments_outbox (event_id uuid PRIMARY KEY, kind text, payment text, body jsonb)`,
			[]string{"outbox.event.$P", "$P.payments"}, 1, func(c *relay.Config, p string) {
				c.Postgres.Tables = []string{"public.outbox", "public.payments_outbox"}
				c.Routes = map[string]map[string]string{"public.payments_outbox": {
					"table.field.event.id": "event_id", "table.field.event.key": "payment",
					"table.field.event.payload": "body", "route.by.field": "kind", "route.topic": p + ".payments",
				}}
			}, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ('`+id1+`', '$P', 'o-1', 'T', '{"a": 1}');
			    INSERT INTO payments_outbox VALUES ('`+id2+`', 'Payment', 'p-1', '{"b": 2}')`,
			[]want{
				{topic: "outbox.event.$P", key: "o-1", value: `{"a": 1}`, headers: map[string]string{"id": id1}, partition: -1},
				{topic: "$P.payments", key: "p-1", value: `{"b": 2}`, headers: map[string]string{"id": id2}, partition: -1},
			})
	})
}

// TestConnectorJSONRunsTheRelay runs the binary with the repository's
// realistic Debezium connector JSON (database settings pointed at the test
// server) and checks the records match the connector's router options and
// converters.
func TestConnectorJSONRunsTheRelay(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 1)
	data, err := os.ReadFile("../../cmd/pgoutbox/testdata/connector.json")
	if err != nil {
		t.Fatal(err)
	}
	// Point the connector at the test database and give it this test's
	// slot, publication and topic names.
	var host, port, db string
	fmt.Sscanf(strings.NewReplacer("postgres://postgres@", "", ":", " ", "/", " ", "?", " ").Replace(f.dsn), "%s %s %s", &host, &port, &db)
	body := strings.NewReplacer(
		`"orders-db.internal"`, fmt.Sprintf("%q", host),
		`"database.port": "5432"`, fmt.Sprintf(`"database.port": %q`, port),
		`"database.dbname": "orders"`, fmt.Sprintf(`"database.dbname": %q`, db),
		`"database.user": "debezium"`, `"database.user": "postgres"`,
		`"orders_outbox"`, fmt.Sprintf("%q", f.slot),
		`"orders_outbox_pub"`, fmt.Sprintf("%q", f.pub),
		`orders.${routedByValue}.events`, f.slot+`.${routedByValue}.events`,
	).Replace(string(data))
	path := filepath.Join(t.TempDir(), "connector.json")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	topic := f.slot + ".Order.events"
	env.CreateTopic(t, topic, 1)
	bin := pgoutboxBinary(t)
	logPath := filepath.Join(t.TempDir(), "pgoutbox.log")
	lf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	p := startProcess(t, bin, []string{"run", "--connector", path, "--brokers", strings.Join(env.KafkaBrokers, ",")},
		[]string{"PGOUTBOX_LOG_FORMAT=json", "PATH=" + os.Getenv("PATH")}, lf, logPath)
	f.waitStreaming(t)
	ctx := context.Background()
	if _, err := f.conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ('`+id1+`', 'Order', '42', 'OrderCreated', '{"total": 12}')`); err != nil {
		t.Fatal(err)
	}
	c := env.NewConsumer(t, []string{topic})
	msgs := c.WaitFor(t, 1, time.Minute)
	m := msgs[0]
	// StringConverter key, JsonConverter value with the payload expanded,
	// the type as an eventType header.
	et, _ := m.Header("eventType")
	id, _ := m.Header("id")
	if string(m.Key) != "42" || string(m.Value) != `{"total":12}` || string(et) != "OrderCreated" || string(id) != id1 {
		t.Fatalf("record key %q value %q eventType %q id %q", m.Key, m.Value, et, id)
	}
	logText, _ := os.ReadFile(logPath)
	if !strings.Contains(string(logText), "connector settings ignored") || !strings.Contains(string(logText), "tombstones.on.delete") {
		t.Errorf("the ignored connector keys were not listed in a warning:\n%s", logText)
	}
	p.terminate(t, time.Minute)
}
