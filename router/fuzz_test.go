package router

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

// fuzzOptionSets are the option sets FuzzRoute routes with; its first byte
// chooses one.
var fuzzOptionSets = []func(*Options){
	func(*Options) {},
	func(o *Options) {
		o.RouteTopicRegex = `(?<domain>[a-z]+)_(?<version>v\d+)`
		o.RouteTopicReplacement = "events.${domain}.$2"
		o.AdditionalPlacement = "type:header:eventType,aggregateid:envelope:agg,shard:partition"
		o.AdditionalMissing = "ignore"
		o.EventTimestampField = "ts"
		o.RouteTombstoneOnEmptyPayload = true
	},
	func(o *Options) {
		o.RouteTopicRegex = `(\w+)\.(\w+)`
		o.RouteTopicReplacement = `$2-$1\.x`
		o.AdditionalPlacement = "type:header,ts:header:when"
		o.OpInvalidBehavior = "fatal"
	},
	func(o *Options) {
		o.AdditionalPlacement = "type:envelope:eventType,ts:envelope,shard:envelope,id:envelope:eventId"
		o.OpInvalidBehavior = "error"
		f := false
		o.AdditionalErrorOnMissing = &f
	},
	// pgoutbox's own options and the Kafka Connect encodings.
	func(o *Options) { // raw expansion, trace, tombstones
		o.ExpandJSONPayload = true
		o.EventTraceField = "type"
		o.RouteTombstoneOnEmptyPayload = true
		o.AdditionalMissing = "ignore"
	},
	func(o *Options) { // JsonConverter, expanded into an envelope, nulls kept
		o.KeyConverter, o.KeyConverterSchemasEnable = ConverterJSON, new(false)
		o.ValueConverter, o.ValueConverterSchemasEnable = ConverterJSON, new(false)
		o.ExpandJSONPayload = true
		o.JSONPayloadNullBehavior = "optional_bytes"
		o.AdditionalPlacement = "type:envelope:eventType,shard:envelope,ts:header"
		o.AdditionalMissing = "ignore"
	},
	func(o *Options) { // JsonConverter, expanded, topics by table
		o.KeyConverter, o.KeyConverterSchemasEnable = ConverterJSON, new(false)
		o.ValueConverter, o.ValueConverterSchemasEnable = ConverterJSON, new(false)
		o.ExpandJSONPayload = true
		o.RouteTopicReplacement = "${table}.${routedByValue}"
		o.EventTraceField = "ts"
	},
	func(o *Options) { // StringConverter, fixed topic
		o.KeyConverter, o.ValueConverter = ConverterString, ConverterString
		o.RouteTopic = "orders"
		o.EventTraceField = "ts"
		o.AdditionalMissing = "ignore"
	},
	func(o *Options) { // JsonConverter values, raw keys
		o.ValueConverter, o.ValueConverterSchemasEnable = ConverterJSON, new(false)
		o.RouteTombstoneOnEmptyPayload = true
	},
}

// fuzzTypes are the type OIDs a column can get; the fuzzer picks by index.
var fuzzTypes = []uint32{0, 25, 1043, 2950, 3802, 114, 17, 20, 21, 23, 16, 700, 701, 1700, 1114, 1184, 26}

// fuzzRow builds a row: names is a comma-separated column list, values are
// separated by 0 bytes, types[i] picks column i's type, bit i of nulls makes
// column i NULL. Unless keepShape is set, values are cut or padded to the
// number of names.
func fuzzRow(opByte byte, names string, values, types []byte, nulls uint16, keepShape bool) *Row {
	row := &Row{Table: "public.outbox", Op: Op(opByte % 5)}
	if names != "" {
		row.Names = strings.Split(names, ",")
	}
	if len(row.Names) > 16 {
		row.Names = row.Names[:16]
	}
	row.Values = bytes.Split(values, []byte{0})
	if !keepShape {
		for len(row.Values) < len(row.Names) {
			row.Values = append(row.Values, []byte{})
		}
		row.Values = row.Values[:len(row.Names)]
	}
	for i := range row.Values {
		if i < 16 && nulls&(1<<i) != 0 {
			row.Values[i] = nil
		}
	}
	for i := range min(len(types), len(row.Names)) {
		row.Types = append(row.Types, fuzzTypes[int(types[i])%len(fuzzTypes)])
	}
	return row
}

