package relay_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pgoutbox/pgoutbox/pkg/outboxtest"
	"github.com/pgoutbox/pgoutbox/pkg/relay"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
	"github.com/pgoutbox/pgoutbox/replication"
	"github.com/pgoutbox/pgoutbox/router"
)

func emit(t *testing.T, f *fixture, transactional, commit bool, events ...outboxtest.Event) {
	t.Helper()
	ctx := context.Background()
	tx, err := f.conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if _, err := tx.Exec(ctx, "INSERT INTO outbox_other (note) VALUES ('business change')"); err != nil {
		t.Fatal(err)
	}
	for _, e := range events {
		body := fmt.Sprintf(`{"id": %q, "aggregatetype": %q, "aggregateid": %q, "type": %q, "payload": %s}`, e.ID, e.AggregateType, e.AggregateID, e.Type, e.Payload)
		if _, err := tx.Exec(ctx, "SELECT pg_logical_emit_message($1, 'outbox', $2)", transactional, body); err != nil {
			t.Fatal(err)
		}
	}
	if commit {
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

func messageEvents(f *fixture, n int, seq0 int) []outboxtest.Event {
	evs := make([]outboxtest.Event, n)
	for i := range evs {
		evs[i] = outboxtest.Event{ID: outboxtest.NewID(), AggregateType: f.shape.AggregateTypes[i%len(f.shape.AggregateTypes)],
			AggregateID: fmt.Sprintf("agg-%d", i%4), Type: "Created", Payload: fmt.Sprintf(`{"seq": %d}`, seq0+i), Seq: seq0 + i}
	}
	return evs
}

// TestTablelessOutboxMessagesAreRoutedLikeRows writes events with
// pg_logical_emit_message(true, 'outbox', ...) in committed and rolled-back
// transactions: the committed ones arrive exactly like outbox rows would,
// the rolled-back ones never.
func TestTablelessOutboxMessagesAreRoutedLikeRows(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 2)
	runRelay(t, f.config())
	f.waitStreaming(t)
	committed := messageEvents(f, 6, 0)
	emit(t, f, true, true, committed[:3]...)
	rolledBack := messageEvents(f, 2, 100)
	emit(t, f, true, false, rolledBack...)
	emit(t, f, true, true, committed[3:]...)
	c := env.NewConsumer(t, f.topics)
	w := &outboxtest.Writer{Committed: committed, RolledBack: map[string]outboxtest.Event{}}
	for _, e := range rolledBack {
		w.RolledBack[e.ID] = e
	}
	waitAll(t, c, w, time.Minute)
	rep := outboxtest.Check(w.Committed, w.RolledBack, delivered(drain(t, c, f)), nil)
	if !rep.OK() || rep.Duplicates != 0 || rep.Verified != len(committed) {
		t.Fatalf("table-less outbox: %s", rep)
	}
}

// TestNonTransactionalMessageIsRefusedByDefault: a message written with
// transactional = false is not tied to a transaction's outcome; by default
// the relay stops with an error that names the option, and with
// messages.nontransactional=accept it routes it.
func TestNonTransactionalMessageIsRefusedByDefault(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 1)
	stop := runRelay(t, f.config())
	f.waitStreaming(t)
	emit(t, f, false, true, messageEvents(f, 1, 0)...)
	var err error
	testenv.Eventually(t, 30*time.Second, 20*time.Millisecond, func() (bool, string) {
		_, active := f.slotState(t)
		return !active, "relay still streaming"
	})
	err = stop()
	var fe *relay.FatalError
	if !errors.As(err, &fe) || !strings.Contains(err.Error(), "messages.nontransactional=accept") {
		t.Fatalf("want a fatal error naming messages.nontransactional, got %v", err)
	}

	cfg := f.config()
	cfg.Messages.NonTransactional = "accept"
	runRelay(t, cfg)
	c := env.NewConsumer(t, f.topics)
	ev := messageEvents(f, 1, 0)
	emit(t, f, false, false, ev...) // even though the transaction rolls back
	w := &outboxtest.Writer{Committed: ev, RolledBack: map[string]outboxtest.Event{}}
	waitAll(t, c, w, time.Minute)
}

