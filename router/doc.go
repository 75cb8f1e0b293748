// Package router maps a decoded outbox row to a Kafka record, the way
// Debezium's Outbox Event Router (io.debezium.transforms.outbox.EventRouter)
// does, so that users migrating from Kafka Connect keep their options.
//
// The package is pure: no I/O, no clock (the processing time is passed to
// Route), no logging (drops come back as an Action with a reason for the
// caller to log), no goroutines, standard library only.
//
// # Use
//
//	opts := router.DefaultOptions() // then overwrite from YAML, or opts.Set(name, value)
//	r, err := router.New(opts)       // validates; every bad option is reported
//	...
//	var rec router.Record            // reuse it: its Headers array is reused
//	action, err := r.Route(row, now, &rec)
//	switch {
//	case err != nil:                 // *RowError: stop the relay; do not skip the row
//	case action == router.Emit:      // produce rec
//	case action == router.EmitWarn:  // log rec.Reason at warn level, then produce rec
//	case action == router.DropWarn:  // log rec.Reason at warn level, with row.Table and rec.EventID
//	case action == router.DropError: // log rec.Reason at error level
//	}                                // router.Drop: nothing to do
//
// Action.Emits reports whether a record is to be produced (Emit or
// EmitWarn); a caller that treats actions it does not know as drops must
// use it, or it loses the records of EmitWarn.
//
// Several outbox tables with options of their own are routed by a Set
// (see NewSet), which picks a Router by Row.Table. A Router or a Set is
// not safe for concurrent use; give each goroutine its own.
//
// # The default outbox table
//
//	id             uuid          event id → header "id" (consumers de-duplicate on it)
//	aggregatetype  varchar(255)  routing value → topic "outbox.event.<aggregatetype>"
//	aggregateid    varchar(255)  record key (one aggregate stays on one partition, in order)
//	type           varchar(255)  event type; emitted only as an additional field
//	payload        jsonb         record value
//
// With the defaults, the row id=406c07f3-…, aggregatetype=Order,
// aggregateid=1, type=OrderCreated, payload={"total":12} becomes a record on
// topic outbox.event.Order (no case change) with key 1, value {"total":12}
// and header id=406c07f3-…. Applications may insert and delete the row in
// one transaction so the table stays empty; the insert is still relayed.
//
// # Options
//
// The option names are Debezium's, and Kafka Connect's for the converters;
// Options carries them as YAML keys and Options.Set accepts them by name
// with string values, as in a Kafka Connect connector configuration
// (transforms.<name>.<option> for the router's, key.converter and
// value.converter at the top level). pgoutbox's own options, which
// Debezium does not have, and the converter options, which are Kafka
// Connect's worker and connector options, are described after Debezium's.
//
// table.field.event.id (default "id"): the column copied to the header "id".
// A row without the column is an error, and so is a NULL id
// (ErrNullEventID): consumers de-duplicate on the id, so an event without
// one is poison for the relay's poison.policy. (Debezium 3.6.1 delivers it
// with an "id" header whose value is null; the conformance suite checks.)
//
// table.field.event.key (default "aggregateid"): the column whose text is
// the record key (with the default key.converter=raw; see key.converter
// for the Kafka Connect encodings). A NULL value, or a row without the column, gives a record
// without a key (the producer's partitioner then spreads such records); the
// relay refuses at start an outbox table that lacks the column.
// Debezium 3.6 gives a NULL value a null key too, and stops its task on a
// row without the column (Struct.get of an unknown field).
//
// table.field.event.type (default "type"): accepted for compatibility; it
// has no effect by itself. To emit the event type, name its column in
// table.fields.additional.placement, e.g. "type:header:eventType".
//
// table.field.event.payload (default "payload"): the column whose value is
// the record value. With the default value.converter=raw the value is the
// column's raw text bytes (a jsonb payload is its JSON text, byte for byte
// as PostgreSQL sends it, e.g. {"total": 12}; a bytea payload its decoded
// bytes). A row without the column is an error. For NULL and empty
// payloads see route.tombstone.on.empty.payload; for other encodings,
// value.converter.
//
// table.field.event.timestamp (default none): the column used as the record
// timestamp; without it, or when its value is NULL, the record timestamp is
// the processing time passed to Route (as Debezium uses the time the event
// is processed). Integer columns hold milliseconds since the Unix epoch;
// timestamp and timestamptz columns are read from PostgreSQL's ISO output
// (DateStyle ISO, the server default), timestamp without time zone as UTC;
// columns of other types may hold either form. A row without the column, or
// a value in neither form (infinity, BC dates, other DateStyles), is an
// error.
//
// table.fields.additional.placement (default none): a comma-separated list
// of column:placement[:alias] entries that copy more columns into the
// record; the alias defaults to the column name. Placements:
//
//   - header: a header named alias with the column's value as
//     header.converter writes it (raw: its text, bytea decoded to its
//     bytes; NULL gives a header with a null value). Headers follow "id"
//     in the configured order.
//   - envelope: the record value becomes the JSON object
//     {"payload": <payload>, "<alias>": <value>, ...}, fields in the
//     configured order. With value.converter=raw, values are converted by
//     type: json and jsonb as they are, booleans as true/false, integer,
//     float and numeric columns as JSON numbers (NaN and Infinity as
//     strings), bytea as a base64 string (as Kafka Connect's JsonConverter
//     writes bytes), NULL as null, anything else (text, uuid, timestamps,
//     …) as a JSON string of its text. A text payload therefore becomes a
//     JSON string, as in Debezium without table.expand.json.payload. With
//     value.converter=JsonConverter they are converted as described under
//     Kafka Connect encodings. The alias "payload" and repeated aliases are
//     rejected.
//   - partition: the column's value is the record's explicit partition. It
//     must be a non-negative integer that fits an int32 (any column type
//     whose text is such a number); NULL lets the partitioner choose. At
//     most one column may have this placement.
//
// table.field.additional.missing (default "error"): what happens when a row
// lacks a column named in table.fields.additional.placement: "error" fails
// the row with ErrMissingColumn, "ignore" leaves the field out.
//
// table.fields.additional.error.on.missing (default true): the older
// boolean form of the same; false means "ignore". Because
// table.field.additional.missing cannot be told apart from its default, the
// field is ignored when either option asks for it; the explicit
// contradiction table.field.additional.missing=ignore with
// table.fields.additional.error.on.missing=true is rejected.
//
// table.op.invalid.behavior (default "warn"): what an UPDATE on the outbox
// table does (outbox rows are meant to be inserted only): "warn" drops it
// with DropWarn, "error" drops it with DropError (Record.Reason says why;
// the caller logs it at that level), "fatal" fails with ErrInvalidOperation
// so the relay stops.
//
// table.expand.json.payload (default false): with true, a payload of a
// string type (text, varchar, json, jsonb, ...: every type Debezium reads
// as a string, so not bytea, boolean, numbers or arrays) whose text starts
// with { or [ (the first character, as Debezium checks: a payload with
// white space first stays as it is) is parsed as JSON and emitted as
// JSON. With value.converter=raw (and in a raw envelope) the expanded
// payload is the document in compact form: no whitespace, strings
// re-escaped as Jackson writes them (\u00e9 becomes é, \/ becomes /),
// numbers as written, a repeated key keeping its first position and its
// last value (as Jackson reads it), and null object members dropped or kept
// per table.json.payload.null.behavior. An already compact payload is
// emitted as it is, without a copy. With value.converter=JsonConverter the
// expanded payload is written as Kafka Connect writes the Struct Debezium
// builds from the document; see "Kafka Connect encodings" below.
//
// A payload that cannot be expanded is emitted unchanged with Action
// EmitWarn and Record.Reason saying why, as Debezium logs "JSON expansion
// failed" and emits it unchanged: a payload of a type that is not a string,
// text that does not start with { or [ (an empty text, a jsonb scalar such
// as "hello", white space first), text that is not valid JSON as Jackson
// parses it, and, with JsonConverter, JSON for which Debezium infers no
// Connect schema. With JsonConverter, a payload for which Debezium infers
// a schema that its value then does not fit (a top-level array, an integer
// beyond 64 bits, array elements whose members conflict) fails with
// ErrNotExpandable: Debezium's converter fails on that record, its task
// stops, and with errors.tolerance=all the record is skipped; pgoutbox
// makes the row poison, so its poison.policy decides. A
// NULL payload is left alone without a warning (Debezium warns that it is
// "not a string"), and so is a payload that route.tombstone.on.empty.payload
// turns into a tombstone.
//
// The parser follows Jackson's ObjectMapper defaults: no comments, trailing
// commas, single quotes, leading zeros, NaN or unescaped control characters;
// at most 1000 levels of nesting and 1000 characters per number. With
// JsonConverter it also does as Jackson's readTree does beyond JSON:
// content after the root value is ignored ({"a": 1} trailing expands to
// {"a":1}) and an unpaired UTF-16 surrogate escape is kept and written
// escaped (\uD83D). With value.converter=raw, pgoutbox's own rendering,
// both make the payload invalid: nothing is dropped silently, and a raw
// value stays valid UTF-8.
//
// table.json.payload.null.behavior (default "ignore"): what expansion does
// with object members whose value is null. "ignore" drops them, at every
// depth, including in objects inside arrays, as Debezium's schema
// inference gives a null no schema and leaves the field out; an object
// whose members are all null stays as {}. Null array elements are kept
// (dropping them would move the elements after them; Debezium keeps them
// too). "optional_bytes" keeps null members (Debezium gives them an
// optional bytes schema, which Kafka Connect's JsonConverter writes as
// null).
//
// route.by.field (default "aggregatetype"): the column whose text is the
// routing value. A row without the column, or with a NULL value, is an
// error (ErrMissingColumn, ErrNullRoutingValue), unless route.topic is set.
//
// route.topic.regex (default "(?<routedByValue>.*)") and
// route.topic.replacement (default "outbox.event.${routedByValue}"): the
// topic is computed as Kafka Connect's RegexRouter computes it. If the
// regex matches the whole routing value (Java's Matcher.matches), the topic
// is the value with its first match replaced by the replacement (Java's
// Matcher.replaceFirst: usually the whole value, but a lazy or alternation
// regex can prefer a shorter first match, and the rest of the value is then
// kept). Otherwise the routing value itself is the topic. The regex is
// Java-style: named groups (?<name>…) are accepted (names are a letter then
// letters or digits); it runs on Go's RE2 engine, so lookaround,
// backreferences, possessive quantifiers and atomic groups are rejected by
// Validate, and "." excludes only \n (Java also excludes \r, \u0085,
// \u2028 and \u2029, none of which can be in a topic name). The
// replacement follows Java's rules: ${name} is a named group, $n a
// numbered group ($0 the whole match; further digits are taken while the
// number stays a valid group, so with one group "$10" is group 1 then "0"),
// \x is a literal x (write \$ for a dollar), a group that did not
// participate adds nothing, and any other $ is an error. References to
// groups the regex does not have are rejected by Validate, not on the
// first matching row as in Java. So is a replacement whose literal text
// holds a character no topic may hold, or which, having no group
// reference, is not itself a legal topic (the rule of route.topic). The
// topic must be a legal Kafka topic name
// (1 to 249 characters of [a-zA-Z0-9._-], not "." or ".."), or the row
// fails with ErrInvalidTopic. Topics are cached per routing value (up to
// 4096 values of at most 512 bytes; the cache is emptied when full), so the
// regex runs once per distinct value.
//
// route.tombstone.on.empty.payload (default false): with true, a NULL or
// empty payload gives a tombstone: a record with a nil Value, keeping its
// key, headers and partition. Empty is Debezium's
// payload.toString().trim().isEmpty(): text of nothing but characters up to
// U+0020 (spaces, tabs, line breaks, other control characters); pgoutbox
// also counts an empty bytea. With false such a payload gives, with
// value.converter=raw, a record with an empty, non-nil Value (for NULL and
// empty text) or the blank text, which Kafka stores as a value, not a
// tombstone; with an envelope it is {"payload":null,…} or
// {"payload":"",…}. With the Kafka Connect converters a NULL payload is
// what they write for a null (see below): JsonConverter the four bytes
// null, StringConverter a null value, i.e. a tombstone.
//
// # pgoutbox's own options and the converters
//
// table.field.event.trace (default none): a column holding a W3C Trace
// Context traceparent, 00-<32 hex trace id>-<16 hex parent id>-<2 hex
// flags> in lower case (ids not all zeros; versions 01 to fe may append
// fields after a dash, as the specification asks parsers to accept). A
// valid value becomes the header "traceparent", after the other headers, so
// consumers can continue the producer's trace. A NULL value gives no
// header. An invalid value gives no header and Action EmitWarn with
// Record.Reason saying so: the event still goes out. A row without the
// column follows table.field.additional.missing (an error by default).
// For Debezium's tracing option see tracing.span.context.field.
//
// table.field.event.schema.version (default none): Debezium's column for
// the version of the value schema. Schemaless converters write no schema,
// so no byte changes; the column is checked as Debezium reads it: a row
// without it fails with ErrMissingColumn, a value that is not a 32-bit
// integer with ErrBadValue (NULL is allowed).
//
// tracing.span.context.field (default none): Debezium's column holding the
// application's trace context as java.util.Properties text
// (traceparent=00-…\ntracestate=…). A valid traceparent becomes the header
// "traceparent", and a tracestate the header "tracestate", before "id" (where
// Debezium's OpenTelemetry propagator writes them). Debezium, when
// OpenTelemetry is on its class path, writes the context of a span of its
// own, a child of the application's; pgoutbox starts no spans and forwards
// the application's context, so consumers continue the application's trace.
// Without OpenTelemetry (the plugin archive as shipped) Debezium writes no
// tracing headers at all. A row without the column or with NULL gives none;
// an invalid traceparent gives none and EmitWarn.
//
// extended.headers.enabled (default false), extended.headers.logical.name
// and extended.headers.run.id: Debezium 3's context headers, first on every
// record: __debezium.context.connectorLogicalName (the logical name,
// Debezium's topic.prefix), __debezium.context.taskId (0),
// __debezium.context.connectorName (postgresql) and
// __debezium.context.runId (the run id, a UUIDv7 that Debezium makes anew
// at each task start and pgoutbox's relay at each start of the process
// when the option is empty). A Kafka Connect connector configuration turns
// them on unless it says extended.headers.enabled=false, as in Debezium.
//
// header.converter (default "raw"), with header.converter.schemas.enable:
// the encoding of header values. "raw" writes the column's text (bytea
// decoded). org.apache.kafka.connect.storage.SimpleHeaderConverter, Kafka
// Connect's default, writes Java's text of Debezium's value (booleans as
// true or false, floats in Java's form, bytea as base64, other types as
// their text); JsonConverter (schemas.enable=false) writes JSON as for
// values ("406c…" quoted, NULL as null). The Kafka Connect import uses
// SimpleHeaderConverter unless the connector names another.
//
// route.topic (default none): a fixed topic for every row, instead of the
// topic computed from route.by.field, route.topic.regex and
// route.topic.replacement; the routing column is then not needed. It must
// be a legal Kafka topic name, and a regex or replacement other than the
// defaults beside it is rejected (they would never apply). Useful in a Set for a table whose events all
// belong to one topic.
//
// ${table} in route.topic.replacement: when the regex has no group named
// table, ${table} stands for the row's table, schema-qualified as
// Row.Table ("public.outbox"), so that several tables routed with one
// Options get topics of their own, e.g. "${table}.${routedByValue}". (Java
// would reject the replacement, having no such group.)
//
// key.converter and value.converter (default "raw"), with
// key.converter.schemas.enable and value.converter.schemas.enable: the
// encoding of the record key and value. "raw" is pgoutbox's: the column's
// own bytes. The Kafka Connect converters, named by class
// (org.apache.kafka.connect.json.JsonConverter,
// org.apache.kafka.connect.storage.StringConverter) or simple class name
// (JsonConverter, StringConverter), reproduce byte for byte what a Kafka
// Connect worker with that converter writes for Debezium's record, for
// users who migrate and whose consumers expect those bytes. JsonConverter
// requires schemas.enable=false, given explicitly: Kafka Connect's default
// is true, which wraps every value in a schema envelope pgoutbox cannot
// write (it has no Connect schemas), so true or unset is rejected. Other
// converters (Avro, Protobuf, ByteArrayConverter, ...) are rejected.
// value.converter=StringConverter cannot be combined with envelope
// placements or table.expand.json.payload: Kafka Connect would write Java's
// Struct.toString() (Struct{total=12}).
//
// # Kafka Connect encodings
//
// Debezium's PostgreSQL connector makes a Connect value of each column:
// text-like types (text, varchar, char, uuid, json, jsonb, xml, ...) a
// string, boolean a boolean, int2 and int4 an int16 and int32, int8 and
// oid an int64, float4 and float8 a float and a double, bytea bytes.
// JsonConverter (with schemas.enable=false) writes that value with
// Jackson, as compact JSON:
//
//   - a string as a JSON string literal, so a jsonb payload that is not
//     expanded becomes "{\"total\": 12}" (Debezium's json type is a
//     string). Jackson escapes " and \ with a backslash, \b \t \n \f \r
//     with their short escapes and other control characters (below U+0020)
//     as \u00XX with upper-case hex; it does not escape /, DEL, U+2028 or
//     U+2029, and writes other characters as UTF-8, except those outside
//     the Basic Multilingual Plane (emoji), which are two UTF-16 code units
//     in Java and which Jackson writes as an escaped surrogate pair
//     (\uD83D\uDE00), in keys too (so a JSON key's murmur2 partition
//     follows those bytes).
//   - integers as JSON numbers; booleans as true or false.
//   - floats as Java's Float.toString or Double.toString print them
//     (1.5e+20 becomes 1.5E20, 12.50 becomes 12.5, 100 becomes 100.0; NaN
//     and the infinities as the strings "NaN", "Infinity", "-Infinity"),
//     following the exact algorithm of Java 19 and later; Java 17's
//     older algorithm prints a few values with extra digits.
//   - bytea as a base64 string (standard alphabet, padded).
//   - NULL as null. A NULL key or payload is the four bytes null, not a
//     Kafka null: Debezium passes the column's optional schema with the null
//     value, and JsonConverter writes null bytes unless both schema and value
//     are null. A row without the key column gets no key (Debezium would
//     fail), and route.tombstone.on.empty.payload still gives a real
//     tombstone (Debezium then passes no schema).
//   - an envelope as a JSON object, its fields converted the same way.
//   - an expanded payload as the Struct Debezium's JsonSchemaData infers
//     from the document: object members in document order; null members
//     dropped ("ignore") or written as null ("optional_bytes"); members
//     whose value is an empty array dropped (an empty array has no schema);
//     integers as int or long, other numbers as doubles in Java's form
//     (12.50 becomes 12.5, 1e2 becomes 100.0); the elements of an array of
//     objects sharing one struct with the fields of all of them in order of
//     first appearance, so an element lacking a field gets it as null.
//     Debezium infers no schema, and pgoutbox emits the payload as a
//     string literal with EmitWarn, for an array mixing types or number
//     classes (1 and 2.5, 1 and 3000000000), an array of only nulls (with
//     "ignore") or whose first non-null element is an empty array, an empty
//     member name, and a top-level []. A top-level array, an integer
//     beyond 64 bits and array elements giving one member conflicting
//     types fail with ErrNotExpandable (see table.expand.json.payload). For
//     arrays of objects with different members Debezium's field order
//     follows hash codes that vary between JVMs; pgoutbox uses first
//     appearance (and, as Debezium, merges only the top-level members of
//     the elements: the first element's nested object schema wins).
//     Strings are written as Jackson writes them, characters outside the
//     Basic Multilingual Plane as escaped surrogate pairs.
//
// StringConverter writes Java's toString() of the Connect value as UTF-8:
// text as it is, booleans as true and false, floats in Java's form, and a
// NULL key or payload as a null key or value (so a NULL payload is a
// tombstone). For bytea, whose Java toString() is an object address,
// pgoutbox writes the decoded bytes.
//
// Headers are encoded by header.converter, not by key.converter or
// value.converter, as in Kafka Connect. For the usual header columns (uuid
// id, varchar type) raw and SimpleHeaderConverter give the same bytes.
//
// Through the Kafka Connect converters (StringConverter, JsonConverter,
// SimpleHeaderConverter), numeric, date, time, timestamp, timestamptz and
// interval columns are the Connect values Debezium makes of them at its
// default handling modes (decimal.handling.mode=precise,
// time.precision.mode=adaptive, interval.handling.mode=numeric; the
// connector import refuses other values): a numeric(p,s) is a Decimal
// (JsonConverter: the base64 of its unscaled two's-complement bytes;
// StringConverter and SimpleHeaderConverter: Java's BigDecimal.toString,
// 1.000E-7 for 0.0000001000), a numeric without a precision a
// VariableScaleDecimal ({"scale":1,"value":"ew=="}; under StringConverter,
// whose Java toString holds an object address, an error), a date the days
// since 1970-01-01, a time(p) or timestamp(p) milliseconds for p <= 3 and
// microseconds otherwise (since midnight or the epoch), a timestamptz(p)
// the instant in UTC as ISO-8601 text with exactly p digits of fraction
// (6 without a precision), an interval its microseconds with a month of
// 365.25/12 days. money, timetz, bit, arrays, name, point, the other
// geometric types and every built-in type outside the suite's list (see
// builtinReproduced), and the user types other than enums, citext, ltree
// and domains (NotReproducedType), whose Connect values pgoutbox does not
// reproduce, are an error (a poison row). A domain is its base
// type with the domain's precision (Row.Types names the base type: the
// relay resolves the domains the stream names, and a query's row
// description names the base type already). pkg/conformance holds these
// against the real Debezium.
//
// # Column types
//
// Values arrive in PostgreSQL's text format. By encoding:
//
//	type                   raw                      StringConverter   JsonConverter      raw envelope
//	text, varchar, char    text                     text              "text"             "text"
//	uuid                   canonical text           text              "text"             "text"
//	json, jsonb            JSON text as sent        JSON text         "JSON text"        JSON embedded
//	bytea                  decoded bytes            decoded bytes     "base64"           "base64"
//	int2, int4, int8, oid  decimal text             decimal text      number             number
//	float4, float8         PostgreSQL text          Java text         Java number        number
//	numeric                PostgreSQL text          Java BigDecimal   "base64" / struct  number
//	boolean                t or f                   true or false     true or false      true or false
//	date, time, timestamp  PostgreSQL ISO text      epoch number      epoch number       "text"
//	timestamptz            PostgreSQL ISO text      ISO-8601 UTC      "ISO-8601 UTC"     "text"
//	interval               PostgreSQL text          microseconds      microseconds       "text"
//	money, timetz, bit,    PostgreSQL text          error             error              "text"
//	arrays, name, point,
//	geometric, other types
//	text-like (enum, inet, PostgreSQL text          text              "text"             "text"
//	citext, ranges, xml...)
//	NULL                   no key, empty value      Kafka null        null (4 bytes)     null
//
// (In the JSON encodings NaN and infinite floats and numerics are strings.
// A NULL payload with route.tombstone.on.empty.payload is a tombstone in
// every encoding.) A partition
// column may be of any type whose text is a non-negative int32 (int2,
// int4, int8, numeric without fraction, text). A timestamp column may be
// timestamp (taken as UTC), timestamptz, date, or an integer of epoch
// milliseconds (see table.field.event.timestamp).
//
// # Several outbox tables
//
// NewSet builds a Set from default Options and a map from table
// ("schema.table", or "table" meaning public) to that table's complete
// Options (start each from a copy of the default). Set.Route picks the
// Router by Row.Table and falls back to the default Options' Router for
// tables without options of their own. Per-table options are validated
// like any Options; their errors name the table (OptionError.Table).
//
// # Row operations
//
// INSERT gives a record. DELETE is dropped silently (Drop): applications
// delete outbox rows, often in the inserting transaction. UPDATE follows
// table.op.invalid.behavior. Any other Op is an error. Debezium also drops
// tombstones from the source; pgoutbox's rows never are tombstones.
//
// # Records and memory
//
// Record.Key, Record.Value and header values alias the row's Values
// wherever no conversion is needed; bytea columns are decoded into new
// memory, and an envelope, an expanded payload that differs from the row's
// text and a JsonConverter key or value are newly built (one allocation
// each). StringConverter's true and false are shared read-only slices. The
// caller must keep the row's bytes alive and unchanged until the record has
// been produced, or copy them, and must not write into a record's bytes.
// Route reuses the Record's Headers backing array. With the default
// options, and with header and partition placements, a fixed topic, a
// trace column and StringConverter, Route allocates nothing once a routing
// value's topic is cached. JSON expansion parses into memory the Router
// keeps and reuses (up to about 1 MiB; the scratch of a larger payload is
// dropped at the next one).
//
// Column positions are looked up once per distinct column list and cached
// (up to 64 lists); passing the same Names slice for every row of a table,
// as a pgoutput decoder does with a relation's column list, makes the check
// a few pointer comparisons.
//
// # Errors
//
// Route fails with a *RowError (Table, Column, EventID, Reason, and Err,
// one of the Err* sentinels for errors.Is) when a row cannot be mapped as
// configured. Every such error should stop the relay, as it stops a Kafka
// Connect task: skipping the row would let later positions be confirmed
// and the event be lost. Validate, New, NewSet and Options.Set report bad
// options as *OptionError values naming the option (and for NewSet the
// table).
package router
