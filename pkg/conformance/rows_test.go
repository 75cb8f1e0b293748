package conformance

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// The outbox tables. conf_outbox is Debezium's recommended shape (jsonb
// payload) plus the columns the configurations place or read; conf_outbox_text
// has a text payload (what expansion parses as written, not as jsonb
// normalises it) and a microsecond timestamp; conf_outbox_null is the table
// of the NULL-event-id configuration, in a publication of its own. A bigserial
// primary key lets the event id be NULL and UPDATE and DELETE be published.
const schemaSQL = `
-- Domains (the stream names the domain, Debezium its base type) and an enum.
CREATE DOMAIN conf_amount AS numeric(12,2);
CREATE DOMAIN conf_ts3 AS timestamptz(3) CHECK (VALUE > '1900-01-01');
CREATE DOMAIN conf_day AS date;
CREATE DOMAIN conf_day2 AS conf_day;
CREATE TYPE conf_mood AS ENUM ('happy', 'sad');
-- citext and ltree, which Debezium's connector knows by their names and
-- takes as text.
CREATE EXTENSION IF NOT EXISTS citext;
CREATE EXTENSION IF NOT EXISTS ltree;
CREATE TABLE conf_outbox (
	seq bigserial PRIMARY KEY,
	id uuid,
	aggregatetype varchar(255),
	aggregateid varchar(255),
	type varchar(255),
	payload jsonb,
	ts timestamp(3),
	part int4,
	flag boolean,
	version int4,
	tracingspancontext text,
	-- Typed columns, placed into headers and the envelope by the typed
	-- configurations (NULL in most rows).
	amount numeric(12,2),
	amount_any numeric,
	tiny numeric(20,10),
	created timestamptz,
	created3 timestamptz(3),
	created0 timestamptz(0),
	at timestamp,
	at3 timestamp(3),
	day date,
	tod time,
	tod3 time(3),
	dur interval,
	blob bytea,
	big int8,
	ratio float8,
	uid uuid,
	d_amount conf_amount,
	d_created conf_ts3,
	d_day conf_day2,
	mood conf_mood,
	email citext,
	-- Types whose Connect value is their text (or a number: oid, int2,
	-- float4), the same in Debezium as in pgoutbox.
	o oid,
	ip inet,
	cidrc cidr,
	mac macaddr,
	m8 macaddr8,
	tsv tsvector,
	doc xml,
	r4 int4range,
	i8r int8range,
	nr numrange,
	dr daterange,
	tsr tsrange,
	rtz tstzrange,
	ch char(5),
	ch1 "char",
	sm int2,
	rl float4,
	js json,
	lt ltree,
	vb varchar(10),
	ts2 timestamptz(2),
	-- A column with a default, NULL in every row (JsonConverter's
	-- replace.null.with.default).
	note text DEFAULT 'the default'
);
CREATE TABLE conf_outbox_text (LIKE conf_outbox INCLUDING DEFAULTS INCLUDING IDENTITY);
ALTER TABLE conf_outbox_text ADD PRIMARY KEY (seq);
ALTER TABLE conf_outbox_text ALTER COLUMN payload TYPE text, ALTER COLUMN ts TYPE timestamp(6);
CREATE TABLE conf_outbox_null (LIKE conf_outbox INCLUDING DEFAULTS INCLUDING IDENTITY);
ALTER TABLE conf_outbox_null ADD PRIMARY KEY (seq);
CREATE PUBLICATION conf_pub FOR TABLE conf_outbox, conf_outbox_text;
CREATE PUBLICATION conf_pub_null FOR TABLE conf_outbox_null;
CREATE TABLE conf_outbox_msg (LIKE conf_outbox INCLUDING DEFAULTS INCLUDING IDENTITY);
ALTER TABLE conf_outbox_msg ADD PRIMARY KEY (seq);
CREATE PUBLICATION conf_pub_msg FOR TABLE conf_outbox_msg;
`