// TestMessagePayloadIsRoutedLikeTheTablesJSONB: a table-less outbox's
// payload field must come out as the same event's payload written into the
// outbox table's jsonb column does (PostgreSQL's own text of the jsonb is
// the oracle), with route.tombstone.on.empty.payload on: a JSON string ""
// is two bytes there, not an empty payload, and "x" keeps its quotes.
// (Before, a string payload was taken for text: "" became a tombstone,
// deleting the key in a compacted topic, and "x" lost its quotes.)
func TestMessagePayloadIsRoutedLikeTheTablesJSONB(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 1)
	cfg := f.config()
	cfg.Router.RouteTombstoneOnEmptyPayload = true
	runRelay(t, cfg)
	f.waitStreaming(t)
	c := env.NewConsumer(t, f.topics)
	// (Not numbers or objects jsonb would re-render: -0, 1e2, spaces, key
	// order. A message payload goes as written; README.)
	payloads := []string{`""`, `"  "`, `"x"`, `"a\"b"`, `12.50`, `true`, `[]`}
	type pair struct{ row, msg string }
	ids := make([]pair, len(payloads))
	for i, p := range payloads {
		ids[i] = pair{outboxtest.NewID(), outboxtest.NewID()}
		f.exec(t, "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, 'k', 'T', $3::jsonb)", ids[i].row, f.shape.AggregateTypes[0], p)
		emit(t, f, true, true, outboxtest.Event{ID: ids[i].msg, AggregateType: f.shape.AggregateTypes[0], AggregateID: "k", Type: "T", Payload: p})
	}
	msgs := c.WaitFor(t, 2*len(payloads), time.Minute)
	values := map[string][]byte{}
	tombstone := map[string]bool{}
	for _, m := range msgs {
		if id, ok := m.Header("id"); ok {
			values[string(id)], tombstone[string(id)] = m.Value, m.Value == nil
		}
	}
	for i, p := range payloads {
		row, msg := ids[i].row, ids[i].msg
		if tombstone[row] != tombstone[msg] || string(values[row]) != string(values[msg]) {
			t.Errorf("payload %s: the table's row gave %q (tombstone %v), the message %q (tombstone %v)", p, values[row], tombstone[row], values[msg], tombstone[msg])
		}
	}
}

// TestMessagesOfAPrefixNoRelayClaimsAreAnError: every slot decodes every
// logical decoding message of its database. A message that looks like an
// event, with a prefix that another slot's state row records, is that
// relay's (Info); one whose prefix no relay records is most likely an
// event no one relays, skipped with the slot confirmed past it: an Error,
// counted. Before, both were one Warn per prefix, and nothing once a
// hundred other prefixes had been named. Real PostgreSQL and Kafka; the
// other relay is a slot and a state row made by the test.
func TestMessagesOfAPrefixNoRelayClaimsAreAnError(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 2)
	ctx := context.Background()
	other := f.slot + "_b"
	if err := replication.EnsureStateTable(ctx, f.checkDB, replication.DefaultStateTable); err != nil {
		t.Fatal(err)
	}
	anotherRelay(t, f, other, "orders")
	core, logs := observer.New(zapcore.InfoLevel)
	obs := &skipCounts{n: map[string]int{}}
	runRelayLog(t, f.config(), zap.New(core), relay.WithObserver(obs))
	f.waitStreaming(t)
	event := `{"id":"3f1c5b8e-0000-4000-8000-000000000001","aggregatetype":"Order","aggregateid":"o1","type":"Created","payload":{"x":1}}`
	for _, prefix := range []string{"orders", "orders2"} {
		if _, err := f.conn.Exec(ctx, "SELECT pg_logical_emit_message(true, $1, $2)", prefix, event); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, time.Minute, 20*time.Millisecond, func() (bool, string) {
		return obs.get(relay.SkippedUnclaimedEvent) == 1 && obs.get(relay.SkippedAnotherRelays) == 1, fmt.Sprintf("skipped %v", obs.snapshot())
	})
	if errs := logs.FilterLevelExact(zapcore.ErrorLevel).FilterField(zap.String("prefix", "orders2")); errs.Len() != 1 {
		t.Fatalf("%d errors for orders2; want 1: %v", errs.Len(), logs.All())
	}
	if n := logs.FilterMessageSnippet("another slot relays").FilterField(zap.String("relayed_by_slots", other)).Len(); n != 1 {
		t.Fatalf("%d lines naming %s's prefix; want 1", n, other)
	}
}

