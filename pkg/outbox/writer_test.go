package outbox

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

func mustWriter(t testing.TB, cfg Config) *Writer {
	t.Helper()
	w, err := NewWriter(cfg)
	if err != nil {
		t.Fatalf("NewWriter: %v", err)
	}
	return w
}

func TestZeroConfigIsDebeziumsTable(t *testing.T) {
	got := mustWriter(t, Config{}).Config()
	want := Config{
		Table:         "public.outbox",
		Columns:       Columns{ID: "id", AggregateType: "aggregatetype", AggregateID: "aggregateid", Type: "type", Payload: "payload"},
		Mode:          ModeTable,
		MessagePrefix: "outbox",
	}
	if got != want {
		t.Fatalf("config = %+v, want %+v", got, want)
	}
}

func TestConfigValidateRejects(t *testing.T) {
	for name, cfg := range map[string]Config{
		"quote in table":       {Table: `public."outbox`},
		"three-part table":     {Table: "a.b.c"},
		"empty schema":         {Table: ".outbox"},
		"semicolon in table":   {Table: "outbox;drop"},
		"long table":           {Table: strings.Repeat("t", 64)},
		"space in column":      {Columns: Columns{Payload: "pay load"}},
		"column named twice":   {Columns: Columns{Type: "id"}},
		"unknown mode":         {Mode: Mode(7)},
		"negative mode":        {Mode: Mode(-1)},
		"NUL in prefix":        {MessagePrefix: "out\x00box"},
		"digit-led identifier": {Table: "public.1outbox"},
	} {
		if err := cfg.Validate(); err == nil {
			t.Errorf("%s: Validate accepted %+v", name, cfg)
		}
		if _, err := NewWriter(cfg); err == nil {
			t.Errorf("%s: NewWriter accepted %+v", name, cfg)
		}
	}
}

func TestModeText(t *testing.T) {
	for _, m := range []Mode{ModeTable, ModeTableDeleteAfterInsert, ModeMessage} {
		b, err := m.MarshalText()
		if err != nil {
			t.Fatal(err)
		}
		var back Mode
		if err := back.UnmarshalText(b); err != nil || back != m {
			t.Fatalf("%s: round trip gave %v, %v", b, back, err)
		}
		if m.String() != string(b) {
			t.Fatalf("String %q != MarshalText %q", m.String(), b)
		}
	}
	var m Mode
	if err := m.UnmarshalText([]byte("rows")); err == nil {
		t.Fatal("UnmarshalText accepted an unknown mode")
	}
	if _, err := Mode(9).MarshalText(); err == nil {
		t.Fatal("MarshalText accepted an unknown mode")
	}
}

func TestStatementsBatchEventsInOneStatement(t *testing.T) {
	w := mustWriter(t, Config{Table: "app.Events", Columns: Columns{ID: "event_id", Payload: "body"}, MessagePrefix: "app"})
	events := []Event{
		{AggregateType: "Order", AggregateID: "1", Type: "Created", Payload: json.RawMessage(`{"a": 1}`)},
		{AggregateType: "Order", AggregateID: "2"},
	}
	ids := []string{"id-1", "id-2"}

	q, args := w.insertStatement(events, ids)
	wantQ := `INSERT INTO "app"."Events" ("event_id", "aggregatetype", "aggregateid", "type", "body") VALUES ($1, $2, $3, $4, $5), ($6, $7, $8, $9, $10)`
	wantArgs := []any{"id-1", "Order", "1", "Created", `{"a": 1}`, "id-2", "Order", "2", "", nil}
	if q != wantQ || !reflect.DeepEqual(args, wantArgs) {
		t.Fatalf("insert:\n got %s %#v\nwant %s %#v", q, args, wantQ, wantArgs)
	}

	q, args = w.deleteStatement(ids)
	wantQ = `WITH deleted AS (DELETE FROM "app"."Events" WHERE "event_id" IN ($1, $2) RETURNING 1) SELECT WHERE NOT EXISTS (SELECT FROM deleted) OR ` + logicalSlotExists + ` AND ` + tableRelayable(3)
	if q != wantQ || !reflect.DeepEqual(args, []any{"id-1", "id-2", `"app"."Events"`}) {
		t.Fatalf("delete: got %s %#v", q, args)
	}

	// Config.AssumeSlot leaves the check out.
	assumed := *w
	assumed.cfg.AssumeSlot = true
	if q, _ := assumed.deleteStatement(ids); strings.Contains(q, "pg_replication_slots") || !strings.HasSuffix(q, " OR true") {
		t.Fatalf("delete with AssumeSlot: %s", q)
	}
	if q, _ := assumed.messageStatement(events, ids); strings.Contains(q, "pg_replication_slots") || !strings.HasSuffix(q, " WHERE true") {
		t.Fatalf("message with AssumeSlot: %s", q)
	}

	q, args = w.messageStatement(events, ids)
	wantQ = `SELECT pg_catalog.pg_logical_emit_message(true, $1::text, m.content) FROM (VALUES ($2::bytea), ($3::bytea)) AS m(content) WHERE ` + logicalSlotExists
	wantArgs = []any{
		"app",
		[]byte(`{"event_id":"id-1","aggregatetype":"Order","aggregateid":"1","type":"Created","body":{"a":1}}`),
		[]byte(`{"event_id":"id-2","aggregatetype":"Order","aggregateid":"2","type":"","body":null}`),
	}
	if q != wantQ || !reflect.DeepEqual(args, wantArgs) {
		t.Fatalf("message:\n got %s %#v\nwant %s %#v", q, args, wantQ, wantArgs)
	}
}

