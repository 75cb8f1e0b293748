package router

import (
	"bytes"
	"slices"
	"strconv"
	"time"
)

// Op is the row operation.
type Op uint8

// Row operations.
const (
	OpInsert Op = iota + 1
	OpUpdate
	OpDelete
)

// String returns INSERT, UPDATE or DELETE.
func (o Op) String() string {
	switch o {
	case OpInsert:
		return "INSERT"
	case OpUpdate:
		return "UPDATE"
	case OpDelete:
		return "DELETE"
	}
	return "Op(" + strconv.Itoa(int(o)) + ")"
}

// Row is one decoded row. Names, Types and Values are parallel slices;
// Values[i] == nil means SQL NULL. Values are in PostgreSQL's text format,
// as pgoutput sends them: jsonb as its JSON text, uuid in canonical text,
// bytea as "\x0a0b..." hex text, timestamptz as
// "2024-01-02 03:04:05.123456+00".
//
// Types may be nil or shorter than Names; a missing OID is taken as text.
// A caller that passes the same Names slice (or an equal one) for every row
// of a table lets the Router reuse its column lookup.
type Row struct {
	Table string // schema-qualified table, e.g. "public.outbox"
	Op    Op
	Names []string
	Types []uint32 // PostgreSQL type OIDs (25 text, 2950 uuid, 3802 jsonb, 17 bytea, ...)
	// Mods are the columns' type modifiers (atttypmod: the precision of
	// timestamp(3), the precision and scale of numeric(12,2)); -1 is none.
	// They decide the Kafka Connect value Debezium makes of a numeric,
	// time or timestamp column. nil or short: none.
	Mods   []int32
	Values [][]byte
	// Message marks a row that DecodeMessage made of a logical decoding
	// message, as Debezium's DecodeLogicalDecodingMessageContent makes
	// one: Debezium writes none of its extended headers
	// (__debezium.context.*) on the records of messages, only on those of
	// rows (a real Debezium 3.6.1, with that transform and on its raw
	// message records alike), and its columns may be of OIDConnectJSON.
	Message bool
}

// Header is one Kafka record header. A nil Value is a header with a null
// value (from a NULL column).
type Header struct {
	Key   string
	Value []byte
}

// Record is the Kafka record for one row.
//
// Key, Value and header values alias the Row's Values wherever no
// conversion is needed (bytea columns are decoded into new memory, an
// envelope value is newly built): the caller must keep the row's bytes
// alive and unchanged until the record has been produced, or copy them.
type Record struct {
	Topic string
	// Key is the record key: the key column's text. nil means no key (the
	// column is NULL or absent).
	Key []byte
	// Value is the record value. nil is a tombstone; an empty non-nil
	// slice is an empty value.
	Value []byte
	// Headers' backing array is reused by Route when the caller reuses the
	// Record. They are, in Debezium's order: the extended headers
	// (extended.headers.enabled), traceparent and tracestate
	// (tracing.span.context.field), "id", the additional fields, and
	// traceparent from table.field.event.trace.
	Headers []Header
	// Partition is the explicit partition from a column with placement
	// partition, or -1 to let the producer's partitioner choose.
	Partition int32
	// Timestamp is the record timestamp: the timestamp column's value if
	// one is configured and not NULL, otherwise the now given to Route.
	Timestamp time.Time
	// EventID is the event id column's text (nil when absent or NULL), for
	// logs and errors. It is set on drops too.
	EventID []byte
	// Reason says why a row was dropped with DropWarn or DropError, or what
	// was wrong with a row emitted with EmitWarn; empty otherwise. It is a
	// constant string, to be logged with the table and EventID.
	Reason string
}

// Action is Route's verdict on a row.
type Action uint8

// Actions.
const (
	// Emit: the Record is ready to be produced.
	Emit Action = iota + 1
	// Drop: nothing to produce and nothing worth logging (a DELETE on the
	// outbox table: applications may delete rows in the inserting
	// transaction).
	Drop
	// DropWarn: nothing to produce; log Record.Reason at warn level.
	DropWarn
	// DropError: nothing to produce; log Record.Reason at error level.
	DropError
	// EmitWarn: the Record is ready to be produced, as with Emit; also log
	// Record.Reason at warn level. Route gives it when an option could not
	// be applied to the row and the record was made without it: a payload
	// that table.expand.json.payload could not expand (emitted unchanged,
	// as Debezium does), or a table.field.event.trace value that is not a
	// W3C traceparent (the header is left out). A caller that treats
	// unknown actions as drops would lose these records: test with Emits.
	EmitWarn
)