// row is one outbox row: column → value (nil is SQL NULL).
type row map[string]any

// txn is one transaction of the workload.
type txn struct {
	name     string
	rows     []row    // inserted in order (table in the "table" pseudo-column)
	after    []string // statements run after the inserts, in the same transaction
	rollback bool
	// messages are logical decoding messages emitted after the rows
	// (transactional, prefix msgPrefix), each with its content and the
	// row it stands for (nil for content that is no event).
	messages []message
}

// message is one table-less outbox event of the decode-messages
// configuration: its content as written, and the event as a row.
type message struct {
	content string
	event   row
}

// msgPrefix is the prefix of the workload's logical decoding messages, and
// otherPrefix that of its non-transactional one (no event).
const (
	msgPrefix   = "conf_msg"
	otherPrefix = "conf_other"
)

// eventID is the id of the n-th event.
func eventID(n int) string { return fmt.Sprintf("c0c0c0c0-0000-4000-8000-%012d", n) }

// workload is the conformance rows, written once. tok makes the routing
// values (and so the topics) unique to the run. The rows whose payloads
// make Debezium's expansion fail come last in conf_outbox, so that a task
// that dies on them has relayed everything before; the sentinel ends the
// stream.
type workload struct {
	tok  string
	txns []txn
	n    int
	// sentinel is the last row, the only one routed to its topic.
	sentinel row
	// afterSentinel is pg_current_wal_lsn() read after the sentinel's
	// commit, set by write.
	afterSentinel string
	// before maps each event id to pg_current_wal_lsn() read before its
	// transaction began: a slot confirmed at or before it sends the event
	// again.
	before map[string]string
}

func (w *workload) ev(table string, mods ...func(row)) row {
	w.n++
	r := row{
		"table":         table,
		"id":            eventID(w.n),
		"aggregatetype": "Order" + w.tok,
		"aggregateid":   fmt.Sprintf("k%d", w.n%7),
		"type":          "OrderCreated" + w.tok,
		"payload":       fmt.Sprintf(`{"n": %d}`, w.n),
		"part":          w.n % 3,
		"flag":          w.n%2 == 0,
		"version":       w.n % 4,
	}
	for _, m := range mods {
		m(r)
	}
	return r
}

func set(col string, v any) func(row) { return func(r row) { r[col] = v } }

func payload(p any) func(row) { return set("payload", p) }

func (w *workload) add(name string, rows ...row) {
	w.txns = append(w.txns, txn{name: name, rows: rows})
}

const (
	tMain = "conf_outbox"
	tText = "conf_outbox_text"
	tNull = "conf_outbox_null"
	tMsg  = "conf_outbox_msg"
)

func nested(depth int, open, close, inner string) string {
	return strings.Repeat(open, depth) + inner + strings.Repeat(close, depth)
}

