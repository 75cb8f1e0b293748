package router

import (
	"errors"
	"strconv"
	"strings"
	"testing"
)

// routeCase is one row through one Router. The golden file
// testdata/golden/<name>.json holds the full result; the want fields are
// asserted as well, so that a regenerated golden file cannot hide a change
// of the behaviour the case is named after.
type routeCase struct {
	name string
	opts Options
	row  *Row

	wantAction Action
	wantErr    error  // the error class, for errors.Is
	wantColumn string // RowError.Column
	wantTopic  string
	wantKey    *string // nil: not checked; use nilKey for "no key"
	wantValue  *string // nil: not checked; use tombstone for nil value
	wantReason string  // a substring of Record.Reason, for EmitWarn

	// check, when not nil, asserts more about an emitted record.
	check func(t *testing.T, rec *Record)
}

var (
	nilKey    = new(string)
	tombstone = new(string)
)

func str(s string) *string { return &s }

func routeCases(t testing.TB) []routeCase {
	d := DefaultOptions()
	return []routeCase{
		// The contract's worked example, with defaults.
		{name: "worked_example", opts: d, row: outbox(),
			wantAction: Emit, wantTopic: "outbox.event.Order", wantKey: str("1"), wantValue: str(`{"total":12}`)},

		// Defaults, one at a time.
		{name: "default_topic_keeps_case_of_routing_value", opts: d, row: outbox(val("aggregatetype", "customerAccount")),
			wantAction: Emit, wantTopic: "outbox.event.customerAccount"},
		{name: "default_key_is_aggregateid_text", opts: d, row: outbox(val("aggregateid", "a-42")),
			wantAction: Emit, wantTopic: "outbox.event.Order", wantKey: str("a-42")},
		{name: "default_type_column_is_not_emitted", opts: d, row: outbox(val("type", "SomethingElse")),
			wantAction: Emit, wantTopic: "outbox.event.Order"},
		{name: "default_extra_columns_are_ignored", opts: d, row: outbox(set("created_at", 1184, "2020-01-01 00:00:00+00"), set("tenant", 25, "t1")),
			wantAction: Emit, wantTopic: "outbox.event.Order"},
		{name: "default_empty_routing_value_gives_prefix_topic", opts: d, row: outbox(val("aggregatetype", "")),
			wantAction: Emit, wantTopic: "outbox.event."},
		{name: "routing_value_of_integer_column_is_its_text", opts: d, row: outbox(set("aggregatetype", 23, "7")),
			wantAction: Emit, wantTopic: "outbox.event.7"},
		{name: "types_may_be_missing", opts: d, row: outbox(func(r *Row) { r.Types = nil }),
			wantAction: Emit, wantTopic: "outbox.event.Order", wantValue: str(`{"total":12}`)},
		{name: "custom_column_names", opts: opts(t, optEventID, "event_id", optEventKey, "key", optEventPayload, "body", optRouteByField, "stream"),
			row: &Row{Table: "app.events", Op: OpInsert,
				Names:  []string{"event_id", "stream", "key", "body"},
				Types:  []uint32{20, 25, 25, 114},
				Values: [][]byte{[]byte("17"), []byte("billing"), []byte("inv-9"), []byte(`[1, 2]`)}},
			wantAction: Emit, wantTopic: "outbox.event.billing", wantKey: str("inv-9"), wantValue: str(`[1, 2]`)},

		// route.topic.regex and route.topic.replacement.
		{name: "regex_named_groups_match", opts: opts(t, optRouteTopicRegex, `(?<domain>[a-z]+)_(?<version>v\d+)`, optRouteReplacement, "events.${domain}.${version}"),
			row: outbox(val("aggregatetype", "order_v2")), wantAction: Emit, wantTopic: "events.order.v2"},
		{name: "regex_no_match_uses_raw_routing_value", opts: opts(t, optRouteTopicRegex, `(?<domain>[a-z]+)_(?<version>v\d+)`, optRouteReplacement, "events.${domain}.${version}"),
			row: outbox(val("aggregatetype", "Order")), wantAction: Emit, wantTopic: "Order"},
		{name: "regex_must_match_whole_value", opts: opts(t, optRouteTopicRegex, `order`, optRouteReplacement, "orders.topic"),
			row: outbox(val("aggregatetype", "orders")), wantAction: Emit, wantTopic: "orders"},
		{name: "regex_whole_match_replaced", opts: opts(t, optRouteTopicRegex, `order`, optRouteReplacement, "orders.topic"),
			row: outbox(val("aggregatetype", "order")), wantAction: Emit, wantTopic: "orders.topic"},
		{name: "replacement_numbered_groups", opts: opts(t, optRouteTopicRegex, `(\w+)\.(\w+)`, optRouteReplacement, "$2-$1"),
			row: outbox(val("aggregatetype", "shop.Order")), wantAction: Emit, wantTopic: "Order-shop"},
		{name: "replacement_group_zero_is_whole_match", opts: opts(t, optRouteTopicRegex, `[A-Z]\w*`, optRouteReplacement, "all.$0"),
			row: outbox(val("aggregatetype", "Order")), wantAction: Emit, wantTopic: "all.Order"},
		{name: "replacement_named_group_by_number", opts: opts(t, optRouteTopicRegex, `(?<name>.*)`, optRouteReplacement, "x.$1"),
			row: outbox(), wantAction: Emit, wantTopic: "x.Order"},
		{name: "replacement_unmatched_group_appends_nothing", opts: opts(t, optRouteTopicRegex, `(a)?(\w+)`, optRouteReplacement, "t$1.$2"),
			row: outbox(val("aggregatetype", "Order")), wantAction: Emit, wantTopic: "t.Order"},
		{name: "replace_first_keeps_rest_of_value", opts: opts(t, optRouteTopicRegex, `a|ab`, optRouteReplacement, "x"),
			row: outbox(val("aggregatetype", "ab")), wantAction: Emit, wantTopic: "xb"},
		{name: "invalid_topic_from_routing_value", opts: d, row: outbox(val("aggregatetype", "Order Created")),
			wantErr: ErrInvalidTopic, wantColumn: "aggregatetype"},
		{name: "no_match_with_invalid_raw_value_is_invalid_topic", opts: opts(t, optRouteTopicRegex, `[a-z]+`, optRouteReplacement, "t"),
			row: outbox(val("aggregatetype", "Ördér")), wantErr: ErrInvalidTopic, wantColumn: "aggregatetype"},

		// table.fields.additional.placement.
		{name: "header_with_alias", opts: opts(t, optAdditionalPlacement, "type:header:eventType"), row: outbox(), wantAction: Emit},
		{name: "header_without_alias", opts: opts(t, optAdditionalPlacement, "type:header"), row: outbox(), wantAction: Emit},
		{name: "headers_keep_configured_order", opts: opts(t, optAdditionalPlacement, " aggregatetype:header:aggType , type:HEADER:eventType,aggregateid:header"), row: outbox(), wantAction: Emit},
		{name: "header_from_null_column_has_null_value", opts: opts(t, optAdditionalPlacement, "type:header:eventType"), row: outbox(val("type", nil)), wantAction: Emit},
		{name: "header_from_bytea_column_is_decoded", opts: opts(t, optAdditionalPlacement, "trace:header"), row: outbox(set("trace", 17, `\x00ff10`)), wantAction: Emit},
		{name: "envelope_wraps_payload", opts: opts(t, optAdditionalPlacement, "type:envelope:eventType,aggregateid:envelope"), row: outbox(),
			wantAction: Emit, wantValue: str(`{"payload":{"total":12},"eventType":"OrderCreated","aggregateid":"1"}`)},
		{name: "envelope_json_types", opts: opts(t, optAdditionalPlacement, "n:envelope,b:envelope,f:envelope,nan:envelope,j:envelope,bin:envelope,nul:envelope,txt:envelope"),
			row: outbox(set("n", 20, "-42"), set("b", 16, "t"), set("f", 701, "1.5e+20"), set("nan", 1700, "NaN"), set("j", 114, `{"a": [1, null]}`),
				set("bin", 17, `\x68690a`), set("nul", 25, nil), set("txt", 25, "tab\there \"q\" \\ \x01 é")),
			wantAction: Emit,
			wantValue:  str(`{"payload":{"total":12},"n":-42,"b":true,"f":1.5e+20,"nan":"NaN","j":{"a": [1, null]},"bin":"aGkK","nul":null,"txt":"tab\there \"q\" \\ \u0001 é"}`)},
		{name: "envelope_text_payload_is_a_string", opts: opts(t, optAdditionalPlacement, "type:envelope:eventType"), row: outbox(set("payload", 25, `{"total":12}`)),
			wantAction: Emit, wantValue: str(`{"payload":"{\"total\":12}","eventType":"OrderCreated"}`)},
		{name: "envelope_null_payload_without_tombstone", opts: opts(t, optAdditionalPlacement, "type:envelope:eventType"), row: outbox(val("payload", nil)),
			wantAction: Emit, wantValue: str(`{"payload":null,"eventType":"OrderCreated"}`)},
		{name: "envelope_null_payload_with_tombstone", opts: opts(t, optAdditionalPlacement, "type:envelope:eventType", optTombstoneOnEmpty, "true"), row: outbox(val("payload", nil)),
			wantAction: Emit, wantValue: tombstone},
		{name: "partition_from_integer_column", opts: opts(t, optAdditionalPlacement, "shard:partition"), row: outbox(set("shard", 23, "3")), wantAction: Emit},
		{name: "partition_null_lets_partitioner_choose", opts: opts(t, optAdditionalPlacement, "shard:partition"), row: outbox(set("shard", 23, nil)), wantAction: Emit},
		{name: "partition_negative_is_error", opts: opts(t, optAdditionalPlacement, "shard:partition"), row: outbox(set("shard", 23, "-1")),
			wantErr: ErrBadPartition, wantColumn: "shard"},
		{name: "partition_not_integer_is_error", opts: opts(t, optAdditionalPlacement, "shard:partition"), row: outbox(set("shard", 25, "two")),
			wantErr: ErrBadPartition, wantColumn: "shard"},
		{name: "partition_over_int32_is_error", opts: opts(t, optAdditionalPlacement, "shard:partition"), row: outbox(set("shard", 20, "2147483648")),
			wantErr: ErrBadPartition, wantColumn: "shard"},

		// table.field.additional.missing and table.fields.additional.error.on.missing.
		{name: "missing_additional_column_is_error_by_default", opts: opts(t, optAdditionalPlacement, "tenant:header"), row: outbox(),
			wantErr: ErrMissingColumn, wantColumn: "tenant"},
		{name: "missing_additional_column_ignored", opts: opts(t, optAdditionalPlacement, "tenant:header,type:header:eventType", optAdditionalMissing, "ignore"), row: outbox(),
			wantAction: Emit},
		{name: "missing_additional_column_error_explicit", opts: opts(t, optAdditionalPlacement, "tenant:header", optAdditionalMissing, "error"), row: outbox(),
			wantErr: ErrMissingColumn, wantColumn: "tenant"},
		{name: "missing_additional_column_ignored_old_boolean", opts: opts(t, optAdditionalPlacement, "tenant:header,type:header:eventType", optErrorOnMissing, "false"), row: outbox(),
			wantAction: Emit},
		{name: "missing_additional_column_error_old_boolean", opts: opts(t, optAdditionalPlacement, "tenant:header", optErrorOnMissing, "true"), row: outbox(),
			wantErr: ErrMissingColumn, wantColumn: "tenant"},
		{name: "missing_envelope_column_ignored", opts: opts(t, optAdditionalPlacement, "tenant:envelope,type:envelope", optAdditionalMissing, "ignore"), row: outbox(),
			wantAction: Emit, wantValue: str(`{"payload":{"total":12},"type":"OrderCreated"}`)},

		// Key, routing value and required columns.
		{name: "null_key_gives_no_key", opts: d, row: outbox(val("aggregateid", nil)), wantAction: Emit, wantKey: nilKey},
		{name: "missing_key_column_gives_no_key", opts: d, row: outbox(del("aggregateid")), wantAction: Emit, wantKey: nilKey},
		{name: "bytea_key_is_decoded", opts: d, row: outbox(set("aggregateid", 17, `\x0102`)), wantAction: Emit, wantKey: str("\x01\x02")},
		{name: "null_routing_value_is_error", opts: d, row: outbox(val("aggregatetype", nil)), wantErr: ErrNullRoutingValue, wantColumn: "aggregatetype"},
		{name: "missing_routing_column_is_error", opts: d, row: outbox(del("aggregatetype")), wantErr: ErrMissingColumn, wantColumn: "aggregatetype"},
		{name: "missing_id_column_is_error", opts: d, row: outbox(del("id")), wantErr: ErrMissingColumn, wantColumn: "id"},
		{name: "missing_payload_column_is_error", opts: d, row: outbox(del("payload")), wantErr: ErrMissingColumn, wantColumn: "payload"},
		{name: "null_id_is_error", opts: d, row: outbox(val("id", nil)), wantErr: ErrNullEventID, wantColumn: "id"},
		{name: "names_and_values_mismatch_is_error", opts: d, row: outbox(func(r *Row) { r.Values = r.Values[:3] }), wantErr: ErrMalformedRow},

		// Operations.
		{name: "delete_is_dropped_silently", opts: d, row: outbox(op(OpDelete)), wantAction: Drop},
		{name: "delete_with_only_key_columns_is_dropped", opts: d, row: outbox(op(OpDelete), val("aggregatetype", nil), val("payload", nil)), wantAction: Drop},
		{name: "update_warn_drops", opts: d, row: outbox(op(OpUpdate)), wantAction: DropWarn},
		{name: "update_error_drops", opts: opts(t, optOpInvalidBehavior, "error"), row: outbox(op(OpUpdate)), wantAction: DropError},
		{name: "update_fatal_is_error", opts: opts(t, optOpInvalidBehavior, "fatal"), row: outbox(op(OpUpdate)), wantErr: ErrInvalidOperation},
		{name: "unknown_op_is_error", opts: d, row: outbox(op(0)), wantErr: ErrUnknownOp},

		// Payload conversion and route.tombstone.on.empty.payload.
		{name: "bytea_payload_is_decoded", opts: d, row: outbox(set("payload", 17, `\x0a0bff`)), wantAction: Emit, wantValue: str("\x0a\x0b\xff")},
		{name: "bytea_payload_escape_format_is_decoded", opts: d, row: outbox(set("payload", 17, `a\\b\001`)), wantAction: Emit, wantValue: str("a\\b\x01")},
		{name: "bytea_payload_bad_hex_is_error", opts: d, row: outbox(set("payload", 17, `\x0g`)), wantErr: ErrBadValue, wantColumn: "payload"},
		{name: "bytea_key_bad_hex_is_error", opts: d, row: outbox(set("aggregateid", 17, `\x1`)), wantErr: ErrBadValue, wantColumn: "aggregateid"},
		{name: "bytea_id_bad_hex_is_error", opts: d, row: outbox(set("id", 17, `\xq0`)), wantErr: ErrBadValue, wantColumn: "id"},
		{name: "bytea_header_bad_escape_is_error", opts: opts(t, optAdditionalPlacement, "trace:header"), row: outbox(set("trace", 17, `\9`)), wantErr: ErrBadValue, wantColumn: "trace"},
		{name: "bytea_envelope_field_bad_hex_is_error", opts: opts(t, optAdditionalPlacement, "trace:envelope"), row: outbox(set("trace", 17, `\x0`)), wantErr: ErrBadValue, wantColumn: "trace"},
		{name: "bytea_envelope_payload_bad_hex_is_error", opts: opts(t, optAdditionalPlacement, "type:envelope"), row: outbox(set("payload", 17, `\x0`)), wantErr: ErrBadValue, wantColumn: "payload"},
		{name: "bytea_envelope_payload_is_base64", opts: opts(t, optAdditionalPlacement, "type:envelope"), row: outbox(set("payload", 17, `\x7b7d`)),
			wantAction: Emit, wantValue: str(`{"payload":"e30=","type":"OrderCreated"}`)},
		{name: "text_payload_is_raw_text", opts: d, row: outbox(set("payload", 25, "plain text")), wantAction: Emit, wantValue: str("plain text")},
		{name: "null_payload_without_tombstone_is_empty_value", opts: d, row: outbox(val("payload", nil)), wantAction: Emit, wantValue: str("")},
		{name: "empty_payload_without_tombstone_is_empty_value", opts: d, row: outbox(set("payload", 25, "")), wantAction: Emit, wantValue: str("")},
		{name: "null_payload_with_tombstone", opts: opts(t, optTombstoneOnEmpty, "true"), row: outbox(val("payload", nil)), wantAction: Emit, wantValue: tombstone, wantKey: str("1")},
		{name: "empty_payload_with_tombstone", opts: opts(t, optTombstoneOnEmpty, "true"), row: outbox(set("payload", 25, "")), wantAction: Emit, wantValue: tombstone},
		{name: "empty_bytea_payload_with_tombstone", opts: opts(t, optTombstoneOnEmpty, "true"), row: outbox(set("payload", 17, `\x`)), wantAction: Emit, wantValue: tombstone},
		{name: "non_empty_payload_with_tombstone_option", opts: opts(t, optTombstoneOnEmpty, "true"), row: outbox(), wantAction: Emit, wantValue: str(`{"total":12}`)},

		// table.field.event.timestamp.
		{name: "timestamp_from_timestamptz", opts: opts(t, optEventTimestamp, "ts"), row: outbox(set("ts", 1184, "2023-05-06 07:08:09.5+02")), wantAction: Emit},
		{name: "timestamp_from_timestamptz_with_minutes_offset", opts: opts(t, optEventTimestamp, "ts"), row: outbox(set("ts", 1184, "2023-05-06 07:08:09.123456-03:30")), wantAction: Emit},
		{name: "timestamp_from_timestamp_is_utc", opts: opts(t, optEventTimestamp, "ts"), row: outbox(set("ts", 1114, "2023-05-06 07:08:09")), wantAction: Emit},
		{name: "timestamp_from_epoch_millis", opts: opts(t, optEventTimestamp, "ts"), row: outbox(set("ts", 20, "1700000000123")), wantAction: Emit},
		{name: "timestamp_null_is_processing_time", opts: opts(t, optEventTimestamp, "ts"), row: outbox(set("ts", 1184, nil)), wantAction: Emit},
		{name: "timestamp_bad_is_error", opts: opts(t, optEventTimestamp, "ts"), row: outbox(set("ts", 1184, "infinity")), wantErr: ErrBadTimestamp, wantColumn: "ts"},
		{name: "timestamp_missing_column_is_error", opts: opts(t, optEventTimestamp, "ts"), row: outbox(), wantErr: ErrMissingColumn, wantColumn: "ts"},
	}
}