// Emits reports whether the action produces a record: Emit or EmitWarn.
func (a Action) Emits() bool { return a == Emit || a == EmitWarn }

// String returns the action's name.
func (a Action) String() string {
	switch a {
	case Emit:
		return "emit"
	case Drop:
		return "drop"
	case DropWarn:
		return "drop-warn"
	case DropError:
		return "drop-error"
	case EmitWarn:
		return "emit-warn"
	}
	return "Action(" + strconv.Itoa(int(a)) + ")"
}

// Reasons for drops and warnings.
const (
	reasonUpdateWarn  = "UPDATE on an outbox table ignored: outbox rows must only be inserted (table.op.invalid.behavior=warn)"
	reasonUpdateError = "UPDATE on an outbox table ignored: outbox rows must only be inserted (table.op.invalid.behavior=error)"

	reasonExpandNotString = "payload not expanded (table.expand.json.payload): its column type is not a string type (bytea, boolean, number or array); emitted unchanged"
	reasonExpandNotJSON   = "payload not expanded (table.expand.json.payload): it does not start with { or [; emitted unchanged"
	reasonExpandBadJSON   = "payload not expanded (table.expand.json.payload): it is not valid JSON; emitted unchanged"
	reasonExpandNoConnect = "payload not expanded (table.expand.json.payload): Debezium infers no Kafka Connect schema for this JSON (an array mixing types or number classes, an array of nulls only or whose first element is an empty array, an empty member name, or a top-level []); emitted unchanged"

	// reasonExpandPoison is not a warning: with JsonConverter, Debezium
	// infers a schema for these payloads but its converter then fails
	// on the record (its task dies, or with errors.tolerance=all skips the
	// record), so the row is poison.
	reasonExpandPoison = "with value.converter=JsonConverter Debezium infers a schema for this JSON but cannot convert it (a top-level array, an integer beyond 64 bits, or array elements whose members conflict): its converter fails on the record, its task stops (errors.tolerance=all skips the record)"
	reasonTraceInvalid = "header traceparent left out: the table.field.event.trace value is not a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>, lower case, ids not all zero)"
)

// warnReason returns Record.Reason for an emitted row: the expansion's
// reason (or ""), and the trace value's when it was invalid. The strings
// are constants, so nothing is allocated.
func warnReason(expand string, badTrace bool) string {
	if !badTrace {
		return expand
	}
	switch expand {
	case reasonExpandNotString:
		return reasonExpandNotString + "; " + reasonTraceInvalid
	case reasonExpandNotJSON:
		return reasonExpandNotJSON + "; " + reasonTraceInvalid
	case reasonExpandBadJSON:
		return reasonExpandBadJSON + "; " + reasonTraceInvalid
	case reasonExpandNoConnect:
		return reasonExpandNoConnect + "; " + reasonTraceInvalid
	}
	return reasonTraceInvalid
}

// Cache bounds. Past them a cache is emptied and refilled, so memory stays
// bounded and a steady working set still allocates nothing.
const (
	maxTopics  = 4096 // distinct routing values
	maxLayouts = 64   // distinct column lists (tables and their versions)

	// maxCachedRoutingValue bounds the routing values kept as cache keys;
	// a longer one (a topic name has at most 249 characters) is mapped
	// anew each time.
	maxCachedRoutingValue = 512

	// maxScratch bounds the scratch memory (in bytes, or in elements) a
	// Router keeps between rows for JSON expansion; a larger payload's
	// scratch is dropped when the next payload is expanded.
	maxScratch = 1 << 20
)

// emptyValue is the value of a non-tombstone record with an empty payload.
// Its capacity is 0, so an append by the caller cannot write into it.
var emptyValue = []byte{}

