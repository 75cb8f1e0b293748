package router

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// debeziumMessageOracle: logical decoding messages (prefix outbox,
// transactional) and the records a real Debezium 3.6.1.Final wrote for
// them with DecodeLogicalDecodingMessageContent before its EventRouter
// (StringConverter keys, JsonConverter values without schemas, the
// worker's SimpleHeaderConverter headers, extended headers on,
// errors.tolerance=all), captured by an outside oracle run on
// 2026-12-07 and pasted here unchanged (an array of objects with other
// members, whose merged field order differs between Debezium's runs, is
// left out). A nil value is no record: Debezium's task stops there
// (errors.tolerance=all skips it).
var debeziumMessageOracle = []struct {
	label, content string
	key, value, id []byte // nil: no record (Debezium skipped it, errors.tolerance=all)
}{
	{"m01", "{\"id\":\"a0000000-0000-0000-0000-000000000001\",\"aggregatetype\":\"order\",\"aggregateid\":\"o1\",\"type\":\"Created\",\"payload\":{\"x\":1,\"s\":\"t\"}}", []byte("o1"), []byte("{\"x\":1,\"s\":\"t\"}"), []byte("a0000000-0000-0000-0000-000000000001")},
	{"m02", "{\"id\":\"a0000000-0000-0000-0000-000000000002\",\"aggregatetype\":\"order\",\"aggregateid\":\"m02\",\"type\":\"Created\",\"payload\":\"{\\\"x\\\":1}\"}", []byte("m02"), []byte("\"{\\\"x\\\":1}\""), []byte("a0000000-0000-0000-0000-000000000002")},
	{"m03", "{\"id\":\"a0000000-0000-0000-0000-000000000003\",\"aggregatetype\":\"order\",\"aggregateid\":\"m03\",\"type\":\"Created\",\"payload\":\"hello\"}", []byte("m03"), []byte("\"hello\""), []byte("a0000000-0000-0000-0000-000000000003")},
	{"m04", "{\"id\":\"a0000000-0000-0000-0000-000000000004\",\"aggregatetype\":\"order\",\"aggregateid\":\"m04\",\"type\":\"Created\",\"payload\":null}", nil, nil, nil},
	{"m05", "{\"id\":\"a0000000-0000-0000-0000-000000000005\",\"aggregatetype\":\"order\",\"aggregateid\":\"m05\",\"type\":\"Created\"}", nil, nil, nil},
	{"m06", "{\"id\":\"a0000000-0000-0000-0000-000000000006\",\"aggregatetype\":\"order\",\"aggregateid\":\"m06\",\"type\":\"Created\",\"payload\":{}}", []byte("m06"), []byte("{}"), []byte("a0000000-0000-0000-0000-000000000006")},
	{"m07", "{\"id\":\"a0000000-0000-0000-0000-000000000007\",\"aggregatetype\":\"order\",\"aggregateid\":\"m07\",\"type\":\"Created\",\"payload\":[]}", nil, nil, nil},
	{"m08", "{\"id\":\"a0000000-0000-0000-0000-000000000008\",\"aggregatetype\":\"order\",\"aggregateid\":\"m08\",\"type\":\"Created\",\"payload\":[1,2]}", []byte("m08"), []byte("[1,2]"), []byte("a0000000-0000-0000-0000-000000000008")},
	{"m09", "{\"id\":\"a0000000-0000-0000-0000-000000000009\",\"aggregatetype\":\"order\",\"aggregateid\":\"m09\",\"type\":\"Created\",\"payload\":[{\"a\":1},{\"a\":2}]}", []byte("m09"), []byte("[{\"a\":1},{\"a\":2}]"), []byte("a0000000-0000-0000-0000-000000000009")},
	{"m10", "{\"id\":\"a0000000-0000-0000-0000-000000000010\",\"aggregatetype\":\"order\",\"aggregateid\":\"m10\",\"type\":\"Created\",\"payload\":[1,\"x\"]}", nil, nil, nil},
	{"m11", "{\"id\":\"a0000000-0000-0000-0000-000000000011\",\"aggregatetype\":\"order\",\"aggregateid\":\"m11\",\"type\":\"Created\",\"payload\":{\"l\":[]}}", []byte("m11"), []byte("{}"), []byte("a0000000-0000-0000-0000-000000000011")},
	{"m12", "{\"id\":\"a0000000-0000-0000-0000-000000000012\",\"aggregatetype\":\"order\",\"aggregateid\":\"m12\",\"type\":\"Created\",\"payload\":{\"i\":1,\"neg\":-5,\"big\":9223372036854775807,\"bigger\":92233720368547758070,\"f\":39.98,\"e\":1e300,\"small\":1.0E-7,\"z\":0,\"negz\":-0.0,\"fi\":2.0}}", nil, nil, nil},
	{"m13", "{\"id\":\"a0000000-0000-0000-0000-000000000013\",\"aggregatetype\":\"order\",\"aggregateid\":42,\"type\":\"Created\",\"payload\":{\"x\":1}}", []byte("42"), []byte("{\"x\":1}"), []byte("a0000000-0000-0000-0000-000000000013")},
	{"m14", "{\"id\":\"a0000000-0000-0000-0000-000000000014\",\"aggregatetype\":\"order\",\"aggregateid\":3.5,\"type\":\"Created\",\"payload\":{\"x\":1}}", []byte("3.5"), []byte("{\"x\":1}"), []byte("a0000000-0000-0000-0000-000000000014")},
	{"m15", "{\"id\":7,\"aggregatetype\":\"order\",\"aggregateid\":\"m15\",\"type\":\"Created\",\"payload\":{\"x\":1}}", []byte("m15"), []byte("{\"x\":1}"), []byte("7")},
	{"m16", "{\"payload\":{\"b\":2,\"a\":1},\"type\":\"T\",\"aggregateid\":\"m16\",\"aggregatetype\":\"order\",\"id\":\"a0000000-0000-0000-0000-000000000016\"}", []byte("m16"), []byte("{\"b\":2,\"a\":1}"), []byte("a0000000-0000-0000-0000-000000000016")},
	{"m17", "{\"id\":\"a0000000-0000-0000-0000-000000000017\",\"aggregatetype\":\"order\",\"aggregateid\":\"m17\",\"type\":\"Created\",\"payload\":{\"x\":1},\"extra\":\"x\"}", []byte("m17"), []byte("{\"x\":1}"), []byte("a0000000-0000-0000-0000-000000000017")},
	{"m18", "{\"id\":\"a0000000-0000-0000-0000-000000000018\",\"aggregatetype\":\"order\",\"aggregateid\":\"m18\",\"type\":null,\"payload\":{\"x\":1}}", []byte("m18"), []byte("{\"x\":1}"), []byte("a0000000-0000-0000-0000-000000000018")},
	{"m19", "{\"id\":\"a0000000-0000-0000-0000-000000000019\",\"aggregatetype\":\"order\",\"aggregateid\":\"m19\",\"type\":\"Created\",\"payload\":{\"flag\":true,\"off\":false,\"n\":null}}", []byte("m19"), []byte("{\"flag\":true,\"off\":false}"), []byte("a0000000-0000-0000-0000-000000000019")},
	{"m20", "{\"id\":\"a0000000-0000-0000-0000-000000000020\",\"aggregatetype\":\"order\",\"aggregateid\":\"m20\",\"type\":\"Created\",\"payload\":{\"a\":{\"b\":{\"c\":{\"d\":1,\"e\":\"s\"}}}}}", []byte("m20"), []byte("{\"a\":{\"b\":{\"c\":{\"d\":1,\"e\":\"s\"}}}}"), []byte("a0000000-0000-0000-0000-000000000020")},
	{"m21", "{\"id\":\"a0000000-0000-0000-0000-000000000021\",\"aggregatetype\":\"order\",\"aggregateid\":\"k21😀é\u2028\\\"\\\\\\u0001\",\"type\":\"Created\",\"payload\":{\"u\":\"😀é\u2028\\\"\\\\\\u0001\"}}", []byte("k21😀é\u2028\"\\\x01"), []byte("{\"u\":\"\\uD83D\\uDE00é\u2028\\\"\\\\\\u0001\"}"), []byte("a0000000-0000-0000-0000-000000000021")},
	{"m22", "{\"id\":\"a0000000-0000-0000-0000-000000000022\",\"aggregatetype\":\"order\",\"aggregateid\":\"k22\\u00e9\\ud83d\\ude00\",\"type\":\"Created\",\"payload\":{\"u\":\"\\u00e9\\ud83d\\ude00\\u2028\\t\\n\\/<>&\"}}", []byte("k22é😀"), []byte("{\"u\":\"é\\uD83D\\uDE00\u2028\\t\\n/<>&\"}"), []byte("a0000000-0000-0000-0000-000000000022")},
	{"x1", "not json", nil, nil, nil},
	{"x2", "[1]", nil, nil, nil},
	{"x3", "{}", nil, nil, nil},
	{"x4", "{\"id\":\"a0000000-0000-0000-0000-0000000000b4\",\"aggregateid\":\"x4\",\"type\":\"Created\",\"payload\":{\"x\":1}}", nil, nil, nil},
	{"x5", "{\"aggregatetype\":\"order\",\"aggregateid\":\"x5\",\"type\":\"Created\",\"payload\":{\"x\":1}}", nil, nil, nil},
	{"x6", "", nil, nil, nil},
	{"x7", "{\"id\":\"a0000000-0000-0000-0000-0000000000b7\",\"aggregatetype\":\"order\",\"type\":\"Created\",\"payload\":{\"x\":1}}", nil, nil, nil},
	{"n01", "{\"id\":\"b0000000-0000-0000-0000-000000000001\",\"aggregatetype\":\"order\",\"aggregateid\":\"n01\",\"type\":\"Created\",\"payload\":{\"i\":1,\"neg\":-5,\"big\":9223372036854775807,\"f\":39.98,\"e\":1e300,\"small\":1.0E-7,\"z\":0,\"negz\":-0.0,\"fi\":2.0}}", []byte("n01"), []byte("{\"i\":1,\"neg\":-5,\"big\":9223372036854775807,\"f\":39.98,\"e\":1.0E300,\"small\":1.0E-7,\"z\":0,\"negz\":-0.0,\"fi\":2.0}"), []byte("b0000000-0000-0000-0000-000000000001")},
	{"n02", "{\"id\":\"b0000000-0000-0000-0000-000000000002\",\"aggregatetype\":\"order\",\"aggregateid\":\"n02\",\"type\":\"Created\",\"payload\":{\"i32max\":2147483647,\"i32over\":2147483648,\"i32under\":-2147483649,\"i64min\":-9223372036854775808}}", []byte("n02"), []byte("{\"i32max\":2147483647,\"i32over\":2147483648,\"i32under\":-2147483649,\"i64min\":-9223372036854775808}"), []byte("b0000000-0000-0000-0000-000000000002")},
	{"n03", "{\"id\":\"b0000000-0000-0000-0000-000000000003\",\"aggregatetype\":\"order\",\"aggregateid\":\"n03\",\"type\":\"Created\",\"payload\":{\"a\":0.1,\"b\":1.23456789012345678901234567890,\"c\":1E2,\"d\":1e-5,\"e\":123456789012.5,\"f\":1.5e10,\"g\":0.001,\"h\":1e7,\"k\":12345678.9}}", []byte("n03"), []byte("{\"a\":0.1,\"b\":1.2345678901234567,\"c\":100.0,\"d\":1.0E-5,\"e\":1.234567890125E11,\"f\":1.5E10,\"g\":0.001,\"h\":1.0E7,\"k\":1.23456789E7}"), []byte("b0000000-0000-0000-0000-000000000003")},
	{"n04", "{\"id\":\"b0000000-0000-0000-0000-000000000004\",\"aggregatetype\":\"order\",\"aggregateid\":\"n04\",\"type\":\"Created\",\"payload\":[1,2.5]}", nil, nil, nil},
	{"n06", "{\"id\":\"b0000000-0000-0000-0000-000000000006\",\"aggregatetype\":\"order\",\"aggregateid\":\"n06\",\"type\":\"Created\",\"payload\":[1,null]}", []byte("n06"), []byte("[1,null]"), []byte("b0000000-0000-0000-0000-000000000006")},
	{"n07", "{\"id\":\"b0000000-0000-0000-0000-000000000007\",\"aggregatetype\":\"order\",\"aggregateid\":\"n07\",\"type\":\"Created\",\"payload\":[null]}", nil, nil, nil},
	{"n08", "{\"id\":\"b0000000-0000-0000-0000-000000000008\",\"aggregatetype\":\"order\",\"aggregateid\":\"n08\",\"type\":\"Created\",\"payload\":{\"a\":{\"b\":null},\"c\":{},\"d\":[[1,2],[3]],\"e\":[]}}", []byte("n08"), []byte("{\"a\":{},\"c\":{},\"d\":[[1,2],[3]]}"), []byte("b0000000-0000-0000-0000-000000000008")},
	{"n09", "{\"id\":\"b0000000-0000-0000-0000-000000000009\",\"aggregatetype\":\"order\",\"aggregateid\":\"n09\",\"type\":\"Created\",\"payload\":5}", []byte("n09"), []byte("5"), []byte("b0000000-0000-0000-0000-000000000009")},
	{"n10", "{\"id\":\"b0000000-0000-0000-0000-000000000010\",\"aggregatetype\":\"order\",\"aggregateid\":\"n10\",\"type\":\"Created\",\"payload\":true}", []byte("n10"), []byte("true"), []byte("b0000000-0000-0000-0000-000000000010")},
	{"n11", "{\"id\":\"b0000000-0000-0000-0000-000000000011\",\"aggregatetype\":\"order\",\"aggregateid\":{\"k\":1},\"type\":\"Created\",\"payload\":{\"x\":1}}", []byte("Struct{k=1}"), []byte("{\"x\":1}"), []byte("b0000000-0000-0000-0000-000000000011")},
	{"n12", "{\"id\":\"b0000000-0000-0000-0000-000000000012\",\"aggregatetype\":\"order\",\"aggregateid\":\"n12\",\"type\":\"Created\",\"payload\":{\"x\":1},\"payload\":{\"x\":2}}", []byte("n12"), []byte("{\"x\":2}"), []byte("b0000000-0000-0000-0000-000000000012")},
	{"n13", " {\"id\":\"b0000000-0000-0000-0000-000000000013\",\"aggregatetype\":\"order\",\"aggregateid\":\"n13\",\"type\":\"Created\",\"payload\":{\"x\":1}}", nil, nil, nil},
	{"n14", "{\"id\":\"b0000000-0000-0000-0000-000000000014\",\"aggregatetype\":\"order\",\"aggregateid\":\"n14\",\"type\":\"Created\",\"payload\":{\"x\":1}}\x0a", []byte("n14"), []byte("{\"x\":1}"), []byte("b0000000-0000-0000-0000-000000000014")},
	{"n15", "{\"id\":\"b0000000-0000-0000-0000-000000000015\",\"aggregatetype\":\"order\",\"aggregateid\":\"n15\",\"type\":\"Created\",\"payload\":{\"a-b\":1,\"1x\":2,\"a.b\":3,\"$c\":4,\"ü\":5}}", []byte("n15"), []byte("{\"a-b\":1,\"1x\":2,\"a.b\":3,\"$c\":4,\"ü\":5}"), []byte("b0000000-0000-0000-0000-000000000015")},
	{"n16", "{\"id\":\"b0000000-0000-0000-0000-000000000016\",\"aggregatetype\":\"order\",\"aggregateid\":\"n16\",\"type\":\"Created\",\"payload\":\"a\\\"b\\u00e9\"}", []byte("n16"), []byte("\"a\\\"bé\""), []byte("b0000000-0000-0000-0000-000000000016")},
	{"n17", "{\"id\":\"b0000000-0000-0000-0000-000000000017\",\"aggregatetype\":\"order\",\"aggregateid\":\"n17\",\"type\":5,\"payload\":{\"x\":1}}", []byte("n17"), []byte("{\"x\":1}"), []byte("b0000000-0000-0000-0000-000000000017")},
	{"n18", "{\"id\":\"b0000000-0000-0000-0000-000000000018\",\"aggregatetype\":\"order\",\"aggregateid\":true,\"type\":\"Created\",\"payload\":{\"x\":1}}", []byte("true"), []byte("{\"x\":1}"), []byte("b0000000-0000-0000-0000-000000000018")},
	{"n19", "{\"id\":\"b0000000-0000-0000-0000-000000000019\",\"aggregatetype\":\"order\",\"aggregateid\":null,\"type\":\"Created\",\"payload\":{\"x\":1}}", nil, nil, nil},
	{"n20", "{\"id\":\"b0000000-0000-0000-0000-000000000020\",\"aggregatetype\":null,\"aggregateid\":\"n20\",\"type\":\"Created\",\"payload\":{\"x\":1}}", nil, nil, nil},
	{"n21", "{\"id\":null,\"aggregatetype\":\"order\",\"aggregateid\":\"n21\",\"type\":\"Created\",\"payload\":{\"x\":1}}", nil, nil, nil},
	{"n22", "{\"id\":\"b0000000-0000-0000-0000-000000000022\",\"aggregatetype\":\"order\",\"aggregateid\":\"n22\",\"type\":\"Created\",\"payload\":{\"x\":1},\"extra\":{\"e\":1}}", []byte("n22"), []byte("{\"x\":1}"), []byte("b0000000-0000-0000-0000-000000000022")},
	{"n23", "{\"id\":\"b0000000-0000-0000-0000-000000000023\",\"aggregatetype\":\"order\",\"aggregateid\":\"n23\",\"type\":\"Created\",\"payload\":{\"x\":1},\"extra\":5}", []byte("n23"), []byte("{\"x\":1}"), []byte("b0000000-0000-0000-0000-000000000023")},
	{"n24", "{\x0a  \"id\": \"b0000000-0000-0000-0000-000000000024\",\x0a  \"aggregatetype\": \"order\",\x0a  \"aggregateid\": \"n24\",\x0a  \"type\": \"Created\",\x0a  \"payload\": { \"b\" : 1 , \"a\" : [ 1 , 2 ] }\x0a}", []byte("n24"), []byte("{\"b\":1,\"a\":[1,2]}"), []byte("b0000000-0000-0000-0000-000000000024")},
	{"n25", "{\"id\":\"b0000000-0000-0000-0000-000000000025\",\"aggregatetype\":\"order\",\"aggregateid\":\"n25\",\"type\":\"Created\",\"payload\":{\"s\":\"line1\\nline2\\ttab\\r\\b\\f\\u001f\\u007f\\u0080\\u00a0\\ufeff\"}}", []byte("n25"), []byte("{\"s\":\"line1\\nline2\\ttab\\r\\b\\f\\u001F\x7f\u0080\u00a0\ufeff\"}"), []byte("b0000000-0000-0000-0000-000000000025")},
	{"n26", "{\"id\":\"b0000000-0000-0000-0000-000000000026\",\"aggregatetype\":\"order\",\"aggregateid\":\"n26\",\"type\":\"T2\",\"payload\":{\"x\":1}}", []byte("n26"), []byte("{\"x\":1}"), []byte("b0000000-0000-0000-0000-000000000026")},
	{"n27", "{\"id\":\"b0000000-0000-0000-0000-000000000027\",\"aggregatetype\":\"order\",\"aggregateid\":\"n27\",\"type\":\"Created\",\"payload\":[[1,2],[3]]}", []byte("n27"), []byte("[[1,2],[3]]"), []byte("b0000000-0000-0000-0000-000000000027")},
	{"n28", "{\"id\":\"b0000000-0000-0000-0000-000000000028\",\"aggregatetype\":\"order\",\"aggregateid\":12345678901234567890,\"type\":\"Created\",\"payload\":{\"x\":1}}", nil, nil, nil},
	{"n29", "{\"id\":\"b0000000-0000-0000-0000-000000000029\",\"aggregatetype\":\"order\",\"aggregateid\":1e2,\"type\":\"Created\",\"payload\":{\"x\":1}}", []byte("100.0"), []byte("{\"x\":1}"), []byte("b0000000-0000-0000-0000-000000000029")},
	{"n30", "{\"id\":\"b0000000-0000-0000-0000-000000000030\",\"aggregatetype\":\"order\",\"aggregateid\":-0.0,\"type\":\"Created\",\"payload\":{\"x\":1}}", []byte("-0.0"), []byte("{\"x\":1}"), []byte("b0000000-0000-0000-0000-000000000030")},
}

