package router

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

func TestJSONParseFollowsJackson(t *testing.T) {
	deep := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	longNum := func(n int) string { return "[" + strings.Repeat("1", n) + "]" }
	for _, c := range []struct {
		in string
		ok bool
	}{
		{`{}`, true},
		{`[]`, true},
		{` {"a":1} ` + "\t\r\n", true}, // surrounding whitespace
		{`{"a":[1,-0,0.5,-1.5e+10,1E2,true,false,null,"s",{}]}`, true},
		{`{"s":"\"\\\/\b\f\n\r\tA\u00e9\ud83d\ude00"}`, true},
		{deep(maxJSONDepth), true},
		{longNum(maxJSONNumberLen), true},

		{``, false},
		{`"s"`, false}, // the root must be an object or an array
		{`12`, false},
		{`{"a":1,}`, false}, // trailing comma
		{`[1,]`, false},
		{`{a:1}`, false},   // unquoted name
		{`{'a':1}`, false}, // single quotes
		{`{"a":01}`, false},
		{`{"a":1.}`, false},
		{`{"a":.5}`, false},
		{`{"a":+1}`, false},
		{`{"a":1e}`, false},
		{`{"a":-}`, false},
		{`{"a":NaN}`, false},
		{`{"a":Infinity}`, false},
		{"{\"a\":\"\x01\"}", false}, // unescaped control character
		{`{"a":"\q"}`, false},
		{`{"a":"\u12"}`, false},
		{`{"a":"\ud800"}`, false},              // unpaired high surrogate
		{`{"a":"\udc00"}`, false},              // unpaired low surrogate
		{`{"a":"\ud800\u0041"}`, false},        // high surrogate then no low one
		{`{"a":"\ud800x\udc00"}`, false},       // not adjacent
		{`{"a":1} x`, false},                   // Jackson ignores trailing content; pgoutbox does not
		{`{"a":1}{}`, false},                   //
		{`{"a":tru}`, false},                   //
		{`{"a":truex}`, false},                 //
		{`{"a":nul}`, false},                   //
		{`[1 2]`, false},                       //
		{`{"a" 1}`, false},                     //
		{`{"a":1 "b":2}`, false},               //
		{`{`, false},                           //
		{`[`, false},                           //
		{`{"a":1`, false},                      //
		{`{"a":/*c*/1}`, false},                // no comments
		{"{\"a\":1}\x00", false},               //
		{"\v{}", false},                        // only space, tab, CR and LF are whitespace
		{deep(maxJSONDepth + 1), false},        // Jackson's nesting limit
		{longNum(maxJSONNumberLen + 1), false}, // Jackson's number length limit
	} {
		var d jsonDoc
		if got := d.parse([]byte(c.in)); got != c.ok {
			t.Errorf("parse(%.60q) = %v, want %v", c.in, got, c.ok)
		}
	}
}

func TestJSONNumberClasses(t *testing.T) {
	for _, c := range []struct {
		in   string
		want numClass
	}{
		{"0", numInt32}, {"-0", numInt32}, {"2147483647", numInt32}, {"-2147483648", numInt32},
		{"2147483648", numInt64}, {"-2147483649", numInt64}, {"9223372036854775807", numInt64}, {"-9223372036854775808", numInt64},
		{"9223372036854775808", numBig}, {"123456789012345678901234567890", numBig},
		{"1.0", numDouble}, {"1e2", numDouble}, {"1E-2", numDouble}, {"-0.0", numDouble},
	} {
		var d jsonDoc
		if !d.parse([]byte("[" + c.in + "]")) {
			t.Fatalf("parse %s", c.in)
		}
		if got := d.nodes[1].num; got != c.want {
			t.Errorf("%s: class %d, want %d", c.in, got, c.want)
		}
	}
}