// TestMessageJSONShape pins the content of a ModeMessage event with the
// default columns: the relay routes it by these keys.
func TestMessageJSONShape(t *testing.T) {
	w := mustWriter(t, Config{Mode: ModeMessage})
	e := Event{
		AggregateType: "Order",
		AggregateID:   "42",
		Type:          "OrderCreated",
		Payload:       json.RawMessage("{\n  \"total\": 12,\n  \"note\": \"<a&b>\"\n}"),
	}
	got := string(w.messageJSON(&e, "01920c4e-7a3b-7c1d-9e2f-3a4b5c6d7e8f"))
	want := `{"id":"01920c4e-7a3b-7c1d-9e2f-3a4b5c6d7e8f","aggregatetype":"Order","aggregateid":"42","type":"OrderCreated","payload":{"total":12,"note":"<a&b>"}}`
	if got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
}

// messageFields is the decoded content of a message with default columns.
type messageFields struct {
	ID            string          `json:"id"`
	AggregateType string          `json:"aggregatetype"`
	AggregateID   string          `json:"aggregateid"`
	Type          string          `json:"type"`
	Payload       json.RawMessage `json:"payload"`
}

func FuzzMessageJSONRoundTrip(f *testing.F) {
	f.Add("id", "Order", "42", "OrderCreated", `{"total":12}`)
	f.Add("ä\"\\\n\t\x01\u2028", "<>&", "\x7f", "", `[1, "x", null]`)
	f.Add("x", "y", "z", "t", ``)
	w := mustWriter(f, Config{Mode: ModeMessage})
	f.Fuzz(func(t *testing.T, id, aggType, aggID, typ, payload string) {
		e := Event{ID: id, AggregateType: aggType, AggregateID: aggID, Type: typ, Payload: json.RawMessage(payload)}
		if e.validate() != nil || id == "" {
			return
		}
		content := w.messageJSON(&e, id)
		var got messageFields
		if err := json.Unmarshal(content, &got); err != nil {
			t.Fatalf("content %q is not JSON: %v", content, err)
		}
		if got.ID != id || got.AggregateType != aggType || got.AggregateID != aggID || got.Type != typ {
			t.Fatalf("content %q decodes to %+v", content, got)
		}
		if payload == "" {
			if string(got.Payload) != "null" {
				t.Fatalf("empty payload became %s", got.Payload)
			}
			return
		}
		if !jsonEqual(t, got.Payload, []byte(payload)) {
			t.Fatalf("payload %q became %q", payload, got.Payload)
		}
	})
}

// jsonEqual reports whether a and b are the same JSON value.
func jsonEqual(t testing.TB, a, b []byte) bool {
	t.Helper()
	var va, vb any
	if err := json.Unmarshal(a, &va); err != nil {
		t.Fatalf("%q: %v", a, err)
	}
	if err := json.Unmarshal(b, &vb); err != nil {
		t.Fatalf("%q: %v", b, err)
	}
	return reflect.DeepEqual(va, vb)
}