// Router maps outbox rows to Kafka records. It holds caches (topics per
// routing value, column positions per column list) and is not safe for
// concurrent use: give each goroutine its own Router.
type Router struct {
	cfg     *config
	topics  map[string]string
	layouts []*layout
	last    *layout

	topicKey []byte  // scratch: the topic cache key when topics depend on the table
	json     jsonDoc // scratch: the parsed payload for table.expand.json.payload
	msg      jsonDoc // scratch: the message DecodeMessage parses
	expanded []byte  // scratch: the expanded payload
}

// layout is the position of each configured column in one column list,
// -1 where absent.
type layout struct {
	names                              []string
	id, key, payload, route, ts, trace int
	version, span                      int
	extras                             []int // parallel to config.extras
}

// New validates opts and returns a Router.
func New(opts Options) (*Router, error) {
	return newRouter(opts, "")
}

func newRouter(opts Options, table string) (*Router, error) {
	cfg, err := compile(opts, table)
	if err != nil {
		return nil, err
	}
	r := &Router{cfg: cfg, topics: make(map[string]string)}
	r.json.keepNulls = cfg.keepNulls
	r.json.jackson = cfg.valueConv == convJSON
	return r, nil
}

// Route maps row into rec, reusing rec's Headers backing array; now is the
// processing time, used as the record timestamp unless a timestamp column
// is configured and not NULL.
//
// An INSERT gives Emit with rec filled, or EmitWarn with rec filled and
// rec.Reason set. A DELETE gives Drop. An UPDATE gives DropWarn or
// DropError with rec.Reason set, or, with table.op.invalid.behavior=fatal,
// an error. A row that cannot be mapped gives a *RowError; rec's contents
// are then unspecified.
//
// For the default options Route allocates nothing once the routing value's
// topic is cached.
func (r *Router) Route(row *Row, now time.Time, rec *Record) (Action, error) {
	*rec = Record{Headers: rec.Headers[:0], Partition: -1}
	if len(row.Names) != len(row.Values) {
		return 0, &RowError{Table: row.Table, Err: ErrMalformedRow,
			Reason: strconv.Itoa(len(row.Names)) + " names but " + strconv.Itoa(len(row.Values)) + " values"}
	}
	cfg := r.cfg
	lay := r.layoutFor(row.Names)
	if lay.id >= 0 {
		rec.EventID = row.Values[lay.id]
	}

	switch row.Op {
	case OpInsert:
	case OpDelete:
		return Drop, nil
	case OpUpdate:
		switch cfg.onUpdate {
		case opWarn:
			rec.Reason = reasonUpdateWarn
			return DropWarn, nil
		case opError:
			rec.Reason = reasonUpdateError
			return DropError, nil
		default:
			return 0, rowErr(row, rec, "", ErrInvalidOperation, "")
		}
	default:
		return 0, rowErr(row, rec, "", ErrUnknownOp, row.Op.String())
	}

	if lay.id < 0 {
		return 0, rowErr(row, rec, cfg.idCol, ErrMissingColumn, "the event id column ("+optEventID+") is not in the row")
	}
	if row.Values[lay.id] == nil {
		return 0, rowErr(row, rec, cfg.idCol, ErrNullEventID, "")
	}
	if lay.payload < 0 {
		return 0, rowErr(row, rec, cfg.payloadCol, ErrMissingColumn, "the payload column ("+optEventPayload+") is not in the row")
	}
	if err := connectJSONElsewhere(row, rec, lay); err != nil {
		return 0, err
	}
	if cfg.versionCol != "" {
		if lay.version < 0 {
			return 0, rowErr(row, rec, cfg.versionCol, ErrMissingColumn, "the schema version column ("+optSchemaVersion+") is not in the row")
		}
		if v := row.Values[lay.version]; v != nil && !isInt32(v) {
			return 0, rowErr(row, rec, cfg.versionCol, ErrBadValue, strconv.Quote(string(v))+" is not a 32-bit integer ("+optSchemaVersion+")")
		}
	}

	// Topic.
	if cfg.fixedTopic != "" {
		rec.Topic = cfg.fixedTopic
	} else {
		if lay.route < 0 {
			return 0, rowErr(row, rec, cfg.routeCol, ErrMissingColumn, "the routing column ("+optRouteByField+") is not in the row")
		}
		rv := row.Values[lay.route]
		if rv == nil {
			return 0, rowErr(row, rec, cfg.routeCol, ErrNullRoutingValue, "")
		}
		topic, err := r.topicFor(row, rec, rv)
		if err != nil {
			return 0, err
		}
		rec.Topic = topic
	}

	// Key. A NULL key column gives no key, as in Debezium 3.6; without the
	// column (where Debezium's task stops) there is none either.
	if lay.key >= 0 {
		k, err := r.convert(row, rec, lay.key, cfg.keyConv)
		if err != nil {
			return 0, err
		}
		rec.Key = k
	}

	// Timestamp.
	rec.Timestamp = now
	if cfg.tsCol != "" {
		if lay.ts < 0 {
			return 0, rowErr(row, rec, cfg.tsCol, ErrMissingColumn, "the timestamp column ("+optEventTimestamp+") is not in the row")
		}
		if v := row.Values[lay.ts]; v != nil {
			t, ok := columnTime(typeOf(row, lay.ts), v)
			if !ok {
				return 0, rowErr(row, rec, cfg.tsCol, ErrBadTimestamp, strconv.Quote(string(v))+" is neither an ISO timestamp nor epoch milliseconds")
			}
			if t.Before(kafkaEpoch) {
				// The producer cannot encode it (sarama: "invalid
				// timestamp", which a relay took for a failure to retry,
				// restarting without end) and Kafka refuses it; so does
				// Debezium's task (InvalidRecordException).
				return 0, rowErr(row, rec, cfg.tsCol, ErrBadTimestamp, strconv.Quote(string(v))+" is before 1970-01-01T00:00:00Z, where Kafka's record timestamps start")
			}
			rec.Timestamp = t
		}
	}

	// Headers and partition, in Debezium's order: its extended headers,
	// the tracing context, id, the additional fields.
	if !row.Message {
		rec.Headers = append(rec.Headers, cfg.contextHeaders...)
	}
	badTrace := false
	if lay.span >= 0 && row.Values[lay.span] != nil {
		tp, ts := spanContext(row.Values[lay.span])
		if validTraceparent(tp) {
			rec.Headers = append(rec.Headers, Header{Key: "traceparent", Value: r.stringHeader(tp)})
			if ts != nil {
				rec.Headers = append(rec.Headers, Header{Key: "tracestate", Value: r.stringHeader(ts)})
			}
		} else {
			badTrace = true
		}
	}
	id, err := r.headerValue(row, rec, lay.id)
	if err != nil {
		return 0, err
	}
	rec.Headers = append(rec.Headers, Header{Key: "id", Value: id})
	for i, f := range cfg.extras {
		idx := lay.extras[i]
		if idx < 0 {
			if cfg.missingIgnore {
				continue
			}
			return 0, rowErr(row, rec, f.column, ErrMissingColumn, "the additional field ("+optAdditionalPlacement+") is not in the row")
		}
		switch f.place {
		case placeHeader:
			v, err := r.headerValue(row, rec, idx)
			if err != nil {
				return 0, err
			}
			rec.Headers = append(rec.Headers, Header{Key: f.name, Value: v})
		case placePartition:
			v := row.Values[idx]
			if v == nil {
				continue // NULL: the partitioner chooses
			}
			p, ok := parsePartition(v)
			if !ok {
				return 0, rowErr(row, rec, f.column, ErrBadPartition, strconv.Quote(string(v))+" is not an integer in [0, 2147483647]")
			}
			rec.Partition = p
		}
	}
	if cfg.traceCol != "" {
		switch {
		case lay.trace < 0:
			if !cfg.missingIgnore {
				return 0, rowErr(row, rec, cfg.traceCol, ErrMissingColumn, "the trace column ("+optEventTrace+") is not in the row")
			}
		case row.Values[lay.trace] != nil:
			v, err := raw(row, rec, lay.trace)
			if err != nil {
				return 0, err
			}
			if validTraceparent(v) {
				rec.Headers = append(rec.Headers, Header{Key: "traceparent", Value: v})
			} else {
				badTrace = true
			}
		}
	}

	// Value.
	pv := row.Values[lay.payload]
	poid := typeOf(row, lay.payload)
	var expandReason string
	switch {
	case cfg.tombstone && emptyPayload(poid, pv):
		rec.Value = nil
	default:
		var expanded []byte
		switch {
		case row.Message && poid == OIDConnectJSON && pv != nil:
			// A struct or array Debezium decoded: JsonConverter writes it
			// as JSON, which pv already is.
			if cfg.valueConv != convJSON {
				return 0, rowErr(row, rec, cfg.payloadCol, ErrBadValue, "the payload is a JSON object or array decoded as Debezium's DecodeLogicalDecodingMessageContent does, which pgoutbox writes under value.converter=JsonConverter only")
			}
			expanded = pv
		case cfg.expand && pv != nil:
			expanded, expandReason = r.expand(poid, pv)
			if expandReason == reasonExpandPoison {
				return 0, rowErr(row, rec, cfg.payloadCol, ErrNotExpandable, reasonExpandPoison)
			}
		}
		switch {
		case cfg.hasEnvelope:
			if rec.Value, err = r.envelope(row, rec, lay, expanded); err != nil {
				return 0, err
			}
		case expanded != nil:
			if bytes.Equal(expanded, pv) {
				rec.Value = pv
			} else {
				rec.Value = bytes.Clone(expanded)
			}
		default:
			if rec.Value, err = r.convert(row, rec, lay.payload, cfg.valueConv); err != nil {
				return 0, err
			}
			if rec.Value != nil && len(rec.Value) == 0 {
				rec.Value = emptyValue
			}
			if rec.Value == nil && cfg.valueConv == convRaw {
				rec.Value = emptyValue // NULL payload without tombstone
			}
		}
	}
	if rec.Reason = warnReason(expandReason, badTrace); rec.Reason != "" {
		return EmitWarn, nil
	}
	return Emit, nil
}

