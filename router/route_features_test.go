package router

import (
	"slices"
	"strings"
	"testing"
)

const (
	jsonConv   = "org.apache.kafka.connect.json.JsonConverter"
	stringConv = "org.apache.kafka.connect.storage.StringConverter"
	traceOK    = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
)

// jsonValue is the options for value.converter=JsonConverter (schemas off),
// plus more name, value pairs.
func jsonValue(t testing.TB, kv ...string) Options {
	return opts(t, append([]string{optValueConverter, jsonConv, optValueSchemasEnable, "false"}, kv...)...)
}

// jsonBoth is JsonConverter for key and value.
func jsonBoth(t testing.TB, kv ...string) Options {
	return jsonValue(t, append([]string{optKeyConverter, jsonConv, optKeySchemasEnable, "false"}, kv...)...)
}

func header(name string, want *string) func(t *testing.T, rec *Record) {
	return func(t *testing.T, rec *Record) {
		t.Helper()
		for _, h := range rec.Headers {
			if h.Key == name {
				if want == nil {
					t.Errorf("header %s = %q, want none", name, h.Value)
				} else if string(h.Value) != *want {
					t.Errorf("header %s = %q, want %q", name, h.Value, *want)
				}
				return
			}
		}
		if want != nil {
			t.Errorf("no header %s in %v", name, rec.Headers)
		}
	}
}

