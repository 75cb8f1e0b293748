package router

import (
	"math"
	"testing"
)

// TestJavaFloatFormat checks Java's Double.toString and Float.toString
// (Java 19 and later), which Jackson and Kafka Connect's StringConverter
// use.
func TestJavaFloatFormat(t *testing.T) {
	for _, c := range []struct {
		f    float64
		bits int
		want string
	}{
		{1, 64, "1.0"},
		{-1, 64, "-1.0"},
		{0.1, 64, "0.1"},
		{100, 64, "100.0"},
		{12.5, 64, "12.5"},
		{3.14, 64, "3.14"},
		{123456.789, 64, "123456.789"},
		{1234567, 64, "1234567.0"},
		{9999999, 64, "9999999.0"},
		{1e7, 64, "1.0E7"},
		{12345678, 64, "1.2345678E7"},
		{0.001, 64, "0.001"},
		{0.002, 64, "0.002"},
		{0.0001, 64, "1.0E-4"},
		{1.5e20, 64, "1.5E20"},
		{1e23, 64, "1.0E23"},
		{-1.25e-7, 64, "-1.25E-7"},
		{1.0 / 3, 64, "0.3333333333333333"},
		{2.0 / 3, 64, "0.6666666666666666"},
		{math.MaxFloat64, 64, "1.7976931348623157E308"},
		{math.SmallestNonzeroFloat64, 64, "4.9E-324"}, // two digits: closer than 5E-324
		{2 * math.SmallestNonzeroFloat64, 64, "9.9E-324"},
		{0, 64, "0.0"},
		{math.Copysign(0, -1), 64, "-0.0"},
		{math.NaN(), 64, "NaN"},
		{math.Inf(1), 64, "Infinity"},
		{math.Inf(-1), 64, "-Infinity"},

		{float64(float32(1.1)), 32, "1.1"},
		{float64(float32(0.1)), 32, "0.1"},
		{float64(float32(1e10)), 32, "1.0E10"},
		{float64(float32(16777216)), 32, "1.6777216E7"},
		{math.MaxFloat32, 32, "3.4028235E38"},
		{math.SmallestNonzeroFloat32, 32, "1.4E-45"},
	} {
		if got := string(appendJavaFloat(nil, c.f, c.bits)); got != c.want {
			t.Errorf("appendJavaFloat(%v, %d) = %s, want %s", c.f, c.bits, got, c.want)
		}
	}
	if got := string(appendJacksonFloat(nil, math.NaN(), 64)); got != `"NaN"` {
		t.Errorf("Jackson NaN = %s", got)
	}
	if got := string(appendJacksonFloat(nil, math.Inf(-1), 32)); got != `"-Infinity"` {
		t.Errorf("Jackson -Infinity = %s", got)
	}
}

func TestConnectJSONValue(t *testing.T) {
	for _, c := range []struct {
		oid  uint32
		in   any // string, or nil for NULL
		want string
	}{
		{oidJSONB, `{"total": 12}`, `"{\"total\": 12}"`},
		{oidJSON, "[1,\n2]", `"[1,\n2]"`},
		{25, `say "hi"/ é	`, `"say \"hi\"/ é\t"`},
		{2950, eventID, `"` + eventID + `"`},
		{1043, "1", `"1"`},
		{oidInt4, "1", `1`},
		{oidInt8, "-9223372036854775808", `-9223372036854775808`},
		{oidBool, "t", `true`},
		{oidBool, "f", `false`},
		{oidFloat8, "1.5e+20", `1.5E20`},
		{oidFloat8, "12.50", `12.5`},
		{oidFloat8, "NaN", `"NaN"`},
		{oidFloat8, "-Infinity", `"-Infinity"`},
		{oidFloat4, "0.1", `0.1`},
		{oidNumeric, "12.50", `{"scale":1,"value":"fQ=="}`}, // VariableScaleDecimal (no precision)
		{oidNumeric, "NaN", `null`},                         // as Debezium 3.6.1 writes it
		{oidBytea, `\x0102ff`, `"AQL/"`},
		{oidTimestampTZ, "2024-01-02 03:04:05+00", `"2024-01-02T03:04:05.000000Z"`},
		{869, "10.0.0.1", `"10.0.0.1"`}, // inet: a string in Debezium
		{25, nil, `null`},
	} {
		var v []byte
		if s, ok := c.in.(string); ok {
			v = []byte(s)
		}
		got, err := appendConnectJSON(nil, c.oid, -1, v)
		if err != nil || string(got) != c.want {
			t.Errorf("appendConnectJSON(%d, %q) = %s, %v; want %s", c.oid, c.in, got, err, c.want)
		}
	}
	for _, bad := range []struct {
		oid uint32
		v   string
	}{{oidBytea, `\x0`}, {oidNumeric, "N"}, {1007, "{1,2,3}"}} {
		if got, err := appendConnectJSON(nil, bad.oid, -1, []byte(bad.v)); err == nil {
			t.Errorf("appendConnectJSON(%d, %q) = %s, want an error", bad.oid, bad.v, got)
		}
	}
}

func TestConnectText(t *testing.T) {
	for _, c := range []struct {
		oid  uint32
		in   any
		want any // string, or nil
	}{
		{oidJSONB, `{"total": 12}`, `{"total": 12}`},
		{25, "plain", "plain"},
		{oidInt4, "7", "7"},
		{oidBool, "t", "true"},
		{oidBool, "f", "false"},
		{oidFloat8, "1.5e+20", "1.5E20"},
		{oidFloat8, "Infinity", "Infinity"},
		{oidFloat4, "1e+10", "1.0E10"},
		{oidNumeric, "12.50", nil}, // a Java object address: an error
		{oidBytea, `\x0102`, "\x01\x02"},
		{25, "", ""},
		{25, nil, nil},
	} {
		var v []byte
		if s, ok := c.in.(string); ok {
			v = []byte(s)
		}
		got, err := connectText(c.oid, -1, v)
		if c.oid == oidNumeric {
			if err == nil {
				t.Errorf("connectText(numeric without a precision) = %q, want an error", got)
			}
			continue
		}
		if err != nil {
			t.Errorf("connectText(%d, %q): %v", c.oid, c.in, err)
			continue
		}
		if want, ok := c.want.(string); !ok && got != nil || ok && (got == nil || string(got) != want) {
			t.Errorf("connectText(%d, %q) = %q, want %q", c.oid, c.in, got, c.want)
		}
	}
}

func TestValidTraceparent(t *testing.T) {
	const ok = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for _, c := range []struct {
		in   string
		want bool
	}{
		{ok, true},
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", true},
		{"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-future", true}, // a later version may add fields
		{"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", true},
		{"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x", false},
		{ok + "-x", false}, // version 00 has exactly four fields
		{ok[:54], false},
		{"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", false},
		{"00-00000000000000000000000000000000-00f067aa0ba902b7-01", false},
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", false},
		{"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", false}, // upper case
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g", false},
		{"00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", false},
		{" 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", false},
		{"", false},
	} {
		if got := validTraceparent([]byte(c.in)); got != c.want {
			t.Errorf("validTraceparent(%q) = %v, want %v", c.in, got, c.want)
		}
	}
}