// connectJSONElsewhere refuses a row whose column of type OIDConnectJSON
// (a JSON object or array of a decoded message) the options use anywhere
// but as the payload: pgoutbox does not write Debezium's text of a struct
// (Struct{...}) into a key, header or routing value.
func connectJSONElsewhere(row *Row, rec *Record, lay *layout) error {
	if !row.Message {
		return nil // only a message's row has such columns
	}
	check := func(i int, what string) error {
		if i >= 0 && i != lay.payload && typeOf(row, i) == OIDConnectJSON && row.Values[i] != nil {
			return rowErr(row, rec, row.Names[i], ErrBadValue, "is a JSON object or array (a message decoded as Debezium's DecodeLogicalDecodingMessageContent does), which pgoutbox writes only as the payload, not as the "+what)
		}
		return nil
	}
	for _, c := range []struct {
		i    int
		what string
	}{{lay.id, "event id"}, {lay.key, "key"}, {lay.route, "routing value"}, {lay.ts, "timestamp"}, {lay.version, "schema version"}, {lay.span, "tracing span context"}, {lay.trace, "trace context"}} {
		if err := check(c.i, c.what); err != nil {
			return err
		}
	}
	for _, i := range lay.extras {
		if err := check(i, "additional field"); err != nil {
			return err
		}
	}
	return nil
}