func TestRouteExpandJSONPayload(t *testing.T) {
	x := func(kv ...string) Options { return opts(t, append([]string{optExpandJSONPayload, "true"}, kv...)...) }
	withNull := `{"total": 12, "note": null, "lines": [{"sku": "a", "qty": 2.50}]}`
	compact := outbox(set("payload", 3802, `{"total":12}`))
	runRouteCases(t, []routeCase{
		{name: "expand_off_keeps_payload_text", opts: DefaultOptions(), row: outbox(set("payload", 3802, withNull)),
			wantAction: Emit, wantValue: str(withNull)},
		{name: "expand_raw_jsonb_compacts_and_drops_nulls", opts: x(), row: outbox(set("payload", 3802, withNull)),
			wantAction: Emit, wantValue: str(`{"total":12,"lines":[{"sku":"a","qty":2.50}]}`)},
		{name: "expand_raw_optional_bytes_keeps_nulls", opts: x(optJSONNullBehavior, "optional_bytes"), row: outbox(set("payload", 3802, withNull)),
			wantAction: Emit, wantValue: str(`{"total":12,"note":null,"lines":[{"sku":"a","qty":2.50}]}`)},
		{name: "expand_raw_compact_payload_is_aliased", opts: x(), row: compact,
			wantAction: Emit, wantValue: str(`{"total":12}`), check: func(t *testing.T, rec *Record) {
				if &rec.Value[0] != &compact.Values[4][0] {
					t.Error("an already compact payload was copied")
				}
			}},
		{name: "expand_text_payload", opts: x(), row: outbox(set("payload", 25, `{"a": [1, 2], "b": {"c": null}}`)),
			wantAction: Emit, wantValue: str(`{"a":[1,2],"b":{}}`)},
		{name: "expand_varchar_payload_after_whitespace_warns", opts: x(), row: outbox(set("payload", 1043, "\n  [{\"a\": null}]")),
			wantAction: EmitWarn, wantValue: str("\n  [{\"a\": null}]"), wantReason: "does not start with { or ["},
		{name: "expand_json_payload_repeated_keys", opts: x(), row: outbox(set("payload", 114, `{"a": 1, "b": 2, "a": 3}`)),
			wantAction: Emit, wantValue: str(`{"a":3,"b":2}`)},
		{name: "expand_text_not_json_warns", opts: x(), row: outbox(set("payload", 25, "plain text")),
			wantAction: EmitWarn, wantValue: str("plain text"), wantReason: "does not start with { or ["},
		{name: "expand_text_bad_json_warns", opts: x(), row: outbox(set("payload", 25, `{"a": }`)),
			wantAction: EmitWarn, wantValue: str(`{"a": }`), wantReason: "not valid JSON"},
		{name: "expand_text_trailing_content_warns", opts: x(), row: outbox(set("payload", 25, `{"a": 1} and more`)),
			wantAction: EmitWarn, wantValue: str(`{"a": 1} and more`), wantReason: "not valid JSON"},
		{name: "expand_jsonb_scalar_warns", opts: x(), row: outbox(set("payload", 3802, `"hello"`)),
			wantAction: EmitWarn, wantValue: str(`"hello"`), wantReason: "does not start with { or ["},
		{name: "expand_bytea_payload_warns", opts: x(), row: outbox(set("payload", 17, `\x7b7d`)),
			wantAction: EmitWarn, wantValue: str("{}"), wantReason: "not a string type"},
		{name: "expand_integer_payload_warns", opts: x(), row: outbox(set("payload", 23, "12")),
			wantAction: EmitWarn, wantValue: str("12"), wantReason: "not a string type"},
		{name: "expand_null_payload_does_not_warn", opts: x(), row: outbox(val("payload", nil)),
			wantAction: Emit, wantValue: str("")},
		{name: "expand_empty_payload_warns", opts: x(), row: outbox(set("payload", 25, "")),
			wantAction: EmitWarn, wantValue: str(""), wantReason: "does not start with { or ["},
		{name: "expand_blank_payload_with_tombstone", opts: x(optTombstoneOnEmpty, "true"), row: outbox(set("payload", 25, " \n")),
			wantAction: Emit, wantValue: tombstone},
		{name: "expand_top_level_array", opts: x(), row: outbox(set("payload", 3802, `[1, {"a": null}]`)),
			wantAction: Emit, wantValue: str(`[1,{}]`)},
		{name: "expand_raw_envelope_embeds_expanded_text", opts: x(optAdditionalPlacement, "type:envelope:eventType"), row: outbox(set("payload", 25, `{"total": 12, "x": null}`)),
			wantAction: Emit, wantValue: str(`{"payload":{"total":12},"eventType":"OrderCreated"}`)},
		{name: "expand_raw_envelope_failure_keeps_string", opts: x(optAdditionalPlacement, "type:envelope:eventType"), row: outbox(set("payload", 25, "plain")),
			wantAction: EmitWarn, wantValue: str(`{"payload":"plain","eventType":"OrderCreated"}`), wantReason: "does not start"},
		{name: "expand_json_converter", opts: jsonValue(t, optExpandJSONPayload, "true"), row: outbox(set("payload", 3802, withNull)),
			wantAction: Emit, wantValue: str(`{"total":12,"lines":[{"sku":"a","qty":2.5}]}`)},
		{name: "expand_json_converter_optional_bytes", opts: jsonValue(t, optExpandJSONPayload, "true", optJSONNullBehavior, "optional_bytes"), row: outbox(set("payload", 3802, withNull)),
			wantAction: Emit, wantValue: str(`{"total":12,"note":null,"lines":[{"sku":"a","qty":2.5}]}`)},
		{name: "expand_json_converter_array_of_objects_share_fields", opts: jsonValue(t, optExpandJSONPayload, "true"),
			row:        outbox(set("payload", 3802, `{"lines": [{"sku": "a"}, {"qty": 2}], "tags": []}`)),
			wantAction: Emit, wantValue: str(`{"lines":[{"sku":"a","qty":null},{"sku":null,"qty":2}]}`)},
		{name: "expand_json_converter_failure_is_string_literal", opts: jsonValue(t, optExpandJSONPayload, "true"), row: outbox(set("payload", 3802, `{"a": [1, "x"]}`)),
			wantAction: EmitWarn, wantValue: str(`"{\"a\": [1, \"x\"]}"`), wantReason: "infers no Kafka Connect schema"},
		// Confirmed against Debezium 3.6.1 by the conformance suite.
		{name: "expand_json_converter_empty_top_level_array_is_string_literal", opts: jsonValue(t, optExpandJSONPayload, "true"), row: outbox(set("payload", 3802, `[]`)),
			wantAction: EmitWarn, wantValue: str(`"[]"`), wantReason: "infers no Kafka Connect schema"},
		{name: "expand_json_converter_top_level_array_is_error", opts: jsonValue(t, optExpandJSONPayload, "true"), row: outbox(set("payload", 3802, `[1, 2]`)),
			wantErr: ErrNotExpandable, wantColumn: "payload"},
		{name: "expand_json_converter_big_integer_is_error", opts: jsonValue(t, optExpandJSONPayload, "true"), row: outbox(set("payload", 3802, `{"big": 18446744073709551616}`)),
			wantErr: ErrNotExpandable, wantColumn: "payload"},
		{name: "expand_json_converter_ignores_trailing_content", opts: jsonValue(t, optExpandJSONPayload, "true"), row: outbox(set("payload", 25, `{"a": 1} trailing`)),
			wantAction: Emit, wantValue: str(`{"a":1}`)},
		{name: "expand_json_converter_keeps_an_unpaired_surrogate", opts: jsonValue(t, optExpandJSONPayload, "true"), row: outbox(set("payload", 25, `{"s": "\ud83d"}`)),
			wantAction: Emit, wantValue: str(`{"s":"\uD83D"}`)},
		{name: "expand_json_converter_escapes_non_bmp", opts: jsonValue(t, optExpandJSONPayload, "true"), row: outbox(set("payload", 3802, `{"😀": "a😀"}`)),
			wantAction: Emit, wantValue: str(`{"\uD83D\uDE00":"a\uD83D\uDE00"}`)},
		{name: "expand_text_after_whitespace_warns", opts: jsonValue(t, optExpandJSONPayload, "true"), row: outbox(set("payload", 25, ` {"a": 1}`)),
			wantAction: EmitWarn, wantValue: str(`" {\"a\": 1}"`), wantReason: "does not start with { or ["},
		{name: "expand_json_converter_envelope", opts: jsonValue(t, optExpandJSONPayload, "true", optAdditionalPlacement, "type:envelope:eventType"),
			row:        outbox(set("payload", 3802, `{"total": 1e2}`)),
			wantAction: Emit, wantValue: str(`{"payload":{"total":100.0},"eventType":"OrderCreated"}`)},
	})
}