// TestMessagesOfARelayAddedWhileStreamingAreThatRelays: a relay added to
// the database while this one streams (its state row records its prefix
// after this session read the others' at its start) had every event
// message of its prefix taken here for a misspelt prefix's: an Error and
// an unclaimed_event count each, feeding PgoutboxEventMessagesUnclaimed
// until this relay's next session. The catalog checks now read the
// prefixes again when such a message comes, before it is judged.
func TestMessagesOfARelayAddedWhileStreamingAreThatRelays(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 2)
	ctx := context.Background()
	other := f.slot + "_c"
	core, logs := observer.New(zapcore.InfoLevel)
	obs := &skipCounts{n: map[string]int{}}
	runRelayLog(t, f.config(), zap.New(core), relay.WithObserver(obs))
	f.waitStreaming(t)
	// The other relay's first start: its slot and its state row.
	anotherRelay(t, f, other, "payments")
	event := `{"id":"3f1c5b8e-0000-4000-8000-000000000002","aggregatetype":"Payment","aggregateid":"p1","type":"Taken","payload":{"x":1}}`
	for range 3 {
		if _, err := f.conn.Exec(ctx, "SELECT pg_logical_emit_message(true, 'payments', $1)", event); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, time.Minute, 20*time.Millisecond, func() (bool, string) {
		return obs.get(relay.SkippedAnotherRelays)+obs.get(relay.SkippedUnclaimedEvent) == 3, fmt.Sprintf("skipped %v", obs.snapshot())
	})
	if obs.get(relay.SkippedUnclaimedEvent) != 0 || logs.FilterLevelExact(zapcore.ErrorLevel).Len() != 0 {
		t.Fatalf("skipped %v, errors %v; want the three messages as %s's, no Error", obs.snapshot(), logs.FilterLevelExact(zapcore.ErrorLevel).All(), other)
	}
	if n := logs.FilterMessageSnippet("another slot relays").FilterField(zap.String("relayed_by_slots", other)).Len(); n != 1 {
		t.Fatalf("%d lines naming %s's prefix; want 1", n, other)
	}
}

// anotherRelay makes what another relay's first start leaves: a slot,
// and its row in the state table (which must exist) recording prefix.
func anotherRelay(t *testing.T, f *fixture, slot, prefix string) {
	t.Helper()
	ctx := context.Background()
	if _, err := f.checkDB.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", slot); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = f.checkDB.Exec(context.Background(), "SELECT pg_drop_replication_slot($1)", slot) })
	if _, err := f.checkDB.Exec(ctx, `INSERT INTO pgoutbox_state (slot_name, system_identifier, database, timeline, confirmed_lsn, confirmed_at, instance, session_started_at, messages_prefix)
		SELECT $1, system_identifier::text, current_database(), 1, '0/0', now(), 'other', now(), $2 FROM pg_control_system()`, slot, prefix); err != nil {
		t.Fatal(err)
	}
}

// skipCounts counts SkippedMessage by reason, for the relay's goroutine and
// the test's.
type skipCounts struct {
	relay.NopObserver
	mu sync.Mutex
	n  map[string]int
}

func (c *skipCounts) SkippedMessage(reason string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n[reason]++
}

func (c *skipCounts) get(reason string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[reason]
}

func (c *skipCounts) snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.n)
}

