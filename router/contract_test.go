package router

import (
	"reflect"
	"strings"
	"testing"
)

// TestContractWorkedExampleUnderEveryEncoding routes the contract's worked
// example (id=406c07f3-…, aggregatetype=Order, aggregateid=1,
// type=OrderCreated, payload={"total":12}) with the default options under
// every key and value encoding. The topic and the id header never change;
// the key and value bytes are pgoutbox's raw bytes or exactly what Kafka
// Connect's converters write for Debezium's record.
func TestContractWorkedExampleUnderEveryEncoding(t *testing.T) {
	// As PostgreSQL sends a jsonb value: its own normalised text.
	pgJSONB := outbox(set("payload", 3802, `{"total": 12}`))
	cases := []struct {
		name     string
		opts     Options
		row      *Row
		key, val string
	}{
		{"contract_worked_example_raw", DefaultOptions(), outbox(), "1", `{"total":12}`},
		{"contract_worked_example_raw_expanded", opts(t, optExpandJSONPayload, "true"), outbox(), "1", `{"total":12}`},
		{"contract_worked_example_string_converter", opts(t, optKeyConverter, stringConv, optValueConverter, stringConv), outbox(), "1", `{"total":12}`},
		{"contract_worked_example_json_converter", jsonBoth(t), outbox(), `"1"`, `"{\"total\":12}"`},
		{"contract_worked_example_json_converter_expanded", jsonBoth(t, optExpandJSONPayload, "true"), outbox(), `"1"`, `{"total":12}`},
		{"contract_worked_example_raw_key_json_value", jsonValue(t), outbox(), "1", `"{\"total\":12}"`},
		{"contract_worked_example_pg_jsonb_raw", DefaultOptions(), pgJSONB, "1", `{"total": 12}`},
		{"contract_worked_example_pg_jsonb_raw_expanded", opts(t, optExpandJSONPayload, "true"), pgJSONB, "1", `{"total":12}`},
		{"contract_worked_example_pg_jsonb_json_converter", jsonBoth(t), pgJSONB, `"1"`, `"{\"total\": 12}"`},
		{"contract_worked_example_pg_jsonb_json_converter_expanded", jsonBoth(t, optExpandJSONPayload, "true"), pgJSONB, `"1"`, `{"total":12}`},
	}
	var rcs []routeCase
	for _, c := range cases {
		rcs = append(rcs, routeCase{name: c.name, opts: c.opts, row: c.row, wantAction: Emit,
			wantTopic: "outbox.event.Order", wantKey: str(c.key), wantValue: str(c.val),
			check: func(t *testing.T, rec *Record) {
				if len(rec.Headers) != 1 || string(rec.Headers[0].Value) != eventID || rec.Partition != -1 || !rec.Timestamp.Equal(testNow) {
					t.Errorf("record = %+v", rec)
				}
			}})
	}
	runRouteCases(t, rcs)
}