func TestRouteConverters(t *testing.T) {
	runRouteCases(t, []routeCase{
		{name: "converter_json_key_and_value", opts: jsonBoth(t), row: outbox(set("payload", 3802, `{"total": 12}`)),
			wantAction: Emit, wantKey: str(`"1"`), wantValue: str(`"{\"total\": 12}"`)},
		// Confirmed against Debezium 3.6.1 by the conformance suite: Jackson
		// writes a character outside the BMP as an escaped surrogate pair.
		{name: "converter_json_non_bmp_is_a_surrogate_pair", opts: jsonBoth(t), row: outbox(set("payload", 3802, `{"e": "😀 é"}`), val("aggregateid", "k😀")),
			wantAction: Emit, wantKey: str(`"k\uD83D\uDE00"`), wantValue: str(`"{\"e\": \"\uD83D\uDE00 é\"}"`)},
		{name: "converter_json_simple_class_name", opts: opts(t, optValueConverter, "JsonConverter", optValueSchemasEnable, "false"), row: outbox(),
			wantAction: Emit, wantKey: str("1"), wantValue: str(`"{\"total\":12}"`)},
		{name: "converter_json_null_key_is_json_null", opts: jsonBoth(t), row: outbox(val("aggregateid", nil)),
			wantAction: Emit, wantKey: str("null")},
		{name: "converter_json_missing_key_column_gives_no_key", opts: jsonBoth(t), row: outbox(del("aggregateid")),
			wantAction: Emit, wantKey: nilKey},
		{name: "converter_json_integer_key_is_number", opts: jsonBoth(t), row: outbox(set("aggregateid", 20, "42")),
			wantAction: Emit, wantKey: str("42")},
		{name: "converter_json_uuid_key_is_string", opts: jsonBoth(t, optEventKey, "id"), row: outbox(),
			wantAction: Emit, wantKey: str(`"` + eventID + `"`)},
		{name: "converter_json_bytea_key_is_base64", opts: jsonBoth(t), row: outbox(set("aggregateid", 17, `\x0102`)),
			wantAction: Emit, wantKey: str(`"AQI="`)},
		{name: "converter_json_text_payload_is_string", opts: jsonValue(t), row: outbox(set("payload", 25, "line1\nline2 \"q\" / é")),
			wantAction: Emit, wantValue: str(`"line1\nline2 \"q\" / é"`)},
		{name: "converter_json_bytea_payload_is_base64", opts: jsonValue(t), row: outbox(set("payload", 17, `\x7b7dff`)),
			wantAction: Emit, wantValue: str(`"e33/"`)},
		{name: "converter_json_float_payload_as_java", opts: jsonValue(t), row: outbox(set("payload", 701, "1.5e+20")),
			wantAction: Emit, wantValue: str(`1.5E20`)},
		{name: "converter_json_null_payload_is_json_null", opts: jsonValue(t), row: outbox(val("payload", nil)),
			wantAction: Emit, wantValue: str("null")},
		{name: "converter_json_null_payload_with_tombstone", opts: jsonValue(t, optTombstoneOnEmpty, "true"), row: outbox(val("payload", nil)),
			wantAction: Emit, wantValue: tombstone},
		{name: "converter_json_empty_payload_is_empty_string", opts: jsonValue(t), row: outbox(set("payload", 25, "")),
			wantAction: Emit, wantValue: str(`""`)},
		{name: "converter_json_envelope", opts: jsonValue(t, optAdditionalPlacement, "type:envelope:eventType,n:envelope,f:envelope,b:envelope,bin:envelope,j:envelope,nul:envelope"),
			row:        outbox(set("n", 23, "-42"), set("f", 701, "0.00012"), set("b", 16, "f"), set("bin", 17, `\x6869`), set("j", 3802, `{"k": [1]}`), set("nul", 25, nil)),
			wantAction: Emit, wantValue: str(`{"payload":"{\"total\":12}","eventType":"OrderCreated","n":-42,"f":1.2E-4,"b":false,"bin":"aGk=","j":"{\"k\": [1]}","nul":null}`)},
		{name: "converter_json_headers_stay_raw", opts: jsonBoth(t, optAdditionalPlacement, "type:header:eventType,bin:header"), row: outbox(set("bin", 17, `\x6869`)),
			wantAction: Emit, check: func(t *testing.T, rec *Record) {
				header("eventType", str("OrderCreated"))(t, rec)
				header("bin", str("hi"))(t, rec)
				header("id", str(eventID))(t, rec)
			}},
		{name: "converter_string_key_and_value", opts: opts(t, optKeyConverter, stringConv, optValueConverter, stringConv), row: outbox(),
			wantAction: Emit, wantKey: str("1"), wantValue: str(`{"total":12}`)},
		{name: "converter_string_bool_key_is_java_text", opts: opts(t, optKeyConverter, stringConv), row: outbox(set("aggregateid", 16, "t")),
			wantAction: Emit, wantKey: str("true")},
		{name: "converter_string_float_payload_as_java", opts: opts(t, optValueConverter, stringConv), row: outbox(set("payload", 700, "1e+10")),
			wantAction: Emit, wantValue: str("1.0E10")},
		{name: "converter_string_null_payload_is_tombstone", opts: opts(t, optValueConverter, stringConv), row: outbox(val("payload", nil)),
			wantAction: Emit, wantValue: tombstone},
		{name: "converter_string_empty_payload_is_empty", opts: opts(t, optValueConverter, stringConv), row: outbox(set("payload", 25, "")),
			wantAction: Emit, wantValue: str("")},
		{name: "converter_string_bytea_payload_is_bytes", opts: opts(t, optValueConverter, stringConv), row: outbox(set("payload", 17, `\x00ff`)),
			wantAction: Emit, wantValue: str("\x00\xff")},
		{name: "converter_string_key_json_value", opts: opts(t, optKeyConverter, stringConv, optValueConverter, jsonConv, optValueSchemasEnable, "false"), row: outbox(),
			wantAction: Emit, wantKey: str("1"), wantValue: str(`"{\"total\":12}"`)},
		{name: "converter_json_bad_bytea_key_is_error", opts: jsonBoth(t), row: outbox(set("aggregateid", 17, `\x0`)),
			wantErr: ErrBadValue, wantColumn: "aggregateid"},
		{name: "converter_string_bad_bytea_payload_is_error", opts: opts(t, optValueConverter, stringConv), row: outbox(set("payload", 17, `\x0`)),
			wantErr: ErrBadValue, wantColumn: "payload"},
	})
}