func TestRoute(t *testing.T) {
	runRouteCases(t, routeCases(t))
}

// runRouteCases runs each case through a new Router, compares the result
// with the case's golden file and asserts the case's want fields.
func runRouteCases(t *testing.T, cases []routeCase) {
	t.Helper()
	seen := map[string]bool{}
	for _, tc := range cases {
		if seen[tc.name] {
			t.Fatalf("two cases named %s share a golden file", tc.name)
		}
		seen[tc.name] = true
		t.Run(tc.name, func(t *testing.T) {
			r, err := New(tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			var rec Record
			a, err := r.Route(tc.row, testNow, &rec)
			checkGolden(t, tc.name, toGolden(a, &rec, err))

			if tc.wantErr != nil {
				var re *RowError
				if !errors.Is(err, tc.wantErr) || !errors.As(err, &re) {
					t.Fatalf("err = %v, want a *RowError of class %v", err, tc.wantErr)
				}
				if re.Column != tc.wantColumn {
					t.Errorf("RowError.Column = %q, want %q", re.Column, tc.wantColumn)
				}
				if re.Table != tc.row.Table {
					t.Errorf("RowError.Table = %q, want %q", re.Table, tc.row.Table)
				}
				if tc.wantColumn != "" && !strings.Contains(err.Error(), `"`+tc.wantColumn+`"`) {
					t.Errorf("error %q does not name column %q", err, tc.wantColumn)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if a != tc.wantAction {
				t.Fatalf("action = %v, want %v", a, tc.wantAction)
			}
			if !a.Emits() {
				if rec.Topic != "" || rec.Value != nil || len(rec.Headers) != 0 {
					t.Errorf("dropped row left a record: %+v", rec)
				}
				if (a == DropWarn || a == DropError) && rec.Reason == "" {
					t.Error("drop without a reason")
				}
				return
			}
			switch {
			case a == Emit && rec.Reason != "":
				t.Errorf("Emit with a reason: %q", rec.Reason)
			case a == EmitWarn && rec.Reason == "":
				t.Error("EmitWarn without a reason")
			case !strings.Contains(rec.Reason, tc.wantReason):
				t.Errorf("reason = %q, want it to contain %q", rec.Reason, tc.wantReason)
			}
			if tc.wantTopic != "" && rec.Topic != tc.wantTopic {
				t.Errorf("topic = %q, want %q", rec.Topic, tc.wantTopic)
			}
			checkBytes(t, "key", rec.Key, tc.wantKey, nilKey)
			checkBytes(t, "value", rec.Value, tc.wantValue, tombstone)
			// id comes after Debezium's extended and tracing headers only.
			ids := 0
			for i, h := range rec.Headers {
				if h.Key == "id" {
					ids++
					for _, before := range rec.Headers[:i] {
						if !strings.HasPrefix(before.Key, "__debezium.context.") && before.Key != "traceparent" && before.Key != "tracestate" {
							t.Errorf("header %q before id", before.Key)
						}
					}
				}
			}
			if ids != 1 {
				t.Errorf("headers = %v, want one id", rec.Headers)
			}
			if tc.check != nil {
				tc.check(t, &rec)
			}
		})
	}
}

func checkBytes(t *testing.T, what string, got []byte, want, wantNil *string) {
	t.Helper()
	switch {
	case want == nil:
	case want == wantNil:
		if got != nil {
			t.Errorf("%s = %q, want nil", what, got)
		}
	case got == nil:
		t.Errorf("%s = nil, want %q", what, *want)
	case string(got) != *want:
		t.Errorf("%s = %q, want %q", what, got, *want)
	}
}

func TestWorkedExample(t *testing.T) {
	r, err := New(DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	row := outbox()
	var rec Record
	a, err := r.Route(row, testNow, &rec)
	if err != nil || a != Emit {
		t.Fatalf("Route = %v, %v", a, err)
	}
	if rec.Topic != "outbox.event.Order" || string(rec.Key) != "1" || string(rec.Value) != `{"total":12}` ||
		len(rec.Headers) != 1 || rec.Headers[0].Key != "id" || string(rec.Headers[0].Value) != eventID ||
		rec.Partition != -1 || !rec.Timestamp.Equal(testNow) || string(rec.EventID) != eventID {
		t.Errorf("record = %+v", rec)
	}
	// No copies: the record aliases the row's bytes.
	if &rec.Key[0] != &row.Values[2][0] || &rec.Value[0] != &row.Values[4][0] || &rec.Headers[0].Value[0] != &row.Values[0][0] {
		t.Error("record does not alias the row's values")
	}
}

func TestRouteResetsReusedRecord(t *testing.T) {
	r, err := New(opts(t, optAdditionalPlacement, "type:header:eventType,shard:partition", optAdditionalMissing, "ignore"))
	if err != nil {
		t.Fatal(err)
	}
	var rec Record
	if _, err := r.Route(outbox(set("shard", 23, "5")), testNow, &rec); err != nil {
		t.Fatal(err)
	}
	backing := &rec.Headers[:1][0]
	if _, err := r.Route(outbox(val("aggregateid", nil)), testNow, &rec); err != nil {
		t.Fatal(err)
	}
	if rec.Partition != -1 || rec.Key != nil || len(rec.Headers) != 2 {
		t.Errorf("stale fields after reuse: %+v", rec)
	}
	if &rec.Headers[0] != backing {
		t.Error("headers backing array was not reused")
	}
	a, err := r.Route(outbox(op(OpUpdate)), testNow, &rec)
	if err != nil || a != DropWarn {
		t.Fatalf("Route = %v, %v", a, err)
	}
	if rec.Topic != "" || rec.Value != nil || len(rec.Headers) != 0 || string(rec.EventID) != eventID || rec.Reason == "" {
		t.Errorf("drop record = %+v", rec)
	}
}

func TestRouteAllocatesNothingWithDefaults(t *testing.T) {
	r, err := New(DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	row := outbox()
	var rec Record
	if _, err := r.Route(row, testNow, &rec); err != nil { // warm the caches
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(1000, func() {
		if _, err := r.Route(row, testNow, &rec); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("Route allocated %v times per row, want 0", allocs)
	}
	// A header placement and a new Row value with equal names allocate
	// nothing either.
	r, err = New(opts(t, optAdditionalPlacement, "type:header:eventType"))
	if err != nil {
		t.Fatal(err)
	}
	rows := []*Row{outbox(), outbox(val("aggregatetype", "Customer"))}
	for _, row := range rows {
		if _, err := r.Route(row, testNow, &rec); err != nil {
			t.Fatal(err)
		}
	}
	i := 0
	allocs = testing.AllocsPerRun(1000, func() {
		i++
		if _, err := r.Route(rows[i%2], testNow, &rec); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("Route with a header placement allocated %v times per row, want 0", allocs)
	}
}

func TestTopicCacheIsBounded(t *testing.T) {
	r, err := New(DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	var rec Record
	for i := range maxTopics*2 + 10 {
		v := "agg" + strings.Repeat("x", i%7) + itoa(i)
		if _, err := r.Route(outbox(val("aggregatetype", v)), testNow, &rec); err != nil {
			t.Fatal(err)
		}
		if rec.Topic != "outbox.event."+v {
			t.Fatalf("topic = %q for %q", rec.Topic, v)
		}
		if len(r.topics) > maxTopics {
			t.Fatalf("topic cache holds %d entries, bound is %d", len(r.topics), maxTopics)
		}
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

func TestColumnLookupFollowsReusedNamesArray(t *testing.T) {
	// A caller may reuse one Names backing array for different column
	// lists; positions must follow the contents, not the pointer.
	r, err := New(DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	row := outbox()
	var rec Record
	if _, err := r.Route(row, testNow, &rec); err != nil {
		t.Fatal(err)
	}
	// Same array, columns swapped.
	row.Names[1], row.Names[2] = row.Names[2], row.Names[1]
	row.Values[1], row.Values[2] = row.Values[2], row.Values[1]
	if _, err := r.Route(row, testNow, &rec); err != nil {
		t.Fatal(err)
	}
	if rec.Topic != "outbox.event.Order" || string(rec.Key) != "1" {
		t.Errorf("stale column positions: topic %q key %q", rec.Topic, rec.Key)
	}
	// Many distinct column lists keep the layout cache bounded.
	for i := range maxLayouts * 3 {
		row := outbox(set("extra"+itoa(i), 25, "x"))
		if _, err := r.Route(row, testNow, &rec); err != nil {
			t.Fatal(err)
		}
		if len(r.layouts) > maxLayouts {
			t.Fatalf("layout cache holds %d entries, bound is %d", len(r.layouts), maxLayouts)
		}
	}
}

func TestRowErrorMessage(t *testing.T) {
	r, err := New(DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	var rec Record
	_, err = r.Route(outbox(val("aggregatetype", nil)), testNow, &rec)
	want := `route public.outbox row id ` + eventID + ` column "aggregatetype": router: routing value is NULL`
	if err == nil || err.Error() != want {
		t.Errorf("error = %v\nwant    %s", err, want)
	}
}

func TestStrings(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{OpInsert.String(), "INSERT"}, {OpUpdate.String(), "UPDATE"}, {OpDelete.String(), "DELETE"}, {Op(9).String(), "Op(9)"},
		{Emit.String(), "emit"}, {Drop.String(), "drop"}, {DropWarn.String(), "drop-warn"}, {DropError.String(), "drop-error"}, {EmitWarn.String(), "emit-warn"}, {Action(0).String(), "Action(0)"},
	} {
		if c.got != c.want {
			t.Errorf("%q, want %q", c.got, c.want)
		}
	}
}

func TestLongRoutingValueIsNotCached(t *testing.T) {
	r, err := New(opts(t, optRouteTopicRegex, `(?<v>[a-z]+)-.*`, optRouteReplacement, "t.${v}"))
	if err != nil {
		t.Fatal(err)
	}
	var rec Record
	long := "abc-" + strings.Repeat("x", maxCachedRoutingValue)
	for range 2 {
		if _, err := r.Route(outbox(val("aggregatetype", long)), testNow, &rec); err != nil {
			t.Fatal(err)
		}
		if rec.Topic != "t.abc" {
			t.Errorf("topic = %q, want t.abc", rec.Topic)
		}
	}
	if len(r.topics) != 0 {
		t.Errorf("a %d-byte routing value was cached", len(long))
	}
}