func newWorkload(tok string) *workload {
	w := &workload{tok: tok}
	m, x := tMain, tText

	w.add("worked example", w.ev(m, set("aggregateid", "1"), payload(`{"total": 12}`)))
	w.add("multi-row transaction",
		w.ev(m, set("aggregateid", "a")), w.ev(m, set("aggregateid", "b")), w.ev(m, set("aggregateid", "a")),
		w.ev(m, set("aggregateid", "c"), set("aggregatetype", "Customer"+tok)), w.ev(m, set("aggregateid", "a")),
		w.ev(x, set("aggregateid", "b"), payload(`{"from": "text"}`)))
	w.txns = append(w.txns, txn{name: "rolled back", rollback: true,
		rows: []row{w.ev(m, payload(`{"rolled": "back"}`)), w.ev(x, payload(`{"rolled": "back"}`))}})
	sameTxn := w.ev(m, set("aggregateid", "deleted-in-txn"))
	w.txns = append(w.txns, txn{name: "inserted and deleted in one transaction", rows: []row{sameTxn},
		after: []string{fmt.Sprintf("DELETE FROM conf_outbox WHERE id = '%s'", sameTxn["id"])}})
	later := w.ev(m, set("aggregateid", "deleted-later"))
	w.add("inserted, deleted in its own transaction", later)
	w.txns = append(w.txns, txn{name: "DELETE in its own transaction",
		after: []string{fmt.Sprintf("DELETE FROM conf_outbox WHERE id = '%s'", later["id"])}})
	updated := w.ev(m, set("aggregateid", "updated"))
	w.add("inserted, updated later", updated)
	w.txns = append(w.txns, txn{name: "UPDATE",
		after: []string{fmt.Sprintf(`UPDATE conf_outbox SET payload = '{"updated": true}' WHERE id = '%s'`, updated["id"])}})

	// Character classes, in payload strings, JSON member names, keys and
	// header columns.
	classes := map[string]string{
		"ascii controls": "\u0001\u0002\u0007\b\t\n\u000b\f\r\u000e\u001b\u001f\u007f",
		"latin-1":        "é ü ß ÿ © ¿ Ñ",
		"cjk":            "漢字 かな カナ 한국어",
		"non-bmp":        "😀 𝄞 🇺🇳 𠜎",
		"separators":     "a\u2028b\u2029c",
		"quotes":         `"q" \ \\ / ' \"`,
		"bom and nbsp":   "\ufeff\u00a0\u200b",
	}
	for _, name := range slices.Sorted(maps.Keys(classes)) {
		s := classes[name]
		js := jsonString(s)
		w.add("characters: "+name,
			w.ev(m, payload(`{"s": `+js+`, `+js+`: 1}`), set("aggregateid", "key "+s)),
			w.ev(x, payload(`{"s": `+js+`}`), set("aggregateid", s)))
	}
	w.add("odd member names",
		w.ev(m, payload(`{"": 1, " ": 2, "payload": 3, "a.b": 4, "a-b": 5, "1": 6, "$x": 7, "😀": 8, "null": null}`)),
		w.ev(x, payload(`{"a": 1, "a": 2, "b": {"a": 3, "a": null}}`)))
	w.add("odd keys",
		w.ev(m, set("aggregateid", "")), w.ev(m, set("aggregateid", nil)),
		w.ev(m, set("aggregateid", strings.Repeat("k", 250))), w.ev(x, set("aggregateid", nil)))
	w.add("large payloads",
		w.ev(m, payload(`{"blob": "`+strings.Repeat("0123456789abcdef", 12500)+`"}`)),
		w.ev(m, payload(`{"list": [`+strings.TrimSuffix(strings.Repeat("1234567, ", 20000), ", ")+`]}`)),
		w.ev(x, payload(`{"blob": "`+strings.Repeat("😀é", 30000)+`"}`)))
	w.add("degenerate payloads",
		w.ev(m, payload(`{}`)), w.ev(m, payload(`[]`)), w.ev(m, payload(`""`)), w.ev(m, payload(`null`)),
		w.ev(m, payload(nil)), w.ev(m, payload(`0`)), w.ev(m, payload(`"text"`)), w.ev(m, payload(`true`)),
		w.ev(m, payload(`[1, 2, 3]`)), w.ev(m, payload(`["a", "b"]`)), w.ev(m, payload(`{"a": []}`)),
		w.ev(m, payload(`{"a": [null, null]}`)), w.ev(m, payload(`{"a": {}}`)), w.ev(m, payload(`{"a": [[], [1]]}`)))
	w.add("degenerate text payloads",
		w.ev(x, payload(``)), w.ev(x, payload(`   `)), w.ev(x, payload("\t{}\n")), w.ev(x, payload(` {"a": 1}`)),
		w.ev(x, payload(`plain text`)), w.ev(x, payload(`{"a": 1} trailing`)), w.ev(x, payload(`{bad json`)),
		w.ev(x, payload(`[1, 2]`)), w.ev(x, payload(nil)), w.ev(x, payload(`{"s": "\ud83d"}`)),
		w.ev(x, payload(`{"s": "\ud83d\ude00 \u00e9 \u2028"}`)), w.ev(x, payload(`{"a": 1,}`)),
		w.ev(x, payload(`{"a": 01}`)), w.ev(x, payload(`{"a": NaN}`)), w.ev(x, payload(`/* c */ {}`)))
	w.add("numbers",
		w.ev(m, payload(`{"i32max": 2147483647, "i32min": -2147483648, "i32over": 2147483648, "i64max": 9223372036854775807, "i64min": -9223372036854775808}`)),
		w.ev(m, payload(`{"f": 0.1, "e": 1e2, "neg0": -0, "negf": -0.0, "one": 1.0, "dec": 12.50, "exp": 1E-7, "small": 0.000001}`)),
		w.ev(x, payload(`{"max": 1.7976931348623157e308, "min": 4.9e-324, "e": 1E2, "dec": 12.50, "neg0": -0, "negf": -0.0, "f": 1.0e-3, "g": 1e7, "h": 9999999.0, "i": 123456789.123456789}`)),
		w.ev(x, payload(`{"i32max": 2147483647, "i32over": 2147483648, "i64max": 9223372036854775807, "i64min": -9223372036854775808}`)),
		w.ev(x, payload(`{"a": [1, 2147483648]}`)), w.ev(x, payload(`{"a": [1, 1.5]}`)), w.ev(x, payload(`{"a": [1, "x"]}`)))
	w.add("deep nesting",
		w.ev(m, payload(nested(100, `{"a": `, `}`, `1`))),
		w.ev(x, payload(nested(100, `[`, `]`, `1`))),
		w.ev(x, payload(nested(999, `[`, `]`, ``))),
		w.ev(x, payload(nested(1001, `[`, `]`, ``))),
		w.ev(x, payload(nested(1001, `{"a": `, `}`, `1`))))
	w.add("arrays of objects",
		w.ev(m, payload(`{"lines": [{"sku": "a", "qty": 1}, {"sku": "b"}, {"qty": 2, "note": "x"}]}`)),
		w.ev(m, payload(`{"lines": [{"a": null}, {"a": 1}]}`)))
	w.add("timestamps",
		w.ev(m, set("ts", "2024-01-02 03:04:05.123")), w.ev(m, set("ts", "1999-12-31 23:59:59.999")),
		w.ev(m, set("ts", "1970-01-01 00:00:00")), w.ev(m, set("ts", nil)),
		w.ev(x, set("ts", "2024-01-02 03:04:05.123456")), w.ev(x, set("ts", "2025-06-30 23:59:59.999999")))
	w.add("partitions, flags and versions",
		w.ev(m, set("part", nil), set("flag", nil), set("version", nil)),
		w.ev(m, set("part", 2), set("flag", true), set("version", 7)),
		w.ev(x, set("part", 1), set("flag", false), set("version", nil)))
	w.add("tracing context",
		w.ev(m, set("tracingspancontext", "traceparent=00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\n")),
		w.ev(m, set("tracingspancontext", "#Properties\ntraceparent=00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00\ntracestate=congo\\=t61rcWkgMzE\n")),
		w.ev(m, set("tracingspancontext", "not a context")))
	w.add("other routing values",
		w.ev(m, set("aggregatetype", "Payment"+tok), set("type", "PaymentPaid"+tok)),
		w.ev(m, set("type", "misc-thing"+tok)), w.ev(x, set("type", "Misc.other"+tok)))

	// Typed values, for the configurations that place the typed columns
	// (all NULL in the other rows): edges of each type's conversion.
	typed := func(vals map[string]string) func(row) {
		return func(r row) {
			for c, v := range vals {
				r[c] = v
			}
		}
	}
	w.add("typed values",
		w.ev(m, typed(map[string]string{"amount": "12.30", "amount_any": "12.3", "tiny": "0.0000001", "created": "2024-01-02 03:04:05.1+00",
			"created3": "2024-01-02 03:04:05.123456+00", "created0": "2024-01-02 03:04:05.6+00", "tod3": "03:04:05.123",
			"at": "2024-01-02 03:04:05.123456", "at3": "2024-01-02 03:04:05.123", "day": "2024-01-02", "tod": "03:04:05.123456",
			"dur": "1 day 02:03:04", "blob": `\x01fbff`, "big": "9223372036854775807", "ratio": "0.1", "uid": "406c07f3-26f2-4b0c-9a3a-4d6a5a1c0e01",
			"d_amount": "12.30", "d_created": "2024-01-02 03:04:05.123456+00", "d_day": "2024-01-02", "mood": "happy", "email": "Ann@Example.COM",
			"o": `12345`, "ip": `192.168.0.1`, "cidrc": `10.0.0.0/8`, "mac": `08:00:2b:01:02:03`, "m8": `08:00:2b:01:02:03:04:05`, "tsv": `a fat cat`, "doc": `<a>x</a>`, "r4": `[1,5)`, "i8r": `[1,10]`, "nr": `(1.5,2.5]`, "dr": `[2024-01-01,2024-02-01)`, "tsr": `[2024-01-01 00:00,2024-01-02 00:00)`, "rtz": `[2024-01-01 00:00+00,2024-01-02 00:00+00)`, "ch": `ab`, "ch1": `x`, "sm": `-32768`, "rl": `1.5`, "js": `{"a": 1}`, "lt": `a.b.c`, "vb": `v`, "ts2": `2024-01-02 03:04:05.126+00`})),
		w.ev(m, typed(map[string]string{"amount": "-0.01", "amount_any": "0.0000001", "tiny": "-1234567890.0123456789", "created": "1999-12-31 23:59:59.999999-08",
			"created3": "1960-01-01 00:00:00+00", "created0": "infinity", "tod3": "23:59:59.999",
			"at": "1960-06-01 12:00:00.5", "at3": "1969-12-31 23:59:59.999", "day": "1960-01-01", "tod": "23:59:59",
			"dur": "1 year 2 mons 3 days 04:05:06.789", "blob": `\x`, "big": "-1", "ratio": "1e-7",
			"d_amount": "-0.01", "d_created": "1999-12-31 23:59:59.9995-08", "d_day": "1960-01-01", "mood": "sad", "email": "zoë \\ \"q\" 😀"})),
		w.ev(m, typed(map[string]string{"amount": "0", "amount_any": "100000000000000000000", "tiny": "0", "created": "1960-01-01 00:00:00+00",
			"created3": "2024-01-02 03:04:05+05:30", "created0": "1970-01-01 00:00:00+00", "tod3": "00:00:00",
			"at": "1970-01-01 00:00:00", "at3": "2024-01-02 03:04:05", "day": "1970-01-01", "tod": "00:00:00",
			"dur": "-01:00:00", "big": "0", "ratio": "12345678.9"})),
		w.ev(x, typed(map[string]string{"amount": "9999999999.99", "amount_any": "-5", "tiny": "12.5", "created": "2024-06-30 12:00:00+02",
			"at": "2024-06-30 12:00:00", "dur": "00:00:00.000001", "ratio": "-2.5"})),
		// A numeric's NaN and infinities (an infinity fits only a numeric
		// without a precision), which no Decimal holds: Debezium writes
		// null, the key included (tiny, typed-string-key), and goes on.
		w.ev(m, typed(map[string]string{"amount": "NaN", "amount_any": "Infinity", "tiny": "NaN", "d_amount": "NaN"})))

	// Payloads that expansion may fail on, last.
	w.add("expansion edge: integer beyond 64 bits", w.ev(m, payload(`{"big": 18446744073709551616}`)))
	w.add("expansion edge: top-level array of objects", w.ev(m, payload(`[{"a": 1}, {"b": 2}]`)))
	w.add("expansion edge: top-level array of numbers", w.ev(x, payload(`[1, 2]`)))
	w.add("expansion edge: huge double as jsonb", w.ev(m, payload(`{"d": 1e300}`)))
	w.sentinel = w.ev(m, set("aggregateid", "sentinel"), set("aggregatetype", "Sentinel"+tok), set("type", "SentinelCreated"+tok), payload(`{"end": true}`))
	w.add("sentinel", w.sentinel)
	return w
}

