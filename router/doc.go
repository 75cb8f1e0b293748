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
//	case action == router.DropWarn:  // log rec.Reason at warn level, with row.Table and rec.EventID
//	case action == router.DropError: // log rec.Reason at error level
//	}                                // router.Drop: nothing to do
//
// A Router is not safe for concurrent use; give each goroutine its own.
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
// The option names are Debezium's; Options carries them as YAML keys and
// Options.Set accepts them by name with string values, as in a Kafka
// Connect connector configuration (transforms.<name>.<option>).
//
// table.field.event.id (default "id"): the column copied to the header "id".
// A row without the column is an error; a NULL id gives an "id" header with
// a null value.
//
// table.field.event.key (default "aggregateid"): the column whose text is
// the record key. A NULL value, or a row without the column, gives a record
// without a key (the producer's partitioner then spreads such records).
// Debezium would fall back to the outbox row's primary key instead, which
// pgoutbox does not have at this stage.
//
// table.field.event.type (default "type"): accepted for compatibility; it
// has no effect by itself. To emit the event type, name its column in
// table.fields.additional.placement, e.g. "type:header:eventType".
//
// table.field.event.payload (default "payload"): the column whose value is
// the record value, as its raw text bytes (a jsonb payload is its JSON text,
// byte for byte as PostgreSQL sends it). A row without the column is an
// error. For NULL and empty payloads see route.tombstone.on.empty.payload.
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
//   - header: a header named alias with the column's text (bytea decoded to
//     its bytes; NULL gives a header with a null value). Headers follow "id"
//     in the configured order.
//   - envelope: the record value becomes the JSON object
//     {"payload": <payload>, "<alias>": <value>, ...}, fields in the
//     configured order. Values are converted by type: json and jsonb as
//     they are, booleans as true/false, integer, float and numeric columns
//     as JSON numbers (NaN and Infinity as strings), bytea as a base64
//     string (as Kafka Connect's JsonConverter writes bytes), NULL as null,
//     anything else (text, uuid, timestamps, …) as a JSON string of its
//     text. A text payload therefore becomes a JSON string, as in Debezium
//     without table.expand.json.payload. The alias "payload" and repeated
//     aliases are rejected.
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
// table.expand.json.payload (default false): not supported yet; true is
// rejected by Validate. With pgoutbox's raw payload bytes a jsonb payload is
// already emitted as JSON.
//
// table.json.payload.null.behavior (default "ignore"): "ignore" or
// "optional_bytes"; accepted for compatibility, it only matters with
// table.expand.json.payload.
//
// route.by.field (default "aggregatetype"): the column whose text is the
// routing value. A row without the column, or with a NULL value, is an
// error (ErrMissingColumn, ErrNullRoutingValue).
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
// first matching row as in Java. The topic must be a legal Kafka topic name
// (1 to 249 characters of [a-zA-Z0-9._-], not "." or ".."), or the row
// fails with ErrInvalidTopic. Topics are cached per routing value (up to
// 4096 values of at most 512 bytes; the cache is emptied when full), so the
// regex runs once per distinct value.
//
// route.tombstone.on.empty.payload (default false): with true, a NULL or
// empty (zero-length) payload gives a tombstone: a record with a nil Value,
// keeping its key, headers and partition. With false such a payload gives a
// record with an empty, non-nil Value, which Kafka stores as an empty value,
// not a tombstone; with an envelope it is {"payload":null,…} or
// {"payload":"",…}. (Kafka Connect with JsonConverter and
// schemas.enable=false happens to write a null payload as a null value
// either way; pgoutbox keeps the two settings distinct, as the option
// intends.)
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
// memory and an envelope value is newly built. The caller must keep the
// row's bytes alive and unchanged until the record has been produced, or
// copy them. Route reuses the Record's Headers backing array. With the
// default options, and with header and partition placements, Route
// allocates nothing once a routing value's topic is cached.
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
// and the event be lost. Validate, New and Options.Set report bad options
// as *OptionError values naming the option.
package router
