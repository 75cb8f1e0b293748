package relay

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/replication"
	"github.com/pgoutbox/pgoutbox/router"
)

func TestMessageIsRoutedLikeAnOutboxRow(t *testing.T) {
	row, err := messageRow("outbox", "payload", []byte(`{"id":"406c07f3-0000-4000-8000-000000000001","aggregatetype":"Order","aggregateid":"1","type":"OrderCreated","payload":{"total":12}}`))
	if err != nil {
		t.Fatal(err)
	}
	r, err := router.New(router.DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	var rec router.Record
	act, err := r.Route(&row, time.Now(), &rec)
	if err != nil || act != router.Emit {
		t.Fatalf("route: %v %v", act, err)
	}
	if rec.Topic != "outbox.event.Order" || string(rec.Key) != "1" || string(rec.Value) != `{"total":12}` ||
		rec.Headers[0].Key != "id" || string(rec.Headers[0].Value) != "406c07f3-0000-4000-8000-000000000001" {
		t.Fatalf("record: topic %q key %q value %q headers %v", rec.Topic, rec.Key, rec.Value, rec.Headers)
	}
}

func TestMessageFieldTypes(t *testing.T) {
	row, err := messageRow("p", "payload", []byte(` {"s":"a\"b","n":12.5,"b":true,"z":null,"arr":[1,2]} `))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]struct {
		oid uint32
		val string
		nul bool
	}{"s": {oidText, `a"b`, false}, "n": {oidNumeric, "12.5", false}, "b": {oidBool, "true", false}, "z": {oidText, "", true}, "arr": {oidJSONB, "[1,2]", false}}
	if row.Table != "message:p" || len(row.Names) != len(want) {
		t.Fatalf("row %+v", row)
	}
	for i, n := range row.Names {
		w := want[n]
		if row.Types[i] != w.oid || (row.Values[i] == nil) != w.nul || string(row.Values[i]) != w.val {
			t.Errorf("%s: oid %d value %q", n, row.Types[i], row.Values[i])
		}
	}
}

func TestMessageThatIsNotAJSONObjectIsAnError(t *testing.T) {
	for _, c := range []string{``, `[1]`, `"x"`, `{"a":`, `not json`} {
		if _, err := messageRow("p", "payload", []byte(c)); err == nil {
			t.Errorf("%q: no error", c)
		}
	}
}

// A message whose content is not UTF-8 (the text variant of
// pg_logical_emit_message in a LATIN1 database) is refused, not read with
// U+FFFD in place of each bad byte: the key Müller went out as M\ufffdller,
// on another partition, and the payload as LATIN1 bytes.
func TestMessageThatIsNotUTF8IsAnError(t *testing.T) {
	content := []byte("{\"id\":\"406c07f3-0000-4000-8000-000000000001\",\"aggregatetype\":\"Order\",\"aggregateid\":\"M\xfcller\",\"type\":\"T\",\"payload\":{\"n\":\"\xc4\"}}")
	row, err := messageRow("outbox", "payload", content)
	if err == nil {
		t.Fatalf("LATIN1 content read as %q", row.Values)
	}
	if want := fmt.Sprintf("byte %d is 0xfc", bytes.IndexByte(content, 0xfc)); !strings.Contains(err.Error(), "not valid UTF-8") || !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q does not say the content is not UTF-8 (%s)", err, want)
	}
}

// TestMessageEscapesNoTextHoldsAreAnError: encoding/json read a lone
// surrogate escape as U+FFFD and \u0000 as a NUL, without a word: keys
// written K\ud800 and K\udfff both went out as K\ufffd (a black-box
// review), one key for two aggregates. PostgreSQL's jsonb refuses both
// escapes, so such content is refused as content that is not UTF-8 is;
// pairs, escaped backslashes and the other escapes pass.
func TestMessageEscapesNoTextHoldsAreAnError(t *testing.T) {
	msg := func(key, payload string) []byte {
		return []byte(`{"id":"406c07f3-0000-4000-8000-000000000001","aggregatetype":"Order","aggregateid":"` + key + `","type":"T","payload":` + payload + `}`)
	}
	for _, bad := range [][]byte{
		msg(`K\ud800`, `{}`), msg(`K\udfff`, `{}`), msg(`K\ud800x`, `{}`), msg(`K\ud800\u0041`, `{}`),
		msg(`K\u0000x`, `{}`), msg(`K1`, `"\ud800"`), msg(`K1`, `{"a":["\udc00"]}`), msg(`K1`, `{"\u0000":1}`),
	} {
		if row, err := messageRow("outbox", "payload", bad); err == nil {
			t.Errorf("%s: read as %q, want an error", bad, row.Values)
		} else if !strings.Contains(err.Error(), "offset") {
			t.Errorf("%s: error %q does not say where", bad, err)
		}
	}
	for _, good := range [][]byte{
		msg(`K\ud83d\ude00`, `{}`), msg(`K\\ud800`, `{}`), msg(`K\\\"\u00e9`, `{"a":"\\u0000"}`), msg(`K\u0041`, `"\ud83d\ude00"`),
	} {
		if _, err := messageRow("outbox", "payload", good); err != nil {
			t.Errorf("%s: %v, want it read", good, err)
		}
	}
}