// typedColumns are the typed columns of the outbox tables, in the order of
// schemaSQL; typeOf gives each one's type for the cast of its text.
var typedColumns = []string{"amount", "amount_any", "tiny", "created", "created3", "created0", "at", "at3", "day", "tod", "tod3", "dur", "blob", "big", "ratio", "uid",
	"d_amount", "d_created", "d_day", "mood", "email",
	"o", "ip", "cidrc", "mac", "m8", "tsv", "doc", "r4", "i8r", "nr", "dr", "tsr", "rtz", "ch", "ch1", "sm", "rl", "js", "lt", "vb", "ts2", "note"}

func typeOf(col string) string {
	return map[string]string{"amount": "numeric(12,2)", "amount_any": "numeric", "tiny": "numeric(20,10)", "created": "timestamptz",
		"created3": "timestamptz(3)", "created0": "timestamptz(0)", "at": "timestamp", "at3": "timestamp(3)", "day": "date", "tod": "time",
		"tod3": "time(3)", "dur": "interval", "blob": "bytea", "big": "int8", "ratio": "float8", "uid": "uuid",
		"d_amount": "conf_amount", "d_created": "conf_ts3", "d_day": "conf_day2", "mood": "conf_mood", "email": "citext",
		"o": `oid`, "ip": `inet`, "cidrc": `cidr`, "mac": `macaddr`, "m8": `macaddr8`, "tsv": `tsvector`, "doc": `xml`, "r4": `int4range`, "i8r": `int8range`, "nr": `numrange`, "dr": `daterange`, "tsr": `tsrange`, "rtz": `tstzrange`, "ch": `char(5)`, "ch1": `"char"`, "sm": `int2`, "rl": `float4`, "js": `json`, "lt": `ltree`, "vb": `varchar(10)`, "ts2": `timestamptz(2)`, "note": "text"}[col]
}

