package outbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// sampleEvents covers a generated id, a given upper-case UUID, a payload
// with characters that JSON encoders like to escape, an array payload and
// no payload.
func sampleEvents() []Event {
	return []Event{
		{AggregateType: "Order", AggregateID: "1", Type: "OrderCreated", Payload: json.RawMessage(`{"total": 12, "note": "<a&b> \"ä\"\n"}`)},
		{ID: "0192B3C4-D5E6-7F80-9A1B-2C3D4E5F6071", AggregateType: "Customer", AggregateID: "c-7", Type: "CustomerRenamed", Payload: json.RawMessage(`[1, 2, {"x": null}]`)},
		{AggregateType: "Order", AggregateID: "1", Type: "OrderDeleted"},
	}
}

func TestWriteRecordsEventsAtomicallyWithTheBusinessChange(t *testing.T) {
	for _, drv := range drivers {
		for _, mode := range []Mode{ModeTable, ModeTableDeleteAfterInsert, ModeMessage} {
			t.Run(drv.name+"/"+mode.String(), func(t *testing.T) {
				testWrite(t, drv, mode)
			})
		}
	}
}

func testWrite(t *testing.T, drv dbDriver, mode Mode) {
	ctx := testContext(t)
	dsn, admin := newDatabase(t)
	createOutboxTable(t, admin, "public.outbox")
	mustExec(t, admin, `CREATE TABLE orders (id int PRIMARY KEY, total int NOT NULL)`)
	createSlot(t, admin, "public.outbox", "outbox_pub", "s")
	w := mustWriter(t, Config{Mode: mode})
	conn := drv.open(t, dsn)

	// A transaction that rolls back leaves neither its change nor its event.
	tx, err := conn.begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.exec(ctx, `INSERT INTO orders VALUES (99, 1)`); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.write(ctx, w, Event{AggregateType: "RolledBack", AggregateID: "99", Payload: json.RawMessage(`{}`)}); err != nil {
		t.Fatalf("write: %v", err)
	}
	if err := tx.rollback(ctx); err != nil {
		t.Fatal(err)
	}

	events := sampleEvents()
	tx, err = conn.begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.exec(ctx, `INSERT INTO orders VALUES (1, 12)`); err != nil {
		t.Fatal(err)
	}
	ids, err := tx.write(ctx, w, events...)
	if err != nil {
		t.Fatalf("write: %v", err)
	}
	if err := tx.commit(ctx); err != nil {
		t.Fatal(err)
	}

	if len(ids) != len(events) {
		t.Fatalf("%d ids for %d events", len(ids), len(events))
	}
	checkV7(t, ids[0])
	checkV7(t, ids[2])
	if ids[1] != strings.ToLower(events[1].ID) {
		t.Fatalf("given id came back as %s", ids[1])
	}
	if n := count(t, admin, "orders"); n != 1 {
		t.Fatalf("%d orders, want the committed one", n)
	}

	switch mode {
	case ModeTable:
		checkRows(t, admin, events, ids)
	default:
		if n := count(t, admin, "public.outbox"); n != 0 {
			t.Fatalf("%s left %d rows in the outbox table", mode, n)
		}
	}

	items := peekWAL(t, admin, "s", "outbox_pub")
	if len(items) != len(events) {
		t.Fatalf("the slot has %d inserts and messages, want %d: %+v", len(items), len(events), items)
	}
	for i, it := range items {
		if mode == ModeMessage {
			checkMessage(t, w, it, events[i], ids[i])
		} else {
			checkInsert(t, it, events[i], ids[i])
		}
	}
}

// checkRows compares the outbox table with the events.
func checkRows(t *testing.T, conn *pgx.Conn, events []Event, ids []string) {
	t.Helper()
	rows, err := conn.Query(testContext(t),
		`SELECT id::text, aggregatetype, aggregateid, type, payload::text, created_at FROM public.outbox`)
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		id, aggType, aggID, typ string
		payload                 *string
		createdAt               time.Time
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var x row
		err := r.Scan(&x.id, &x.aggType, &x.aggID, &x.typ, &x.payload, &x.createdAt)
		return x, err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(events) {
		t.Fatalf("%d rows, want %d", len(got), len(events))
	}
	byID := map[string]row{}
	for _, r := range got {
		byID[r.id] = r
	}
	for i, e := range events {
		r, ok := byID[ids[i]]
		if !ok {
			t.Fatalf("no row with id %s", ids[i])
		}
		if r.aggType != e.AggregateType || r.aggID != e.AggregateID || r.typ != e.Type {
			t.Errorf("row %s = %+v, want %+v", ids[i], r, e)
		}
		checkPayload(t, ids[i], r.payload, e.Payload)
		if time.Since(r.createdAt) > time.Hour || r.createdAt.IsZero() {
			t.Errorf("row %s: created_at %v", ids[i], r.createdAt)
		}
	}
}

