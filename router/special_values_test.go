package router

import (
	"testing"
)

// TestNumericNaNAndInfinityAreNullAsDebeziumWritesThem: a Decimal cannot
// hold a numeric's NaN or infinities, and a real Debezium 3.6.1 makes such
// a column null wherever it goes (a Kafka null key under StringConverter,
// null under JsonConverter, a null header, null in the envelope) and goes
// on. pgoutbox made the row poison, saying Debezium's task stops on it,
// which it does not (a black-box review against it: t4/t5, keys and
// placements). Expected bytes are the review's, read from Debezium's
// records.
func TestNumericNaNAndInfinityAreNullAsDebeziumWritesThem(t *testing.T) {
	const amount = 1700
	mod12_2 := int32(10<<16 | 2 + 4)
	row := func(v string, mod int32) *Row {
		r := outbox(set("aggregateid", amount, v))
		r.Mods = []int32{-1, -1, mod, -1, -1}
		return r
	}
	var cases []routeCase
	for _, v := range []string{"NaN", "Infinity", "-Infinity"} {
		for _, m := range []struct {
			name string
			mod  int32
		}{{"numeric", -1}, {"numeric_10_2", mod12_2}} {
			place := "aggregateid:header,aggregateid:envelope:agg"
			hdr := []string{optHeaderConverter, ConverterHeader, optAdditionalPlacement, place}
			cases = append(cases,
				routeCase{name: m.name + "_" + v + "_json_key", opts: jsonBoth(t, hdr...), row: row(v, m.mod),
					wantAction: Emit, wantTopic: "outbox.event.Order", wantKey: str("null"), wantValue: str(`{"payload":"{\"total\":12}","agg":null}`),
					check: nullHeader("aggregateid")},
				routeCase{name: m.name + "_" + v + "_string_key", opts: jsonValue(t, append([]string{optKeyConverter, stringConv}, hdr...)...), row: row(v, m.mod),
					wantAction: Emit, wantKey: nilKey, wantValue: str(`{"payload":"{\"total\":12}","agg":null}`), check: nullHeader("aggregateid")},
			)
		}
	}
	// Not a number PostgreSQL prints: still an error.
	cases = append(cases, routeCase{name: "numeric_garbage", opts: jsonBoth(t), row: row("1.2.3", -1), wantAction: Emit, wantErr: ErrBadValue, wantColumn: "aggregateid"})
	runRouteCases(t, cases)
}

// TestTimestampBeforeTheEpochIsPoison: Kafka's record timestamps start at
// 1970-01-01; the producer cannot encode an earlier one ("invalid
// timestamp"), which the relay took for a failure to retry and restarted
// on without end (a black-box review; Debezium's task fails on it with
// InvalidRecordException). It is a bad timestamp, poison, naming the
// column.
func TestTimestampBeforeTheEpochIsPoison(t *testing.T) {
	o := opts(t, optEventTimestamp, "ts")
	runRouteCases(t, []routeCase{
		{name: "timestamp_1960", opts: o, row: outbox(set("ts", oidTimestamp, "1960-01-01 00:00:00")), wantAction: Emit, wantErr: ErrBadTimestamp, wantColumn: "ts"},
		{name: "epoch_millis_negative", opts: o, row: outbox(set("ts", oidInt8, "-1")), wantAction: Emit, wantErr: ErrBadTimestamp, wantColumn: "ts"},
		{name: "timestamp_epoch", opts: o, row: outbox(set("ts", oidTimestamp, "1970-01-01 00:00:00")), wantAction: Emit,
			check: func(t *testing.T, rec *Record) {
				if rec.Timestamp.UnixMilli() != 0 {
					t.Errorf("timestamp %v, want the epoch", rec.Timestamp)
				}
			}},
	})
}

// nullHeader checks that the record has header name with a null value.
func nullHeader(name string) func(t *testing.T, rec *Record) {
	return func(t *testing.T, rec *Record) {
		t.Helper()
		for _, h := range rec.Headers {
			if h.Key == name {
				if h.Value != nil {
					t.Errorf("header %s = %q, want a null value", name, h.Value)
				}
				return
			}
		}
		t.Errorf("no header %s in %v", name, rec.Headers)
	}
}
