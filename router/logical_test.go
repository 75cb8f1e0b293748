package router

import (
	"bytes"
	"encoding/base64"
	"testing"
)

// TestDecimalAsJavaWritesIt: the unscaled bytes are Java's
// BigInteger.toByteArray (shortest two's complement), the text Java's
// BigDecimal.toString (scientific below an adjusted exponent of -6), and a
// numeric without a precision loses its trailing zeros as
// BigDecimal.stripTrailingZeros does. The bytes of 12.30, -0.01, 0,
// 9999999999.99, 12.3, 0.0000001, 1e20 and -5 are the real Debezium's
// (pkg/conformance, typed-placements).
func TestDecimalAsJavaWritesIt(t *testing.T) {
	typmod := func(p, s int32) int32 { return (p<<16 | s) + 4 }
	for _, c := range []struct {
		mod        int32
		in         string
		b64, text  string // base64 of the unscaled bytes; BigDecimal.toString
		scale      int
		varDecimal bool
	}{
		{typmod(12, 2), "12.30", "BM4=", "12.30", 2, false},
		{typmod(12, 2), "-0.01", "/w==", "-0.01", 2, false},
		{typmod(12, 2), "0.00", "AA==", "0.00", 2, false},
		{typmod(12, 2), "9999999999.99", "AOjUpQ//", "9999999999.99", 2, false},
		{typmod(20, 10), "0.0000001000", "A+g=", "1.000E-7", 10, false},
		{typmod(20, 10), "0.0000000000", "AA==", "0E-10", 10, false},
		{typmod(20, 10), "-1234567890.0123456789", "", "-1234567890.0123456789", 10, false},
		{typmod(10, 0), "128", "AIA=", "128", 0, false},
		{typmod(10, 0), "-128", "gA==", "-128", 0, false},
		{typmod(10, 0), "-129", "/38=", "-129", 0, false},
		{-1, "12.3", "ew==", "", 1, true},
		{-1, "1.2300", "ew==", "", 2, true},
		{-1, "0.0000001", "AQ==", "", 7, true},
		{-1, "100000000000000000000", "BWvHXi1jEAAA", "", 0, true},
		{-1, "-5", "+w==", "", 0, true},
		{-1, "0.000", "AA==", "", 0, true},
	} {
		v, err := numericValue(c.mod, []byte(c.in))
		if err != nil {
			t.Errorf("%s: %v", c.in, err)
			continue
		}
		if v.scale != c.scale || (v.kind == cvVarDecimal) != c.varDecimal {
			t.Errorf("%s: scale %d var %v, want %d %v", c.in, v.scale, v.kind == cvVarDecimal, c.scale, c.varDecimal)
		}
		if got := base64.StdEncoding.EncodeToString(v.unscaledBytes()); c.b64 != "" && got != c.b64 {
			t.Errorf("%s: unscaled bytes %s, want %s", c.in, got, c.b64)
		}
		if c.text != "" {
			if got := string(v.appendJavaBigDecimal(nil)); got != c.text {
				t.Errorf("%s: BigDecimal.toString %s, want %s", c.in, got, c.text)
			}
		}
	}
	for _, bad := range []string{"", "1e5", "nan", "1.2.3"} {
		if _, err := numericValue(-1, []byte(bad)); err == nil {
			t.Errorf("numeric %q accepted", bad)
		}
	}
	// Null, as Debezium makes them (special_values_test.go).
	for _, null := range []string{"NaN", "Infinity", "-Infinity"} {
		if v, err := numericValue(-1, []byte(null)); err != nil || v.kind != cvNull {
			t.Errorf("numeric %q: %v %v, want null", null, v.kind, err)
		}
	}
}

// TestTimesAsDebeziumMakesThem: adaptive time precision, dates as days,
// zoned timestamps in UTC with the column's fractional width, intervals
// as MicroDuration. The expected values are the real Debezium's
// (pkg/conformance, typed-placements).
func TestTimesAsDebeziumMakesThem(t *testing.T) {
	for _, c := range []struct {
		oid  uint32
		mod  int32
		in   string
		want string // JSON
	}{
		{oidTimestamp, -1, "2024-01-02 03:04:05.123456", "1704164645123456"},
		{oidTimestamp, -1, "1960-06-01 12:00:00.5", "-302443199500000"},
		{oidTimestamp, 3, "2024-01-02 03:04:05.123", "1704164645123"},
		{oidTimestamp, 3, "1969-12-31 23:59:59.999", "-1"},
		{oidDate, -1, "2024-01-02", "19724"},
		{oidDate, -1, "1960-01-01", "-3653"},
		{oidTime, -1, "03:04:05.123456", "11045123456"},
		{oidTime, -1, "23:59:59", "86399000000"},
		{oidTime, -1, "24:00:00", "86400000000"},
		{oidTime, 3, "23:59:59.999", "86399999"},
		{oidTimestampTZ, -1, "2024-01-02 03:04:05.1+00", `"2024-01-02T03:04:05.100000Z"`},
		{oidTimestampTZ, -1, "1999-12-31 23:59:59.999999-08", `"2000-01-01T07:59:59.999999Z"`},
		{oidTimestampTZ, -1, "1960-01-01 00:00:00+00", `"1960-01-01T00:00:00.000000Z"`},
		{oidTimestampTZ, 3, "2024-01-02 03:04:05.123+00", `"2024-01-02T03:04:05.123Z"`},
		{oidTimestampTZ, -1, "infinity", `"infinity"`},
		{oidInterval, -1, "1 day 02:03:04", "93784000000"},
		{oidInterval, -1, "1 year 2 mons 3 days 04:05:06.789", "37091106789000"},
		{oidInterval, -1, "-01:00:00", "-3600000000"},
		{oidInterval, -1, "00:00:00.000001", "1"},
		{oidInterval, -1, "-1 days +02:00:00", "-79200000000"},
		{oidInterval, -1, "178000000 years", "9223372036854775807"}, // Java's (long) saturates
	} {
		got, err := appendConnectJSON(nil, c.oid, c.mod, []byte(c.in))
		if err != nil || !bytes.Equal(got, []byte(c.want)) {
			t.Errorf("%d(%d) %q: %s, %v; want %s", c.oid, c.mod, c.in, got, err, c.want)
		}
	}
	for _, bad := range []struct {
		oid uint32
		in  string
	}{{oidInterval, "P1Y2M"}, {oidInterval, "@ 1 hour"}, {oidDate, "infinity"}, {oidTimestamp, "infinity"}, {oidMoney, "$1.00"}, {oidTimeTZ, "03:04:05+02"}, {1007, "{1,2}"}, {oidBit, "101"}} {
		if got, err := appendConnectJSON(nil, bad.oid, -1, []byte(bad.in)); err == nil {
			t.Errorf("%d %q: %s, want an error", bad.oid, bad.in, got)
		}
	}
}