// emptyPayload reports whether a payload counts as empty for
// route.tombstone.on.empty.payload: NULL, or, as Debezium tests
// payload.toString().trim().isEmpty(), text of nothing but characters up to
// U+0020 (Java's String.trim). An empty bytea counts too.
func emptyPayload(oid uint32, v []byte) bool {
	if oid == oidBytea {
		return len(v) == 0 || string(v) == `\x`
	}
	for _, c := range v {
		if c > ' ' {
			return false
		}
	}
	return true
}

// convert returns column i's value as record key, value or header bytes
// for conv: raw (aliased text, or decoded bytea), StringConverter's or
// SimpleHeaderConverter's text, or JsonConverter's JSON (newly allocated;
// NULL is the JSON null).
func (r *Router) convert(row *Row, rec *Record, i int, conv converter) ([]byte, error) {
	switch conv {
	case convString, convHeader:
		text := connectText
		if conv == convHeader {
			text = headerText
		}
		b, err := text(typeOf(row, i), modOf(row, i), row.Values[i])
		if err != nil {
			return nil, rowErr(row, rec, row.Names[i], ErrBadValue, err.Error())
		}
		return b, nil
	case convJSON:
		v := row.Values[i]
		if v == nil {
			return nullJSON, nil
		}
		b, err := appendConnectJSON(make([]byte, 0, len(v)+2+escapeGrowth(v)), typeOf(row, i), modOf(row, i), v)
		if err != nil {
			return nil, rowErr(row, rec, row.Names[i], ErrBadValue, err.Error())
		}
		return b, nil
	}
	return raw(row, rec, i)
}