// events are the transaction's rows and the events of its messages.
func (tx *txn) events() []row {
	out := slices.Clone(tx.rows)
	for _, m := range tx.messages {
		if m.event != nil {
			out = append(out, m.event)
		}
	}
	return out
}

// msg is a message of an event like ev's, its content the event's JSON
// object with the members given as JSON text (a nil value leaves the
// member out) in the order given: id, aggregatetype, aggregateid, type,
// payload, unless extra says otherwise.
func (w *workload) msg(members ...[2]any) message {
	w.n++
	ev := row{"table": tMsg, "id": eventID(w.n), "aggregatetype": "Order" + w.tok, "aggregateid": fmt.Sprintf("m%d", w.n%5),
		"type": "OrderCreated" + w.tok}
	order := []string{"id", "aggregatetype", "aggregateid", "type", "payload"}
	set := map[string]string{"payload": fmt.Sprintf(`{"n":%d}`, w.n)}
	for _, m := range members {
		k := m[0].(string)
		if !slices.Contains(order, k) {
			order = append(order, k)
		}
		if m[1] == nil {
			set[k] = "\x00omit"
			continue
		}
		set[k] = m[1].(string)
	}
	var b strings.Builder
	b.WriteByte('{')
	for _, k := range order {
		v, ok := set[k]
		if !ok {
			v = jsonString(ev[k].(string))
		}
		if v == "\x00omit" {
			continue
		}
		if b.Len() > 1 {
			b.WriteByte(',')
		}
		b.WriteString(jsonString(k) + ":" + v)
		var plain string
		if json.Unmarshal([]byte(v), &plain) == nil {
			ev[k] = plain
		}
	}
	b.WriteByte('}')
	return message{content: b.String(), event: ev}
}