func checkPayload(t *testing.T, id string, got *string, want json.RawMessage) {
	t.Helper()
	switch {
	case len(want) == 0:
		if got != nil {
			t.Errorf("event %s: payload %s, want NULL", id, *got)
		}
	case got == nil:
		t.Errorf("event %s: payload NULL, want %s", id, want)
	case !jsonEqual(t, []byte(*got), want):
		t.Errorf("event %s: payload %s, want %s", id, *got, want)
	}
}

// checkInsert compares an INSERT decoded from the slot with an event.
func checkInsert(t *testing.T, it walItem, e Event, id string) {
	t.Helper()
	if it.Kind != 'I' || it.Relation != "public.outbox" {
		t.Fatalf("event %s: slot has %q on %q, want an INSERT on public.outbox", id, it.Kind, it.Relation)
	}
	for col, want := range map[string]string{"id": id, "aggregatetype": e.AggregateType, "aggregateid": e.AggregateID, "type": e.Type} {
		if got := it.Values[col]; got == nil || *got != want {
			t.Errorf("event %s: column %s = %v, want %q", id, col, got, want)
		}
	}
	checkPayload(t, id, it.Values["payload"], e.Payload)
	if it.Values["created_at"] == nil {
		t.Errorf("event %s: created_at is NULL", id)
	}
}

// checkMessage compares a logical decoding message from the slot with an
// event: the prefix, and the JSON fields, which must equal the event's.
func checkMessage(t *testing.T, w *Writer, it walItem, e Event, id string) {
	t.Helper()
	if it.Kind != 'M' || !it.Transactional || it.Prefix != "outbox" {
		t.Fatalf("event %s: slot has %+v, want a transactional message with prefix outbox", id, it)
	}
	if want := w.messageJSON(&e, id); string(it.Content) != string(want) {
		t.Errorf("event %s: content\n %s\nwant\n %s", id, it.Content, want)
	}
	var got messageFields
	if err := json.Unmarshal(it.Content, &got); err != nil {
		t.Fatalf("event %s: content %q: %v", id, it.Content, err)
	}
	if got.ID != id || got.AggregateType != e.AggregateType || got.AggregateID != e.AggregateID || got.Type != e.Type {
		t.Errorf("event %s: content %s, want %+v", id, it.Content, e)
	}
	if len(e.Payload) == 0 {
		if string(got.Payload) != "null" {
			t.Errorf("event %s: payload %s, want null", id, got.Payload)
		}
	} else if !jsonEqual(t, got.Payload, e.Payload) {
		t.Errorf("event %s: payload %s, want %s", id, got.Payload, e.Payload)
	}
}

func TestDeleteAfterInsertSplitsLargeWritesIntoSeveralStatements(t *testing.T) {
	ctx := testContext(t)
	dsn, admin := newDatabase(t)
	createOutboxTable(t, admin, "public.outbox")
	createSlot(t, admin, "public.outbox", "outbox_pub", "s")
	w := mustWriter(t, Config{Mode: ModeTableDeleteAfterInsert})
	const n = 2*maxEventsPerStatement + 7
	events := make([]Event, n)
	for i := range events {
		events[i] = Event{AggregateType: "Order", AggregateID: fmt.Sprint(i), Type: "OrderCreated", Payload: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))}
	}
	conn := connect(t, dsn)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := w.Write(ctx, tx, events...)
	if err != nil {
		t.Fatalf("write: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if c := count(t, admin, "public.outbox"); c != 0 {
		t.Fatalf("%d rows left", c)
	}
	items := peekWAL(t, admin, "s", "outbox_pub")
	if len(items) != n {
		t.Fatalf("%d inserts in the slot, want %d", len(items), n)
	}
	for i, it := range items {
		if got := it.Values["id"]; got == nil || *got != ids[i] {
			t.Fatalf("insert %d has id %v, want %s (events out of order?)", i, got, ids[i])
		}
	}
}