// TestDecodeMessageAsDebeziumWrites holds DecodeMessage and Route against
// the records of the real Debezium: for every message it wrote a record
// of, the same key, value and headers (its id alone: Debezium writes no
// extended headers on the records of messages); for every message it
// skipped, an error (a decoding error, an event column the message lacks,
// or a routing error). The one deliberate difference: an object as the
// key, which Debezium writes as Java's Struct{k=1}, is an error.
func TestDecodeMessageAsDebeziumWrites(t *testing.T) {
	o := DefaultOptions()
	no := false
	o.KeyConverter, o.ValueConverter, o.ValueConverterSchemasEnable = ConverterString, ConverterJSON, &no
	o.HeaderConverter = ConverterHeader
	o.ExtendedHeaders, o.ExtendedHeadersLogicalName, o.ExtendedHeadersRunID = true, "r42c_b", "01a251cf-6e8c-78b2-ae0a-190d443d9bc0"
	r, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	deliberate := map[string]bool{"n11": true}
	for _, c := range debeziumMessageOracle {
		row, err := r.DecodeMessage("message:outbox", []byte(c.content))
		var rec Record
		if err == nil {
			for _, col := range []string{"id", "aggregatetype", "aggregateid", "payload"} {
				if !slices.Contains(row.Names, col) {
					err = fmt.Errorf("%w: no %s", ErrMessageNotJSON, col) // the relay refuses it (eventColumnProblems)
				}
			}
		}
		if err == nil {
			_, err = r.Route(&row, time.Now(), &rec)
		}
		switch {
		case c.value == nil || deliberate[c.label]:
			if err == nil {
				t.Errorf("%s: routed (key %q, value %s) where Debezium wrote no record", c.label, rec.Key, rec.Value)
			}
			continue
		case err != nil:
			t.Errorf("%s: %v; Debezium wrote key %q value %s", c.label, err, c.key, c.value)
			continue
		}
		if !bytes.Equal(rec.Key, c.key) || !bytes.Equal(rec.Value, c.value) {
			t.Errorf("%s: key %q value %s; Debezium wrote key %q value %s", c.label, rec.Key, rec.Value, c.key, c.value)
		}
		if len(rec.Headers) != 1 || rec.Headers[0].Key != "id" || !bytes.Equal(rec.Headers[0].Value, c.id) {
			t.Errorf("%s: headers %v; Debezium wrote id=%s alone", c.label, rec.Headers, c.id)
		}
		if rec.Topic != "outbox.event.order" {
			t.Errorf("%s: topic %s", c.label, rec.Topic)
		}
	}
}