// messageWorkload is the table-less outbox events of the decode-messages
// configurations: logical decoding messages that Debezium's
// DecodeLogicalDecodingMessageContent makes outbox rows of, in
// transactions of their own, with outbox rows (in conf_outbox_msg, the
// table of those configurations alone), and rolled back; the sentinel is
// a row.
func messageWorkload(tok string, start int) *workload {
	w := &workload{tok: tok, n: start}
	one := func(name string, ms ...message) { w.txns = append(w.txns, txn{name: name, messages: ms}) }
	one("payload object", w.msg([2]any{"payload", `{"n":1,"s":"t","deep":{"a":{"b":{"c":[true,false]}}}}`}))
	one("payload a JSON string", w.msg([2]any{"payload", `"{\"x\":1}"`}))
	one("payload a plain string", w.msg([2]any{"payload", `"hello"`}))
	one("payload {}", w.msg([2]any{"payload", `{}`}))
	one("payload an array of numbers", w.msg([2]any{"payload", `[1,2,3]`}))
	// The same members in every element: Debezium merges the schemas of
	// elements with others in a HashSet order that differs between runs.
	one("payload an array of objects", w.msg([2]any{"payload", `[{"a":1,"b":"x"},{"a":2,"b":"y"}]`}))
	one("payload nulls and empty arrays", w.msg([2]any{"payload", `{"a":null,"l":[],"m":{"n":null,"k":[]},"v":[1,null,3]}`}))
	one("payload a number", w.msg([2]any{"payload", `5`}))
	one("payload numbers", w.msg([2]any{"payload", `{"i":1,"neg":-5,"big":9223372036854775807,"f":39.98,"e":1e300,"small":1.0E-7,"z":0,"negz":-0.0,"fi":2.0,"i0":-0}`}))
	one("payload characters", w.msg([2]any{"payload", `{"s":"😀 é \u2028 \" \\ \u0001 \u001f ✓ / <>&"}`}))
	one("key a number", w.msg([2]any{"aggregateid", `42`}))
	one("key a double", w.msg([2]any{"aggregateid", `1e2`}))
	one("key a boolean", w.msg([2]any{"aggregateid", `true`}))
	one("key a big integer", w.msg([2]any{"aggregateid", `9223372036854775807`}))
	one("key with characters", w.msg([2]any{"aggregateid", `"k😀é\""`}))
	one("null type and an extra member", w.msg([2]any{"type", `null`}, [2]any{"extra", `"x"`}))
	one("members in another order", message{content: fmt.Sprintf(`{"payload":{"b":2,"a":1},"type":"OrderCreated%s","aggregateid":"m-order","aggregatetype":"Order%s","id":%q}`, tok, tok, eventID(w.n+1)),
		event: row{"table": tMsg, "id": eventID(w.n + 1), "aggregatetype": "Order" + tok}})
	w.n++
	w.txns = append(w.txns, txn{name: "two messages and a row", rows: []row{w.ev(tMsg, set("aggregateid", "m1"))},
		messages: []message{w.msg([2]any{"aggregateid", `"m1"`}), w.msg([2]any{"aggregateid", `"m1"`})}})
	w.txns = append(w.txns, txn{name: "rolled back", rollback: true, messages: []message{w.msg()}})
	// A non-transactional message of another prefix, in a transaction
	// rolled back: PostgreSQL decodes it all the same. Debezium writes it
	// to its message topic unless its filters leave it out.
	w.txns = append(w.txns, txn{name: "non-transactional", rollback: true, after: []string{
		"SELECT pg_logical_emit_message(false, '" + otherPrefix + "', 'not tied to a transaction')"}})
	// Last: messages on which Debezium's task stops (errors.tolerance=all
	// skips them), each a poison message to pgoutbox.
	one("no payload", w.msg([2]any{"payload", nil}))
	one("payload null", w.msg([2]any{"payload", `null`}))
	one("no event id", w.msg([2]any{"id", nil}))
	one("an integer beyond 64 bits", w.msg([2]any{"payload", `{"big":92233720368547758070}`}))
	one("a mixed array", w.msg([2]any{"payload", `[1,"x"]`}))
	for _, c := range []string{`not json`, ` {"id":"x"}`, `[1]`, `{}`} {
		one("not an event: "+c, message{content: c})
	}
	// Debezium's Jackson reads the first JSON value and ignores what
	// follows: a second event written after the first would be dropped
	// without a word. pgoutbox refuses such content.
	trailing := w.msg()
	trailing.content += ` {"id":"second"}`
	trailing.event["deliberate"] = "content after the JSON object: Debezium routes the object and ignores the rest, pgoutbox refuses the message (poison), as a second event there would be lost unseen"
	one("content after the object", trailing)
	w.sentinel = w.ev(tMsg, set("aggregateid", "sentinel"), set("aggregatetype", "MsgSentinel"+tok), set("type", "SentinelCreated"+tok))
	w.add("sentinel", w.sentinel)
	return w
}