// expand applies table.expand.json.payload to payload v of type oid. It
// returns the expanded JSON, in Router scratch memory valid until the next
// call, or nil and the reason the payload stays as it is.
func (r *Router) expand(oid uint32, v []byte) ([]byte, string) {
	r.json.shrink()
	if cap(r.expanded) > maxScratch {
		r.expanded = nil
	}
	if !stringType(oid) {
		return nil, reasonExpandNotString
	}
	// As Debezium: the text itself must start with { or [ (no white space
	// first).
	if len(v) == 0 || v[0] != '{' && v[0] != '[' {
		return nil, reasonExpandNotJSON
	}
	defer func() { r.json.src = nil }() // keep no reference to the row
	if !r.json.parse(v) {
		return nil, reasonExpandBadJSON
	}
	if r.cfg.valueConv == convJSON {
		out, res := r.json.appendConnect(r.expanded[:0])
		r.expanded = out
		switch res {
		case connectNoSchema:
			return nil, reasonExpandNoConnect
		case connectFails:
			return nil, reasonExpandPoison
		}
		return out, ""
	}
	r.expanded = r.json.appendRaw(r.expanded[:0], 0)
	return r.expanded, ""
}

// topicFor maps a routing value to its topic, through the cache.
func (r *Router) topicFor(row *Row, rec *Record, rv []byte) (string, error) {
	key := rv
	if r.cfg.route.usesTable {
		// The topic depends on the table too: key the cache on both.
		r.topicKey = append(append(append(r.topicKey[:0], row.Table...), 0), rv...)
		key = r.topicKey
	}
	if topic, ok := r.topics[string(key)]; ok {
		return topic, nil
	}
	topic := r.cfg.route.topic(string(rv), row.Table)
	if !validTopic(topic) {
		return "", rowErr(row, rec, r.cfg.routeCol, ErrInvalidTopic,
			strconv.Quote(topic)+" from routing value "+strconv.Quote(string(rv))+" (a topic is 1 to 249 characters of [a-zA-Z0-9._-])")
	}
	if len(rv) <= maxCachedRoutingValue {
		if len(r.topics) >= maxTopics {
			clear(r.topics)
		}
		r.topics[string(key)] = topic
	}
	return topic, nil
}

// headerValue returns column i's value as header bytes for
// header.converter.
func (r *Router) headerValue(row *Row, rec *Record, i int) ([]byte, error) {
	return r.convert(row, rec, i, r.cfg.headerConv)
}

// stringHeader returns a string header value for header.converter.
func (r *Router) stringHeader(v []byte) []byte {
	if r.cfg.headerConv == convJSON {
		return appendJacksonString(nil, v)
	}
	return v
}

// raw returns column i's value as record bytes: the text as it is (aliased),
// or for bytea the decoded bytes.
func raw(row *Row, rec *Record, i int) ([]byte, error) {
	v := row.Values[i]
	if v == nil || typeOf(row, i) != oidBytea {
		return v, nil
	}
	b, err := decodeBytea(v)
	if err != nil {
		return nil, rowErr(row, rec, row.Names[i], ErrBadValue, err.Error())
	}
	return b, nil
}