// TestDecodeMessageEdges: an empty string is an empty value, not NULL (a
// message whose members were all "" had every column NULL, its event id
// taken for NULL; a review); members after many others are found (the
// lookup was quadratic in the members: 7 s for 40,000); a column of
// OIDConnectJSON's number in a row that is no message's is no struct.
func TestDecodeMessageEdges(t *testing.T) {
	o := DefaultOptions()
	no := false
	o.ValueConverter, o.ValueConverterSchemasEnable = ConverterJSON, &no
	r, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	row, err := r.DecodeMessage("m", []byte(`{"id":"","aggregatetype":"","aggregateid":"","payload":""}`))
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range row.Values {
		if v == nil {
			t.Fatalf("member %s: NULL for an empty string", row.Names[i])
		}
	}
	var b strings.Builder
	b.WriteString(`{"id":"x","aggregatetype":"t","aggregateid":"k"`)
	for i := range 20000 {
		fmt.Fprintf(&b, `,"m%d":%d`, i, i)
	}
	b.WriteString(`,"payload":{"last":true}}`)
	row, err = r.DecodeMessage("m", []byte(b.String()))
	if err != nil || len(row.Names) != 20004 {
		t.Fatalf("%d columns, %v", len(row.Names), err)
	}
	var rec Record
	if _, err := r.Route(&row, time.Now(), &rec); err != nil || string(rec.Value) != `{"last":true}` {
		t.Fatalf("value %s, %v", rec.Value, err)
	}
	// Not a message's row: the type number is some type's, not a struct.
	plain := &Row{Table: "public.outbox", Op: OpInsert, Names: []string{"id", "aggregatetype", "payload"},
		Types: []uint32{oidText, oidText, OIDConnectJSON}, Values: [][]byte{[]byte("x"), []byte("t"), []byte(`{"a":1}`)}}
	if _, err := r.Route(plain, time.Now(), &rec); err != nil || string(rec.Value) != `"{\"a\":1}"` {
		t.Fatalf("a table's column of that type: value %s, %v", rec.Value, err)
	}
}