// TestMessagePayloadIsJSONLikeTheTablesColumn: the payload of the outbox
// table pgoutbox migrate makes is jsonb, so a JSON string payload is a JSON
// string there: "" is two bytes (no empty payload: no tombstone with
// route.tombstone.on.empty.payload), "x" keeps its quotes. A message's
// payload field is routed the same, whatever its JSON.
func TestMessagePayloadIsJSONLikeTheTablesColumn(t *testing.T) {
	opts := router.DefaultOptions()
	opts.RouteTombstoneOnEmptyPayload = true
	r, err := router.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	for payload, want := range map[string]string{`""`: `""`, `"  "`: `"  "`, `"x"`: `"x"`, `12.50`: `12.50`, `true`: `true`, `{"a":1}`: `{"a":1}`} {
		row, err := messageRow("outbox", "payload", []byte(`{"id":"406c07f3-0000-4000-8000-000000000001","aggregatetype":"Order","aggregateid":"1","type":"T","payload":`+payload+`}`))
		if err != nil {
			t.Fatal(err)
		}
		var rec router.Record
		if act, err := r.Route(&row, time.Now(), &rec); err != nil || act != router.Emit {
			t.Fatalf("payload %s: route: %v %v", payload, act, err)
		}
		if rec.Value == nil || string(rec.Value) != want {
			t.Errorf("payload %s: value %q (nil %v), want %s", payload, rec.Value, rec.Value == nil, want)
		}
	}
	// null is still the empty payload: a tombstone.
	row, _ := messageRow("outbox", "payload", []byte(`{"id":"406c07f3-0000-4000-8000-000000000001","aggregatetype":"Order","aggregateid":"1","type":"T","payload":null}`))
	var rec router.Record
	if _, err := r.Route(&row, time.Now(), &rec); err != nil || rec.Value != nil {
		t.Fatalf("payload null: value %q (%v), want a tombstone", rec.Value, err)
	}
}

// TestDebeziumMessageRowMakesMessageRowsChecks: messages.format=debezium
// decodes content with router.DecodeMessage, and is held to the same
// checks of its bytes as messageRow: content that is not UTF-8 and an
// escape no text holds are errors naming where, checked around the same
// parsing; what messageRow reads, it reads too.
func TestDebeziumMessageRowMakesMessageRowsChecks(t *testing.T) {
	set, err := router.NewSet(router.DefaultOptions(), nil)
	if err != nil {
		t.Fatal(err)
	}
	s := &session{r: &Relay{router: set}}
	msg := func(key, payload string) *replication.Message {
		return &replication.Message{Prefix: "outbox", Transactional: true,
			Content: []byte(`{"id":"406c07f3-0000-4000-8000-000000000001","aggregatetype":"Order","aggregateid":"` + key + `","type":"T","payload":` + payload + `}`)}
	}
	latin1 := msg("M\xfcller", `{}`)
	for _, c := range []struct {
		m    *replication.Message
		want string
	}{
		{latin1, "not valid UTF-8"},
		{msg(`K\ud800`, `{}`), "offset"},
		{msg(`K1`, `{"a":["\udc00"]}`), "offset"},
		{msg(`K\u0000x`, `{}`), "offset"},
		{&replication.Message{Prefix: "outbox", Content: []byte(`{"id":`)}, ""},
	} {
		row, err := s.debeziumMessageRow(c.m)
		if err == nil {
			t.Errorf("%s: read as %q, want an error", c.m.Content, row.Values)
		} else if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %q, want it to say %q", c.m.Content, err, c.want)
		}
	}
	for _, m := range []*replication.Message{msg(`K\ud83d\ude00`, `{}`), msg(`K\\ud800`, `{}`), msg(`K\u0041`, `"\ud83d\ude00"`)} {
		if _, err := s.debeziumMessageRow(m); err != nil {
			t.Errorf("%s: %v, want it read", m.Content, err)
		}
		if _, err := messageRow("outbox", "payload", m.Content); err != nil {
			t.Errorf("%s: messageRow: %v", m.Content, err)
		}
	}
}