func TestRouteTrace(t *testing.T) {
	tr := func(kv ...string) Options { return opts(t, append([]string{optEventTrace, "traceparent"}, kv...)...) }
	runRouteCases(t, []routeCase{
		{name: "trace_off_by_default", opts: DefaultOptions(), row: outbox(set("traceparent", 25, traceOK)),
			wantAction: Emit, check: header("traceparent", nil)},
		{name: "trace_valid_becomes_header", opts: tr(), row: outbox(set("traceparent", 25, traceOK)),
			wantAction: Emit, check: header("traceparent", str(traceOK))},
		{name: "trace_follows_other_headers", opts: tr(optAdditionalPlacement, "type:header:eventType"), row: outbox(set("traceparent", 25, traceOK)),
			wantAction: Emit, check: func(t *testing.T, rec *Record) {
				if len(rec.Headers) != 3 || rec.Headers[1].Key != "eventType" || rec.Headers[2].Key != "traceparent" {
					t.Errorf("headers %v", rec.Headers)
				}
			}},
		{name: "trace_null_gives_no_header", opts: tr(), row: outbox(set("traceparent", 25, nil)),
			wantAction: Emit, check: header("traceparent", nil)},
		{name: "trace_invalid_warns_without_header", opts: tr(), row: outbox(set("traceparent", 25, "not-a-trace")),
			wantAction: EmitWarn, wantReason: "not a W3C traceparent", check: header("traceparent", nil)},
		{name: "trace_upper_case_is_invalid", opts: tr(), row: outbox(set("traceparent", 25, "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01")),
			wantAction: EmitWarn, wantReason: "not a W3C traceparent", check: header("traceparent", nil)},
		{name: "trace_bytea_column_is_decoded", opts: tr(), row: outbox(set("traceparent", 17, `\x`+hexOf(traceOK))),
			wantAction: Emit, check: header("traceparent", str(traceOK))},
		{name: "trace_missing_column_is_error", opts: tr(), row: outbox(),
			wantErr: ErrMissingColumn, wantColumn: "traceparent"},
		{name: "trace_missing_column_ignored", opts: tr(optAdditionalMissing, "ignore"), row: outbox(),
			wantAction: Emit, check: header("traceparent", nil)},
		{name: "trace_invalid_and_expansion_failure", opts: tr(optExpandJSONPayload, "true"), row: outbox(set("payload", 25, "plain"), set("traceparent", 25, "x")),
			wantAction: EmitWarn, wantReason: "does not start with { or [; emitted unchanged; header traceparent left out"},
	})
}