// optionDefaultCases has, for every option, a row that shows what the
// option's default does, and the default as a string for Options.Set.
// TestOptionDefaults runs each with DefaultOptions and with the default
// set explicitly, and both must give the golden result.
func optionDefaultCases(t testing.TB) map[string]struct {
	value string // the default, as Set takes it; "-" when it cannot be set (unset *bool)
	row   *Row
	check func(t *testing.T, a Action, rec *Record, err error)
} {
	emit := func(topic, key, value string, headers ...string) func(t *testing.T, a Action, rec *Record, err error) {
		return func(t *testing.T, a Action, rec *Record, err error) {
			t.Helper()
			if err != nil || a != Emit {
				t.Fatalf("Route = %v, %v", a, err)
			}
			var hs []string
			for _, h := range rec.Headers {
				hs = append(hs, h.Key+"="+string(h.Value))
			}
			if rec.Topic != topic || string(rec.Key) != key || string(rec.Value) != value || strings.Join(hs, ",") != strings.Join(headers, ",") {
				t.Errorf("record %q %q %q %v, want %q %q %q %v", rec.Topic, rec.Key, rec.Value, hs, topic, key, value, headers)
			}
		}
	}
	idHeader := "id=" + eventID
	type entry = struct {
		value string
		row   *Row
		check func(t *testing.T, a Action, rec *Record, err error)
	}
	return map[string]entry{
		optEventID: {"id", outbox(), emit("outbox.event.Order", "1", `{"total":12}`, idHeader)},
		optEventKey: {"aggregateid", outbox(val("aggregateid", "k-7")),
			emit("outbox.event.Order", "k-7", `{"total":12}`, idHeader)},
		optEventType: {"type", outbox(), emit("outbox.event.Order", "1", `{"total":12}`, idHeader)}, // not emitted by itself
		optEventPayload: {"payload", outbox(val("payload", `{"other":1}`)),
			emit("outbox.event.Order", "1", `{"other":1}`, idHeader)},
		optEventTimestamp: {"", outbox(set("ts", 1184, "2020-01-01 00:00:00+00")), func(t *testing.T, a Action, rec *Record, err error) {
			if err != nil || !rec.Timestamp.Equal(testNow) {
				t.Errorf("timestamp %v, %v; want the processing time", rec.Timestamp, err)
			}
		}},
		optAdditionalPlacement: {"", outbox(), emit("outbox.event.Order", "1", `{"total":12}`, idHeader)},
		optAdditionalMissing:   {"error", outbox(), nil}, // shown with a placement in missing_additional_column_is_error_by_default
		optErrorOnMissing:      {"-", outbox(), nil},
		optOpInvalidBehavior: {"warn", outbox(op(OpUpdate)), func(t *testing.T, a Action, rec *Record, err error) {
			if err != nil || a != DropWarn {
				t.Errorf("UPDATE: %v, %v; want drop-warn", a, err)
			}
		}},
		optExpandJSONPayload: {"false", outbox(set("payload", 3802, `{"a": null}`)),
			emit("outbox.event.Order", "1", `{"a": null}`, idHeader)},
		optJSONNullBehavior: {"ignore", outbox(set("payload", 3802, `{"a": null}`)),
			emit("outbox.event.Order", "1", `{"a": null}`, idHeader)}, // matters only with expansion: see expand_raw_jsonb_compacts_and_drops_nulls
		optRouteByField: {"aggregatetype", outbox(val("aggregatetype", "Customer")),
			emit("outbox.event.Customer", "1", `{"total":12}`, idHeader)},
		optRouteTopicRegex: {"(?<routedByValue>.*)", outbox(val("aggregatetype", "a.B-c_9")),
			emit("outbox.event.a.B-c_9", "1", `{"total":12}`, idHeader)},
		optRouteReplacement: {"outbox.event.${routedByValue}", outbox(), emit("outbox.event.Order", "1", `{"total":12}`, idHeader)},
		optTombstoneOnEmpty: {"false", outbox(val("payload", nil)), emit("outbox.event.Order", "1", "", idHeader)},
		optEventTrace: {"", outbox(set("traceparent", 25, traceOK)),
			emit("outbox.event.Order", "1", `{"total":12}`, idHeader)},
		optRouteTopic: {"", outbox(), emit("outbox.event.Order", "1", `{"total":12}`, idHeader)},
		optKeyConverter: {"raw", outbox(set("aggregateid", 17, `\x6b31`)),
			emit("outbox.event.Order", "k1", `{"total":12}`, idHeader)},
		optValueConverter: {"raw", outbox(set("payload", 17, `\x6869`)),
			emit("outbox.event.Order", "1", "hi", idHeader)},
		optSchemaVersion: {"", outbox(set("version", 25, "not a number")),
			emit("outbox.event.Order", "1", `{"total":12}`, idHeader)}, // the column is not read
		optTracingContext: {"", outbox(set("tracingspancontext", 25, "traceparent="+traceOK)),
			emit("outbox.event.Order", "1", `{"total":12}`, idHeader)}, // no tracing headers
		optExtendedHeaders: {"false", outbox(), emit("outbox.event.Order", "1", `{"total":12}`, idHeader)}, // no __debezium.context.* headers
		optLogicalName:     {"", outbox(), emit("outbox.event.Order", "1", `{"total":12}`, idHeader)},
		optRunID:           {"", outbox(), emit("outbox.event.Order", "1", `{"total":12}`, idHeader)},
		optHeaderConverter: {"raw", outbox(set("id", 17, `\x6964`)),
			emit("outbox.event.Order", "1", `{"total":12}`, "id=id")}, // a bytea id as its bytes
		optHeaderSchemas:      {"-", outbox(), emit("outbox.event.Order", "1", `{"total":12}`, idHeader)},
		optKeySchemasEnable:   {"-", outbox(), emit("outbox.event.Order", "1", `{"total":12}`, idHeader)},
		optValueSchemasEnable: {"-", outbox(), emit("outbox.event.Order", "1", `{"total":12}`, idHeader)},
	}
}

func TestOptionDefaults(t *testing.T) {
	cases := optionDefaultCases(t)
	typ := reflect.TypeFor[Options]()
	for i := range typ.NumField() {
		if _, ok := cases[typ.Field(i).Tag.Get("yaml")]; !ok {
			t.Errorf("option %s has no default case", typ.Field(i).Tag.Get("yaml"))
		}
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			golden := "option_default_" + strings.ReplaceAll(name, ".", "_")
			r, err := New(DefaultOptions())
			if err != nil {
				t.Fatal(err)
			}
			var rec Record
			a, err := r.Route(c.row, testNow, &rec)
			checkGolden(t, golden, toGolden(a, &rec, err))
			if c.check != nil {
				c.check(t, a, &rec, err)
			}
			if c.value == "-" {
				return
			}
			o := DefaultOptions()
			if err := o.Set(name, c.value); err != nil {
				t.Fatal(err)
			}
			if o != DefaultOptions() {
				t.Errorf("Set(%q, %q) changed the options: %+v", name, c.value, o)
			}
			r2, err := New(o)
			if err != nil {
				t.Fatal(err)
			}
			var rec2 Record
			a2, err2 := r2.Route(c.row, testNow, &rec2)
			if !reflect.DeepEqual(toGolden(a, &rec, err), toGolden(a2, &rec2, err2)) {
				t.Errorf("explicit default %s=%q routes differently", name, c.value)
			}
		})
	}
}