func TestPrepareRejectsInvalidEvents(t *testing.T) {
	ok := Event{AggregateType: "Order", AggregateID: "1"}
	for name, e := range map[string]Event{
		"no aggregate type": {AggregateID: "1"},
		"no aggregate id":   {AggregateType: "Order"},
		"bad payload":       {AggregateType: "Order", AggregateID: "1", Payload: json.RawMessage(`{"a":`)},
		"NUL in type":       {AggregateType: "Order", AggregateID: "1", Type: "a\x00"},
		"bad UTF-8 id":      {ID: "\xff", AggregateType: "Order", AggregateID: "1"},
		// JSON that is not UTF-8 (LATIN1 bytes): the text of a table's
		// column refuses it, a message's bytea would not.
		"bad UTF-8 payload": {AggregateType: "Order", AggregateID: "1", Payload: json.RawMessage("{\"name\":\"M\xfcller\"}")},
	} {
		_, err := prepare([]Event{ok, e})
		var ee *EventError
		if !errors.As(err, &ee) || ee.Index != 1 || !errors.Is(err, ErrInvalidEvent) {
			t.Errorf("%s: got %v, want an EventError for event 1", name, err)
		}
	}
	dup := Event{ID: "0192B3C4-D5E6-7F80-9A1B-2C3D4E5F6071", AggregateType: "Order", AggregateID: "1"}
	dup2 := dup
	dup2.ID = strings.ToLower(dup.ID)
	if _, err := prepare([]Event{dup, dup2}); !errors.Is(err, ErrInvalidEvent) {
		t.Errorf("the same UUID in two cases: got %v, want an EventError", err)
	}
}

func TestPrepareGeneratesAndCanonicalizesIDs(t *testing.T) {
	ids, err := prepare([]Event{
		{AggregateType: "Order", AggregateID: "1"},
		{ID: "0192B3C4-D5E6-7F80-9A1B-2C3D4E5F6071", AggregateType: "Order", AggregateID: "1"},
		{ID: "order-1-created", AggregateType: "Order", AggregateID: "1"},
		{AggregateType: "Order", AggregateID: "1"},
	})
	if err != nil {
		t.Fatal(err)
	}
	checkV7(t, ids[0])
	checkV7(t, ids[3])
	if ids[0] >= ids[3] {
		t.Errorf("generated ids out of order: %s, %s", ids[0], ids[3])
	}
	if ids[1] != "0192b3c4-d5e6-7f80-9a1b-2c3d4e5f6071" || ids[2] != "order-1-created" {
		t.Errorf("given ids became %s, %s", ids[1], ids[2])
	}
}

func TestNewEvent(t *testing.T) {
	e, err := NewEvent("Order", "42", "OrderCreated", struct {
		Total int    `json:"total"`
		Note  string `json:"note"`
	}{12, "x"})
	if err != nil {
		t.Fatal(err)
	}
	if string(e.Payload) != `{"total":12,"note":"x"}` || e.ID != "" || e.AggregateType != "Order" || e.AggregateID != "42" || e.Type != "OrderCreated" {
		t.Fatalf("NewEvent = %+v (payload %s)", e, e.Payload)
	}
	if e, err := NewEvent("Order", "42", "OrderDeleted", nil); err != nil || e.Payload != nil {
		t.Fatalf("nil payload: %+v, %v", e, err)
	}
	if e, err := NewEvent("Order", "42", "X", json.RawMessage(`{ "a" : 1 }`)); err != nil || string(e.Payload) != `{"a":1}` {
		t.Fatalf("RawMessage payload: %s, %v", e.Payload, err)
	}
	if _, err := NewEvent("Order", "42", "X", make(chan int)); err == nil {
		t.Fatal("NewEvent marshalled a channel")
	}
}

func TestNewDedupValidates(t *testing.T) {
	d, err := NewDedup(DedupConfig{})
	if err != nil || d.Config().Table != "public.processed_events" {
		t.Fatalf("zero config: %v, %+v", err, d)
	}
	if _, err := NewDedup(DedupConfig{Table: "x;y"}); err == nil {
		t.Fatal("accepted an invalid table")
	}
	if _, err := NewDedup(DedupConfig{Consumer: "a\x00"}); err == nil {
		t.Fatal("accepted a NUL in the consumer")
	}
}