func hexOf(s string) string {
	const digits = "0123456789abcdef"
	b := make([]byte, 0, 2*len(s))
	for i := 0; i < len(s); i++ {
		b = append(b, digits[s[i]>>4], digits[s[i]&15])
	}
	return string(b)
}

func TestRouteTopics(t *testing.T) {
	runRouteCases(t, []routeCase{
		{name: "topic_fixed", opts: opts(t, optRouteTopic, "orders"), row: outbox(),
			wantAction: Emit, wantTopic: "orders"},
		{name: "topic_fixed_needs_no_routing_column", opts: opts(t, optRouteTopic, "orders"), row: outbox(del("aggregatetype")),
			wantAction: Emit, wantTopic: "orders"},
		{name: "topic_fixed_ignores_null_routing_value", opts: opts(t, optRouteTopic, "orders"), row: outbox(val("aggregatetype", nil)),
			wantAction: Emit, wantTopic: "orders"},
		{name: "topic_replacement_with_table", opts: opts(t, optRouteReplacement, "${table}.${routedByValue}"), row: outbox(),
			wantAction: Emit, wantTopic: "public.outbox.Order"},
		{name: "topic_group_named_table_wins_over_table", opts: opts(t, optRouteTopicRegex, "(?<table>.*)", optRouteReplacement, "x.${table}"), row: outbox(),
			wantAction: Emit, wantTopic: "x.Order"},
		{name: "topic_no_match_ignores_table", opts: opts(t, optRouteTopicRegex, "[a-z]+", optRouteReplacement, "${table}.x"), row: outbox(),
			wantAction: Emit, wantTopic: "Order"},
	})
}