// envelope builds the JSON object {"payload": <payload>, "<name>": <value>,
// ...} from the payload (or its expansion, when not nil) and the
// envelope-placed columns, in configuration order. Values are converted as
// pgoutbox's raw envelope or, with value.converter=JsonConverter, as Kafka
// Connect writes them.
func (r *Router) envelope(row *Row, rec *Record, lay *layout, expanded []byte) ([]byte, error) {
	size := 16 + len(row.Values[lay.payload]) + len(expanded)
	if expanded == nil {
		size += escapeGrowth(row.Values[lay.payload])
	}
	for i, f := range r.cfg.extras {
		if f.place == placeEnvelope && lay.extras[i] >= 0 {
			size += 8 + len(f.jacksonKey) + len(row.Values[lay.extras[i]])
		}
	}
	appendValue := func(dst []byte, row *Row, i int) ([]byte, error) {
		return appendJSONValue(dst, typeOf(row, i), row.Values[i])
	}
	if r.cfg.valueConv == convJSON {
		appendValue = func(dst []byte, row *Row, i int) ([]byte, error) {
			return appendConnectJSON(dst, typeOf(row, i), modOf(row, i), row.Values[i])
		}
	}
	b := make([]byte, 0, size)
	b = append(b, `{"payload":`...)
	if expanded != nil {
		b = append(b, expanded...)
	} else {
		var err error
		if b, err = appendValue(b, row, lay.payload); err != nil {
			return nil, rowErr(row, rec, r.cfg.payloadCol, ErrBadValue, err.Error())
		}
	}
	for i, f := range r.cfg.extras {
		idx := lay.extras[i]
		if f.place != placeEnvelope || idx < 0 {
			continue
		}
		b = append(b, ',')
		if r.cfg.valueConv == convJSON {
			b = append(b, f.jacksonKey...)
		} else {
			b = append(b, f.jsonKey...)
		}
		var err error
		if b, err = appendValue(b, row, idx); err != nil {
			return nil, rowErr(row, rec, f.column, ErrBadValue, err.Error())
		}
	}
	return append(b, '}'), nil
}

// kafkaEpoch is the earliest record timestamp Kafka takes.
var kafkaEpoch = time.UnixMilli(0)

// columnTime converts a timestamp column: integers are epoch milliseconds
// (as Debezium reads an INT64 timestamp field); timestamp and timestamptz
// are parsed from ISO text; other types are tried as both.
func columnTime(oid uint32, v []byte) (time.Time, bool) {
	switch oid {
	case oidInt2, oidInt4, oidInt8:
		return parseEpochMillis(v)
	case oidTimestamp, oidTimestampTZ:
		return parseTimestamp(v)
	}
	if t, ok := parseEpochMillis(v); ok {
		return t, true
	}
	return parseTimestamp(v)
}

func typeOf(row *Row, i int) uint32 {
	if i < len(row.Types) {
		return row.Types[i]
	}
	return 0
}

// modOf returns column i's type modifier, -1 when there is none.
func modOf(row *Row, i int) int32 {
	if i < len(row.Mods) {
		return row.Mods[i]
	}
	return -1
}

// rowErr builds a *RowError, copying the event id out of the row.
func rowErr(row *Row, rec *Record, column string, class error, reason string) error {
	return &RowError{Table: row.Table, Column: column, EventID: string(rec.EventID), Reason: reason, Err: class}
}

// layoutFor returns the column positions for names, from the cache when an
// equal column list was seen before. Comparing the lists (rather than
// trusting a slice pointer) keeps the cache right even if a caller reuses a
// Names backing array for another table; when the caller passes the same
// strings each time, each comparison is a length and pointer check.
func (r *Router) layoutFor(names []string) *layout {
	if l := r.last; l != nil && slices.Equal(l.names, names) {
		return l
	}
	for _, l := range r.layouts {
		if slices.Equal(l.names, names) {
			r.last = l
			return l
		}
	}
	cfg := r.cfg
	l := &layout{
		names:   slices.Clone(names),
		id:      slices.Index(names, cfg.idCol),
		key:     slices.Index(names, cfg.keyCol),
		payload: slices.Index(names, cfg.payloadCol),
		route:   slices.Index(names, cfg.routeCol),
		ts:      -1,
		trace:   -1,
		version: -1,
		span:    -1,
		extras:  make([]int, len(cfg.extras)),
	}
	if cfg.tsCol != "" {
		l.ts = slices.Index(names, cfg.tsCol)
	}
	if cfg.traceCol != "" {
		l.trace = slices.Index(names, cfg.traceCol)
	}
	if cfg.versionCol != "" {
		l.version = slices.Index(names, cfg.versionCol)
	}
	if cfg.spanCol != "" {
		l.span = slices.Index(names, cfg.spanCol)
	}
	for i, f := range cfg.extras {
		l.extras[i] = slices.Index(names, f.column)
	}
	if len(r.layouts) >= maxLayouts {
		clear(r.layouts)
		r.layouts = r.layouts[:0]
	}
	r.layouts = append(r.layouts, l)
	r.last = l
	return l
}