// TestMessagesReadAsDebeziumsDecoderReadsThem: with messages.format=debezium
// (a connector JSON with Debezium's DecodeLogicalDecodingMessageContent
// before its EventRouter) a message's payload object is written as an
// object, in its members' order and without its null members (Debezium's
// Kafka Connect struct through JsonConverter), numbers as Java writes
// them, a string payload as a JSON string, and the record has its id
// header alone, no extended headers, as the real Debezium 3.6.1 writes
// (the conformance suite holds every case against it). Real PostgreSQL
// and Kafka.
func TestMessagesReadAsDebeziumsDecoderReadsThem(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 1)
	cfg := f.config()
	no := false
	cfg.Messages.Format = relay.MessagesDebezium
	cfg.Router.KeyConverter, cfg.Router.ValueConverter, cfg.Router.ValueConverterSchemasEnable = router.ConverterString, router.ConverterJSON, &no
	cfg.Router.ExtendedHeaders, cfg.Router.ExtendedHeadersLogicalName = true, "orders"
	runRelay(t, cfg)
	f.waitStreaming(t)
	c := env.NewConsumer(t, f.topics)
	cases := map[string]string{ // payload written → value
		`{"b": 2, "a": 1.50, "n": null, "l": [], "e": 1e2}`: `{"b":2,"a":1.5,"e":100.0}`,
		`"{\"x\": 1}"`: `"{\"x\": 1}"`,
		`[1, 2]`:       `[1,2]`,
	}
	ids := map[string]string{}
	for p := range cases {
		ev := outboxtest.Event{ID: outboxtest.NewID(), AggregateType: f.shape.AggregateTypes[0], AggregateID: "k", Type: "T", Payload: p}
		ids[ev.ID] = p
		emit(t, f, true, true, ev)
	}
	for _, m := range c.WaitFor(t, len(cases), time.Minute) {
		id, _ := m.Header("id")
		p, ok := ids[string(id)]
		if !ok {
			t.Fatalf("a record of no message written: id %q", id)
		}
		if string(m.Value) != cases[p] || string(m.Key) != "k" || len(m.Headers) != 1 {
			t.Errorf("payload %s: key %q value %s headers %v; want key k, value %s, the id header alone", p, m.Key, m.Value, m.Headers, cases[p])
		}
	}
}

// TestDebeziumMessageRecordsAreWrittenAndConfirmed: started from a
// connector configuration, the relay writes Debezium's record of a
// message of another prefix to <topic.prefix>.message (a transactional
// one, and a non-transactional one written in a transaction rolled back,
// which PostgreSQL decodes all the same), and the slot is confirmed past
// them only once Kafka has them. Before the topic exists it says so at
// Warn at the start. Real PostgreSQL and Kafka; the bytes are held against
// the real Debezium by the conformance suite.
func TestDebeziumMessageRecordsAreWrittenAndConfirmed(t *testing.T) {
	env := testenv.Require(t)
	f := newFixture(t, env, 1)
	topic := testenv.UniqueName(t, "dbz") + ".message"
	cfg := f.config()
	no := false
	cfg.Router.KeyConverter, cfg.Router.ValueConverter, cfg.Router.ValueConverterSchemasEnable = router.ConverterString, router.ConverterJSON, &no
	cfg.Messages.Debezium = &relay.DebeziumMessages{Topic: topic, Name: strings.TrimSuffix(topic, ".message"), DB: "app", Certain: true}

	core, logs := observer.New(zap.WarnLevel)
	stop := runRelayLog(t, cfg, zap.New(core))
	testenv.Eventually(t, 30*time.Second, 20*time.Millisecond, func() (bool, string) {
		return logs.FilterField(zap.String("topic", topic)).FilterMessageSnippet("does not exist").Len() == 1, "no warning that the topic is missing"
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	env.CreateTopic(t, topic, 1)
	runRelay(t, cfg)
	f.waitStreaming(t)
	c := env.NewConsumer(t, []string{topic})
	ctx := context.Background()
	tx, err := f.conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT pg_logical_emit_message(true, 'audit', 'kept')"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	tx, err = f.conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var lsn string
	if err := tx.QueryRow(ctx, "SELECT pg_logical_emit_message(false, 'audit', 'not tied')::text").Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	_ = tx.Rollback(ctx)
	msgs := c.WaitFor(t, 2, time.Minute)
	for i, content := range []string{"kept", "not tied"} {
		m := msgs[i]
		b64 := base64.StdEncoding.EncodeToString([]byte(content))
		if string(m.Key) != "Struct{prefix=audit}" || !strings.HasPrefix(string(m.Value), `{"op":"m","ts_ms":`) ||
			!strings.HasSuffix(string(m.Value), `"message":{"prefix":"audit","content":"`+b64+`"}}`) || len(m.Headers) != 0 {
			t.Errorf("record %d: key %q value %s headers %v", i, m.Key, m.Value, m.Headers)
		}
	}
	if !strings.Contains(string(msgs[1].Value), `"txId":null`) {
		t.Errorf("the non-transactional message's record: %s", msgs[1].Value)
	}
	want, err := parseLSN(lsn)
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, 20*time.Millisecond, func() (bool, string) {
		confirmed, _ := f.slotState(t)
		return confirmed >= want, "the slot is not confirmed past the messages"
	})
}