// TestRouteColumnTypes routes payloads of each common column type under
// each encoding, and the column types usable for partitions and
// timestamps.
func TestRouteColumnTypes(t *testing.T) {
	// Through Kafka Connect's converters a numeric, date, time or
	// timestamp column is the Connect value Debezium makes of it, held
	// against the real Debezium by pkg/conformance (typed-placements);
	// money, timetz, arrays, user types other than enums and a numeric
	// without a precision under StringConverter (a Java object address)
	// are bad values.
	const bad = "\x00bad"
	payloads := []struct {
		name  string
		oid   uint32
		mod   int32 // type modifier; 0 is none
		value string
		raw   string // raw and StringConverter ("\x00bad": StringConverter fails)
		json  string // JsonConverter ("\x00bad": it fails)
		str   string // StringConverter, where not raw
	}{
		{"uuid", 2950, 0, eventID, eventID, `"` + eventID + `"`, ""},
		{"text", 25, 0, "hello", "hello", `"hello"`, ""},
		{"varchar", 1043, 0, `{"total":12}`, `{"total":12}`, `"{\"total\":12}"`, ""},
		{"json", 114, 0, `{"total": 12,  "x": [1]}`, `{"total": 12,  "x": [1]}`, `"{\"total\": 12,  \"x\": [1]}"`, ""},
		{"jsonb", 3802, 0, `{"total": 12}`, `{"total": 12}`, `"{\"total\": 12}"`, ""},
		{"bytea", 17, 0, `\x00017b`, "\x00\x01{", `"AAF7"`, ""},
		{"int4", 23, 0, "12", "12", "12", ""},
		{"numeric", 1700, 0, "12.50", "12.50", `{"scale":1,"value":"fQ=="}`, bad},
		{"numeric_12_2", 1700, 12<<16 | 2 + 4, "12.50", "12.50", `"BOI="`, "12.50"},
		{"bool", 16, 0, "t", "t", "true", "true"},
		{"int4_array", 1007, 0, "{1,2}", "{1,2}", bad, bad},
		{"timestamptz", 1184, 0, "2024-01-02 03:04:05.5+01", "2024-01-02 03:04:05.5+01", `"2024-01-02T02:04:05.500000Z"`, "2024-01-02T02:04:05.500000Z"},
		{"timestamp_3", 1114, 3, "2024-01-02 03:04:05.5", "2024-01-02 03:04:05.5", "1704164645500", "1704164645500"},
		{"date", 1082, 0, "2024-01-02", "2024-01-02", "19724", "19724"},
		{"interval", 1186, 0, "1 day 02:03:04", "1 day 02:03:04", "93784000000", "93784000000"},
		{"money", 790, 0, "$1.00", "$1.00", bad, bad},
		// An enum's array, hstore, a composite: the caller names them
		// NotReproducedType.
		{"user_type_not_reproduced", NotReproducedType, 0, "{happy,sad}", "{happy,sad}", bad, bad},
		// Built-in types Debezium writes as null (name), as a struct
		// (point) or leaves out of its record (box), and two it writes
		// as pgoutbox does (held against it by pkg/conformance).
		{"name", 19, 0, "aname", "aname", bad, bad},
		{"point", 600, 0, "(1.5,-2)", "(1.5,-2)", bad, bad},
		{"box", 603, 0, "(1,1),(0,0)", "(1,1),(0,0)", bad, bad},
		{"inet", 869, 0, "192.168.0.1", "192.168.0.1", `"192.168.0.1"`, ""},
		{"oid", 26, 0, "12345", "12345", "12345", ""},
	}
	var cases []routeCase
	for _, p := range payloads {
		row := func() *Row {
			r := outbox(set("payload", p.oid, p.value))
			if p.mod != 0 {
				r.Mods = make([]int32, len(r.Names))
				for i := range r.Mods {
					r.Mods[i] = -1
				}
				r.Mods[slices.Index(r.Names, "payload")] = p.mod
			}
			return r
		}
		want := func(name string, o Options, v string) routeCase {
			c := routeCase{name: "types_" + p.name + "_payload_" + name, opts: o, row: row(), wantAction: Emit, wantValue: str(v)}
			if v == bad {
				c.wantAction, c.wantErr, c.wantColumn, c.wantValue = Emit, ErrBadValue, "payload", nil
			}
			return c
		}
		stringWant := p.raw
		if p.str != "" {
			stringWant = p.str
		}
		cases = append(cases,
			want("raw", DefaultOptions(), p.raw),
			want("string_converter", opts(t, optValueConverter, stringConv), stringWant),
			want("json_converter", jsonValue(t), p.json),
		)
	}
	for _, c := range []struct {
		name  string
		oid   uint32
		value string
	}{
		{"int2", 21, "3"}, {"int4", 23, "3"}, {"int8", 20, "3"}, {"numeric", 1700, "3"}, {"text", 25, "3"},
	} {
		cases = append(cases, routeCase{name: "types_partition_from_" + c.name, opts: opts(t, optAdditionalPlacement, "shard:partition"),
			row: outbox(set("shard", c.oid, c.value)), wantAction: Emit, check: func(t *testing.T, rec *Record) {
				if rec.Partition != 3 {
					t.Errorf("partition = %d, want 3", rec.Partition)
				}
			}})
	}
	for _, c := range []struct {
		name  string
		oid   uint32
		value string
		want  string
	}{
		{"timestamp", 1114, "2024-01-02 03:04:05.123456", "2024-01-02T03:04:05.123456Z"},
		{"timestamptz", 1184, "2024-01-02 03:04:05.123+05:30", "2024-01-01T21:34:05.123Z"},
		{"date", 1082, "2024-01-02", "2024-01-02T00:00:00Z"},
		{"int8_epoch_millis", 20, "1704164645123", "2024-01-02T03:04:05.123Z"},
		{"text_epoch_millis", 25, "1704164645123", "2024-01-02T03:04:05.123Z"},
	} {
		cases = append(cases, routeCase{name: "types_timestamp_from_" + c.name, opts: opts(t, optEventTimestamp, "ts"),
			row: outbox(set("ts", c.oid, c.value)), wantAction: Emit, check: func(t *testing.T, rec *Record) {
				if got := rec.Timestamp.UTC().Format("2006-01-02T15:04:05.999999999Z07:00"); got != c.want {
					t.Errorf("timestamp = %s, want %s", got, c.want)
				}
			}})
	}
	cases = append(cases,
		routeCase{name: "types_blank_text_payload_with_tombstone", opts: opts(t, optTombstoneOnEmpty, "true"), row: outbox(set("payload", 25, " \t\n")),
			wantAction: Emit, wantValue: tombstone},
		routeCase{name: "types_blank_text_payload_without_tombstone", opts: DefaultOptions(), row: outbox(set("payload", 25, " \t\n")),
			wantAction: Emit, wantValue: str(" \t\n")},
	)
	runRouteCases(t, cases)
}