func TestExpandRaw(t *testing.T) {
	for _, c := range []struct {
		in, ignore, keep string
	}{
		{`{"total":12}`, `{"total":12}`, ""},
		{`{"total": 12, "items": [1, 2]}`, `{"total":12,"items":[1,2]}`, ""},
		{" \n{ \"a\" : null }", `{}`, `{"a":null}`},
		{`{"a":null,"b":{"c":null,"d":[null,{"e":null}]}}`, `{"b":{"d":[null,{}]}}`, `{"a":null,"b":{"c":null,"d":[null,{"e":null}]}}`},
		{`{"items":[],"o":{}}`, `{"items":[],"o":{}}`, ""},
		{`{"p":12.50,"q":1E+2,"r":-0,"big":99999999999999999999}`, `{"p":12.50,"q":1E+2,"r":-0,"big":99999999999999999999}`, ""}, // numbers as written
		{`{"a":1,"b":2,"a":3}`, `{"a":3,"b":2}`, ""},                                                                             // Jackson: first position, last value
		{`{"a":1,"b":2,"a":null}`, `{"b":2}`, `{"a":null,"b":2}`},
		{`{"s":"\u00e9\/\u0001\u007f\ud83d\ude00"}`, "{\"s\":\"é/\\u0001\x7f😀\"}", ""},
		{"{\"bad\":\"\xff\"}", "{\"bad\":\"\uFFFD\"}", ""},
		{`[1,"x",{"a":null},[]]`, `[1,"x",{},[]]`, `[1,"x",{"a":null},[]]`},
	} {
		for _, keep := range []bool{false, true} {
			want := c.ignore
			if keep && c.keep != "" {
				want = c.keep
			}
			d := jsonDoc{keepNulls: keep}
			if !d.parse([]byte(c.in)) {
				t.Errorf("parse(%q) failed", c.in)
				continue
			}
			if got := string(d.appendRaw(nil, 0)); got != want {
				t.Errorf("raw(%q, keepNulls=%v) = %s, want %s", c.in, keep, got, want)
			}
		}
	}
}