func TestMessageModeSplitsLargeWritesAndKeepsOrder(t *testing.T) {
	ctx := testContext(t)
	dsn, admin := newDatabase(t)
	mustExec(t, admin, `CREATE TABLE unrelated (id int)`)
	createSlot(t, admin, "unrelated", "pub", "s")
	w := mustWriter(t, Config{Mode: ModeMessage, MessagePrefix: "app.events"})
	const n = maxEventsPerStatement + 3
	events := make([]Event, n)
	for i := range events {
		events[i] = Event{AggregateType: "Order", AggregateID: fmt.Sprint(i)}
	}
	conn := connect(t, dsn)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := w.Write(ctx, tx, events...)
	if err != nil {
		t.Fatalf("write: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	items := peekWAL(t, admin, "s", "pub")
	if len(items) != n {
		t.Fatalf("%d messages in the slot, want %d", len(items), n)
	}
	for i, it := range items {
		var got messageFields
		if err := json.Unmarshal(it.Content, &got); err != nil || it.Prefix != "app.events" || got.ID != ids[i] || got.AggregateID != fmt.Sprint(i) {
			t.Fatalf("message %d: prefix %q content %s (%v), want id %s", i, it.Prefix, it.Content, err, ids[i])
		}
	}
}

func TestWriteUsesConfiguredTableAndColumns(t *testing.T) {
	ctx := testContext(t)
	dsn, admin := newDatabase(t)
	mustExec(t, admin, `CREATE SCHEMA app`)
	mustExec(t, admin, `CREATE TABLE app."Events" (
		event_id   uuid PRIMARY KEY,
		agg_type   text NOT NULL,
		agg_id     text NOT NULL,
		event_type text NOT NULL,
		body       json
	)`)
	w := mustWriter(t, Config{
		Table:   "app.Events",
		Columns: Columns{ID: "event_id", AggregateType: "agg_type", AggregateID: "agg_id", Type: "event_type", Payload: "body"},
	})
	conn := connect(t, dsn)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// A json column keeps the payload's bytes as they were sent.
	payload := `{ "b": 1,  "a": [true] }`
	ids, err := w.Write(ctx, tx, Event{AggregateType: "Order", AggregateID: "7", Type: "OrderPaid", Payload: json.RawMessage(payload)})
	if err != nil {
		t.Fatalf("write: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var id, aggType, aggID, typ, body string
	err = admin.QueryRow(ctx, `SELECT event_id::text, agg_type, agg_id, event_type, body::text FROM app."Events"`).Scan(&id, &aggType, &aggID, &typ, &body)
	if err != nil {
		t.Fatal(err)
	}
	if id != ids[0] || aggType != "Order" || aggID != "7" || typ != "OrderPaid" || body != payload {
		t.Fatalf("row = %s %s %s %s %s", id, aggType, aggID, typ, body)
	}
}

func TestWriteReportsDatabaseErrors(t *testing.T) {
	ctx := testContext(t)
	dsn, admin := newDatabase(t)
	createOutboxTable(t, admin, "public.outbox")
	w := mustWriter(t, Config{Table: "public.missing"})
	for _, drv := range drivers {
		conn := drv.open(t, dsn)
		tx, err := conn.begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_, err = tx.write(ctx, w, Event{AggregateType: "Order", AggregateID: "1"})
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42P01" || !strings.Contains(err.Error(), "public.missing") {
			t.Errorf("%s: write to a missing table: %v", drv.name, err)
		}
		_ = tx.rollback(ctx)

		// The same id twice is the database's primary key violation.
		tx, err = conn.begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		e := Event{ID: NewID(), AggregateType: "Order", AggregateID: "1"}
		if _, err := tx.write(ctx, mustWriter(t, Config{}), e); err != nil {
			t.Fatal(err)
		}
		_, err = tx.write(ctx, mustWriter(t, Config{}), e)
		if !errors.As(err, &pgErr) || pgErr.Code != "23505" {
			t.Errorf("%s: the same id twice: %v", drv.name, err)
		}
		_ = tx.rollback(ctx)
	}
	// A trigger that skips a row (and a rule DO INSTEAD NOTHING) keeps it
	// out of the table and of the WAL: the write must fail, with both
	// drivers, rather than report an event that no relay can see.
	mustExec(t, admin, `CREATE FUNCTION public.skip_odd() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN IF NEW.aggregateid = 'skip' THEN RETURN NULL; END IF; RETURN NEW; END $$`)
	mustExec(t, admin, `CREATE TRIGGER skip_odd BEFORE INSERT ON public.outbox FOR EACH ROW EXECUTE FUNCTION public.skip_odd()`)
	for _, drv := range drivers {
		conn := drv.open(t, dsn)
		tx, err := conn.begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_, err = tx.write(ctx, mustWriter(t, Config{}), Event{AggregateType: "Order", AggregateID: "1"}, Event{AggregateType: "Order", AggregateID: "skip"})
		if err == nil || !strings.Contains(err.Error(), "inserted 1 of 2 events into public.outbox") {
			t.Errorf("%s: a write one of whose rows a trigger skipped: %v", drv.name, err)
		}
		_ = tx.rollback(ctx)
	}
	if _, err := w.Write(ctx, nil, Event{AggregateType: "Order", AggregateID: "1"}); !errors.Is(err, ErrNoTx) {
		t.Errorf("nil pgx.Tx: %v", err)
	}
	if _, err := w.WriteSQL(ctx, nil, Event{AggregateType: "Order", AggregateID: "1"}); !errors.Is(err, ErrNoTx) {
		t.Errorf("nil *sql.Tx: %v", err)
	}
}