func FuzzRoute(f *testing.F) {
	f.Add(byte(0), byte(1), "id,aggregatetype,aggregateid,type,payload", []byte("406c07f3-26f0-4eea-a50c-109940064b8f\x00Order\x001\x00OrderCreated\x00{\"total\":12}"), []byte{3, 2, 2, 2, 4}, uint16(0))
	f.Add(byte(1), byte(1), "id,aggregatetype,aggregateid,type,payload,shard,ts", []byte("1\x00order_v2\x00k\x00T\x00\\x0a0b\x007\x002024-01-02 03:04:05.5+01"), []byte{7, 1, 1, 1, 6, 9, 15}, uint16(0))
	f.Add(byte(2), byte(2), "id,aggregatetype,aggregateid,type,payload,ts", []byte("1\x00a.b\x00k\x00T\x00x\x00y"), []byte{}, uint16(4))

	routers := make([]*Router, len(fuzzOptionSets))
	optionSets := make([]Options, len(fuzzOptionSets))
	for i, mod := range fuzzOptionSets {
		o := DefaultOptions()
		mod(&o)
		r, err := New(o)
		if err != nil {
			f.Fatalf("option set %d: %v", i, err)
		}
		routers[i], optionSets[i] = r, o
	}

	f.Fuzz(func(t *testing.T, set, opByte byte, names string, values, types []byte, nulls uint16) {
		i := int(set&0x7f) % len(routers)
		row := fuzzRow(opByte, names, values, types, nulls, set&0x80 != 0)

		// A long-lived router (warm caches) and a fresh one must agree.
		var rec, fresh Record
		a, err := routers[i].Route(row, testNow, &rec)
		r2, _ := New(optionSets[i])
		a2, err2 := r2.Route(row, testNow, &fresh)
		if (err == nil) != (err2 == nil) || a != a2 {
			t.Fatalf("cached router: %v, %v; fresh router: %v, %v", a, err, a2, err2)
		}
		if err != nil {
			var re *RowError
			if !errors.As(err, &re) || re.Err == nil || err.Error() != err2.Error() {
				t.Fatalf("error %v (fresh: %v) is not a *RowError with a class", err, err2)
			}
			return
		}
		switch a {
		case Drop, DropWarn, DropError:
			if row.Op == OpInsert {
				t.Fatalf("INSERT dropped: %v", a)
			}
			return
		case Emit:
			if rec.Reason != "" {
				t.Fatalf("Emit with reason %q", rec.Reason)
			}
		case EmitWarn:
			if rec.Reason == "" {
				t.Fatal("EmitWarn without a reason")
			}
		default:
			t.Fatalf("unknown action %v", a)
		}
		o := optionSets[i]
		if row.Op != OpInsert {
			t.Fatalf("%v emitted", row.Op)
		}
		if !validTopic(rec.Topic) {
			t.Fatalf("invalid topic %q", rec.Topic)
		}
		if len(rec.Headers) == 0 || rec.Headers[0].Key != "id" {
			t.Fatalf("headers %v do not start with id", rec.Headers)
		}
		if rec.Partition < -1 {
			t.Fatalf("partition %d", rec.Partition)
		}
		if rec.Value == nil && !o.RouteTombstoneOnEmptyPayload && o.ValueConverter != ConverterString {
			t.Fatal("tombstone without route.tombstone.on.empty.payload")
		}
		if o.RouteTopic != "" && rec.Topic != o.RouteTopic {
			t.Fatalf("topic %q, want the fixed %q", rec.Topic, o.RouteTopic)
		}
		if o.ValueConverter == ConverterJSON && rec.Value != nil && !json.Valid(rec.Value) {
			t.Fatalf("JsonConverter value %q is not JSON", rec.Value)
		}
		if o.KeyConverter == ConverterJSON && rec.Key != nil && !json.Valid(rec.Key) {
			t.Fatalf("JsonConverter key %q is not JSON", rec.Key)
		}
		if o.ExpandJSONPayload && a == Emit && rec.Value != nil && len(rec.Value) > 0 && (rec.Value[0] == '{' || rec.Value[0] == '[') && !json.Valid(rec.Value) {
			t.Fatalf("expanded value %q is not JSON", rec.Value)
		}
		for _, h := range rec.Headers {
			if h.Key == "traceparent" && !validTraceparent(h.Value) {
				t.Fatalf("invalid traceparent header %q", h.Value)
			}
		}
		if rec.Topic != fresh.Topic || !bytes.Equal(rec.Key, fresh.Key) || (rec.Key == nil) != (fresh.Key == nil) ||
			!bytes.Equal(rec.Value, fresh.Value) || (rec.Value == nil) != (fresh.Value == nil) ||
			rec.Partition != fresh.Partition || !rec.Timestamp.Equal(fresh.Timestamp) || len(rec.Headers) != len(fresh.Headers) || rec.Reason != fresh.Reason {
			t.Fatalf("cached router gave %+v, fresh router %+v", rec, fresh)
		}
		for j, h := range rec.Headers {
			if h.Key != fresh.Headers[j].Key || !bytes.Equal(h.Value, fresh.Headers[j].Value) {
				t.Fatalf("header %d: %v vs %v", j, h, fresh.Headers[j])
			}
		}
	})
}