func TestExpandRawDedupesManyKeys(t *testing.T) {
	// More than 16 members takes the sorting path.
	var b strings.Builder
	b.WriteString("{")
	for i := range 40 {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString(`"k` + itoa(i%25) + `":` + itoa(i))
	}
	b.WriteString("}")
	var d jsonDoc
	if !d.parse([]byte(b.String())) {
		t.Fatal("parse")
	}
	var got map[string]int
	out := d.appendRaw(nil, 0)
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	var want map[string]int
	if err := json.Unmarshal([]byte(b.String()), &want); err != nil { // encoding/json also keeps the last value
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	if !strings.HasPrefix(string(out), `{"k0":25,"k1":26,`) || strings.Count(string(out), `"k`) != 25 {
		t.Errorf("order or count wrong: %s", out)
	}
}

// TestExpandConnect checks the JsonConverter rendering of an expanded
// payload against what Debezium's JsonSchemaData and Kafka Connect's
// JsonConverter (schemas.enable=false) produce. fails means Debezium's
// conversion fails (it warns and keeps the payload as it was).
func TestExpandConnect(t *testing.T) {
	// noSchema: Debezium infers no schema and leaves the payload as it was;
	// fails: it infers one but the value does not fit it (poison).
	const noSchema, fails = "NO SCHEMA", "FAILS"
	for _, c := range []struct {
		in, ignore, keep string // keep: with optional_bytes, when it differs
	}{
		{`{"total":12}`, `{"total":12}`, ""},
		{`{"total": 12, "currency": "EUR"}`, `{"total":12,"currency":"EUR"}`, ""},
		{`{"a": 1, "b": null}`, `{"a":1}`, `{"a":1,"b":null}`},
		{`{"a":{"b":null,"c":1}}`, `{"a":{"c":1}}`, `{"a":{"b":null,"c":1}}`},
		{`{"a":{"b":null}}`, `{"a":{}}`, `{"a":{"b":null}}`},
		{`{"items":[],"n":1}`, `{"n":1}`, ""}, // an empty array has no schema: the field goes
		{`{"p":12.50,"q":1e2,"r":-0,"s":-0.0,"t":3000000000,"u":0.0001,"v":1.5e20,"w":1e7}`,
			`{"p":12.5,"q":100.0,"r":0,"s":-0.0,"t":3000000000,"u":1.0E-4,"v":1.5E20,"w":1.0E7}`, ""},
		{`{"f":1e400,"g":-1e400,"h":1e-400}`, `{"f":"Infinity","g":"-Infinity","h":0.0}`, ""},
		{`{"a":[1,null,2]}`, `{"a":[1,null,2]}`, ""},
		{`{"a":[true,false,null]}`, `{"a":[true,false,null]}`, ""},
		{`{"a":[1,2.5]}`, noSchema, ""},        // int and double
		{`{"a":[1,3000000000]}`, noSchema, ""}, // int and long
		{`{"a":[1,"x"]}`, noSchema, ""},
		{`{"a":[{"x":1},2]}`, noSchema, ""},
		{`{"a":[null,null]}`, noSchema, `{"a":[null,null]}`}, // no sample: bytes with optional_bytes
		{`{"a":[[],[1]]}`, noSchema, ""},                     // the sample [] has no schema
		{`{"a":[[1],[]]}`, `{"a":[[1],[]]}`, ""},
		{`{"a":[[1],["x"]]}`, fails, ""},
		{`{"a":99999999999999999999}`, fails, ""}, // BigInteger: no schema fits
		{`{"":1}`, noSchema, ""},                  // Kafka Connect rejects an empty field name
		{`{"":null}`, `{}`, noSchema},
		{`{"a":1,"b":2,"a":3}`, `{"a":3,"b":2}`, ""},
		{`{"a":[{"x":1},{"y":"s"}]}`, `{"a":[{"x":1,"y":null},{"x":null,"y":"s"}]}`, ""}, // one struct for all elements
		{`{"a":[{"x":1},{"x":"s"}]}`, fails, ""},
		{`{"a":[{"x":null},{"x":1}]}`, `{"a":[{"x":null},{"x":1}]}`, ""},
		{`{"a":[{"x":1},{"x":null}]}`, `{"a":[{"x":1},{"x":null}]}`, ""},
		{`{"a":[{"o":{"p":1}},{"o":{"q":2}}]}`, `{"a":[{"o":{"p":1}},{"o":{"p":null}}]}`, ""}, // nested structs are not merged
		{`{"a":[{"x":1},{"x":[]}]}`, fails, ""},
		{`{"a":[{"x":[1]},{"x":[]}]}`, `{"a":[{"x":[1]},{"x":[]}]}`, ""},
		{`{"s":"\u00e9\/\u0001\"","t":"a\\b"}`, "{\"s\":\"é/\\u0001\\\"\",\"t\":\"a\\\\b\"}", ""},
		{`[1,2]`, fails, ""}, // a top-level array: Debezium's converter fails on the record
		{`[]`, noSchema, ""},
		{`[{"a":null}]`, fails, ""},
	} {
		for _, keep := range []bool{false, true} {
			want := c.ignore
			if keep && c.keep != "" {
				want = c.keep
			}
			d := jsonDoc{keepNulls: keep}
			if !d.parse([]byte(c.in)) {
				t.Errorf("parse(%q) failed", c.in)
				continue
			}
			out, res := d.appendConnect(nil)
			switch {
			case want == fails || want == noSchema:
				if wantRes := map[string]connectResult{fails: connectFails, noSchema: connectNoSchema}[want]; res != wantRes {
					t.Errorf("connect(%q, keepNulls=%v) = %s, %v; want %s", c.in, keep, out, res, want)
				}
			case res != connectOK || string(out) != want:
				t.Errorf("connect(%q, keepNulls=%v) = %s, %v; want %s", c.in, keep, out, res, want)
			}
			if res == connectOK && !json.Valid(out) {
				t.Errorf("connect(%q) = %s: not JSON", c.in, out)
			}
		}
	}
}

func TestExpandConnectLargeUnion(t *testing.T) {
	// More than 32 fields in one array-of-objects struct uses the field map.
	var b strings.Builder
	b.WriteString(`{"a":[`)
	for i := range 50 {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString(`{"f` + itoa(i) + `":` + itoa(i) + `,"f0":0}`)
	}
	b.WriteString(`]}`)
	d := jsonDoc{}
	if !d.parse([]byte(b.String())) {
		t.Fatal("parse")
	}
	out, res := d.appendConnect(nil)
	if res != connectOK {
		t.Fatal("conversion failed")
	}
	var got struct{ A []map[string]*int }
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	if len(got.A) != 50 {
		t.Fatalf("%d elements", len(got.A))
	}
	for i, el := range got.A {
		if len(el) != 50 {
			t.Fatalf("element %d has %d fields, want the union of 50", i, len(el))
		}
		if v := el["f"+itoa(i)]; v == nil || *v != i {
			t.Errorf("element %d: f%d = %v", i, i, v)
		}
	}
}