// nullWorkload is the rows of the NULL-event-id configuration.
func nullWorkload(tok string, start int) *workload {
	w := &workload{tok: tok, n: start}
	w.add("before", w.ev(tNull, set("aggregateid", "before")))
	w.add("NULL event id", w.ev(tNull, set("id", nil), set("aggregateid", "null-id")))
	w.sentinel = w.ev(tNull, set("aggregateid", "sentinel"), set("aggregatetype", "Sentinel"+tok), set("type", "SentinelCreated"+tok))
	w.add("sentinel", w.sentinel)
	return w
}

func jsonString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"':
			b.WriteString(`\"`)
		case r == '\\':
			b.WriteString(`\\`)
		case r < 0x20:
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// write commits the workload's transactions (rolling back those marked so).
func (w *workload) write(t testing.TB, conn *pgx.Conn) {
	t.Helper()
	ctx := context.Background()
	w.before = map[string]string{}
	for _, tx := range w.txns {
		var lsn string
		if err := conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn); err != nil {
			t.Fatal(err)
		}
		for _, r := range tx.events() {
			if id, ok := r["id"].(string); ok {
				w.before[id] = lsn
			}
		}
		pt, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range tx.rows {
			cols := []string{"id", "aggregatetype", "aggregateid", "type", "payload", "ts", "part", "flag", "version", "tracingspancontext"}
			cols = append(cols, typedColumns...)
			var args []any
			var ph []string
			for i, c := range cols {
				v, ok := r[c]
				if !ok {
					v = nil
				}
				args = append(args, v)
				if i >= len(cols)-len(typedColumns) {
					// Given as text, cast by the server.
					ph = append(ph, fmt.Sprintf("$%d::text::%s", i+1, typeOf(c)))
				} else {
					ph = append(ph, fmt.Sprintf("$%d", i+1))
				}
			}
			sql := fmt.Sprintf("INSERT INTO %s (%s) VALUES (%s)", r["table"], strings.Join(cols, ", "), strings.Join(ph, ", "))
			if _, err := pt.Exec(ctx, sql, args...); err != nil {
				t.Fatalf("%s: %s: %v", tx.name, sql, err)
			}
		}
		for _, m := range tx.messages {
			if _, err := pt.Exec(ctx, "SELECT pg_logical_emit_message(true, $1, $2::text)", msgPrefix, m.content); err != nil {
				t.Fatalf("%s: message %s: %v", tx.name, m.content, err)
			}
		}
		for _, sql := range tx.after {
			if _, err := pt.Exec(ctx, sql); err != nil {
				t.Fatalf("%s: %s: %v", tx.name, sql, err)
			}
		}
		if tx.rollback {
			err = pt.Rollback(ctx)
		} else {
			err = pt.Commit(ctx)
		}
		if err != nil {
			t.Fatalf("%s: %v", tx.name, err)
		}
	}
	if err := conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&w.afterSentinel); err != nil {
		t.Fatal(err)
	}
}