// FuzzExpandJSON checks the JSON parser against encoding/json: it accepts
// only valid JSON, rejects valid JSON only for Jackson's limits and for
// unpaired surrogate escapes, and its raw rendering means the same as the
// input with null members dropped (or kept). The JsonConverter rendering,
// when the conversion succeeds, is valid JSON.
func FuzzExpandJSON(f *testing.F) {
	for _, s := range []string{`{"total":12}`, `{"a": [1, null, {"b": null}], "a": "\u00e9"}`, `[{"x":1},{"y":2.5e3}]`, `{"s":"\ud83d\ude00"}`, ` [] `} {
		f.Add([]byte(s), false)
	}
	f.Fuzz(func(t *testing.T, in []byte, keepNulls bool) {
		d := jsonDoc{keepNulls: keepNulls}
		ok := d.parse(in)
		i := skipJSONSpace(in, 0)
		goValid := json.Valid(in) && i < len(in) && (in[i] == '{' || in[i] == '[')
		switch {
		case ok && !goValid:
			t.Fatalf("accepted invalid JSON %q", in)
		case !ok && goValid:
			lower := bytes.ToLower(in)
			if len(in) <= maxJSONNumberLen && !bytes.Contains(lower, []byte(`\ud`)) {
				t.Fatalf("rejected valid JSON %q", in)
			}
			return
		case !ok:
			return
		}
		out := d.appendRaw(nil, 0)
		want, got := decodeJSON(t, in, !keepNulls), decodeJSON(t, out, false)
		if !reflect.DeepEqual(want, got) {
			t.Fatalf("raw rendering of %q is %q:\n got %#v\nwant %#v", in, out, got, want)
		}
		if c, res := d.appendConnect(nil); res == connectOK && !json.Valid(c) {
			t.Fatalf("connect rendering of %q is not JSON: %q", in, c)
		}
	})
}

// decodeJSON decodes b with numbers as written, dropping null object
// members when dropNulls.
func decodeJSON(t *testing.T, b []byte, dropNulls bool) any {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("decode %q: %v", b, err)
	}
	var walk func(v any) any
	walk = func(v any) any {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				if e == nil && dropNulls {
					delete(x, k)
					continue
				}
				x[k] = walk(e)
			}
		case []any:
			for i, e := range x {
				x[i] = walk(e)
			}
		}
		return v
	}
	return walk(v)
}