// headers returns a check that the record's headers are exactly want
// ("key=value", "key" alone for a null value).
func headers(want ...string) func(t *testing.T, rec *Record) {
	return func(t *testing.T, rec *Record) {
		t.Helper()
		var got []string
		for _, h := range rec.Headers {
			if h.Value == nil {
				got = append(got, h.Key)
			} else {
				got = append(got, h.Key+"="+string(h.Value))
			}
		}
		if strings.Join(got, "|") != strings.Join(want, "|") {
			t.Errorf("headers %q, want %q", got, want)
		}
	}
}

// TestRouteDebeziumOptions covers the Debezium options the conformance
// suite checks against Debezium 3.6.1: the extended headers, the header
// converters, the schema version column and the tracing context column.
func TestRouteDebeziumOptions(t *testing.T) {
	ext := []string{optExtendedHeaders, "true", optLogicalName, "orders", optRunID, "01890a5d-ac96-774b-bcce-b302099a8057"}
	simple := []string{optHeaderConverter, ConverterHeader}
	jsonHeaders := []string{optHeaderConverter, jsonConv, optHeaderSchemas, "false"}
	extras := []string{optAdditionalPlacement, "flag:header,blob:header,f:header,type:header"}
	typed := outbox(set("flag", 16, "t"), set("blob", 17, `\x0102ff`), set("f", 701, "1e+20"))
	runRouteCases(t, []routeCase{
		{name: "extended_headers_come_first", opts: opts(t, ext...), row: outbox(), wantAction: Emit,
			check: headers("__debezium.context.connectorLogicalName=orders", "__debezium.context.taskId=0",
				"__debezium.context.connectorName=postgresql", "__debezium.context.runId=01890a5d-ac96-774b-bcce-b302099a8057", "id="+eventID)},
		{name: "extended_headers_json_header_converter", opts: opts(t, append(ext, jsonHeaders...)...), row: outbox(), wantAction: Emit,
			check: headers(`__debezium.context.connectorLogicalName="orders"`, `__debezium.context.taskId="0"`,
				`__debezium.context.connectorName="postgresql"`, `__debezium.context.runId="01890a5d-ac96-774b-bcce-b302099a8057"`, `id="`+eventID+`"`)},
		{name: "header_converter_raw_keeps_postgres_text", opts: opts(t, extras...), row: typed, wantAction: Emit,
			check: headers("id="+eventID, "flag=t", "blob=\x01\x02\xff", "f=1e+20", "type=OrderCreated")},
		{name: "header_converter_simple_writes_java_text", opts: opts(t, append(extras, simple...)...), row: typed, wantAction: Emit,
			check: headers("id="+eventID, "flag=true", "blob=AQL/", "f=1.0E20", "type=OrderCreated")},
		{name: "header_converter_json_writes_json", opts: opts(t, append(extras, jsonHeaders...)...), row: outbox(set("flag", 16, nil), set("blob", 17, `\x01`), set("f", 701, "1.5"), val("type", "Évt😀")), wantAction: Emit,
			check: headers(`id="`+eventID+`"`, "flag=null", `blob="AQ=="`, "f=1.5", `type="Évt\uD83D\uDE00"`)},
		{name: "schema_version_column_is_checked", opts: opts(t, optSchemaVersion, "version"), row: outbox(set("version", 23, "3")), wantAction: Emit,
			wantValue: str(`{"total":12}`), check: headers("id=" + eventID)},
		{name: "schema_version_null_is_accepted", opts: opts(t, optSchemaVersion, "version"), row: outbox(set("version", 23, nil)), wantAction: Emit},
		{name: "schema_version_missing_is_error", opts: opts(t, optSchemaVersion, "version"), row: outbox(), wantErr: ErrMissingColumn, wantColumn: "version"},
		{name: "schema_version_not_int32_is_error", opts: opts(t, optSchemaVersion, "version"), row: outbox(set("version", 20, "3000000000")), wantErr: ErrBadValue, wantColumn: "version"},
		{name: "tracing_context_becomes_headers_before_id", opts: opts(t, append(ext, optTracingContext, "tracingspancontext")...),
			row:        outbox(set("tracingspancontext", 25, "#Properties\ntraceparent="+traceOK+"\ntracestate=congo\\=t61rcWkgMzE\n")),
			wantAction: Emit,
			check: headers("__debezium.context.connectorLogicalName=orders", "__debezium.context.taskId=0",
				"__debezium.context.connectorName=postgresql", "__debezium.context.runId=01890a5d-ac96-774b-bcce-b302099a8057",
				"traceparent="+traceOK, "tracestate=congo=t61rcWkgMzE", "id="+eventID)},
		{name: "tracing_context_colon_separator", opts: opts(t, optTracingContext, "ctx"), row: outbox(set("ctx", 25, "traceparent : "+traceOK)), wantAction: Emit,
			check: headers("traceparent="+traceOK, "id="+eventID)},
		{name: "tracing_context_invalid_warns", opts: opts(t, optTracingContext, "ctx"), row: outbox(set("ctx", 25, "not a context")), wantAction: EmitWarn,
			wantReason: "traceparent", check: headers("id=" + eventID)},
		{name: "tracing_context_missing_column_gives_none", opts: opts(t, optTracingContext, "ctx"), row: outbox(), wantAction: Emit, check: headers("id=" + eventID)},
	})
}
