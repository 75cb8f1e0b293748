package router

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestParseTimestamp(t *testing.T) {
	for _, c := range []struct {
		in   string
		want string // RFC3339Nano in UTC, "" for a rejection
	}{
		{"2024-01-02 03:04:05.123456+00", "2024-01-02T03:04:05.123456Z"},
		{"2024-01-02 03:04:05+00", "2024-01-02T03:04:05Z"},
		{"2024-01-02 03:04:05", "2024-01-02T03:04:05Z"},
		{"2024-01-02T03:04:05.1-08", "2024-01-02T11:04:05.1Z"},
		{"2024-01-02 03:04:05+05:30", "2024-01-01T21:34:05Z"},
		{"2024-01-02 03:04:05+05:30:15", "2024-01-01T21:33:50Z"},
		{"1900-01-01 00:00:00+00:09:21", "1899-12-31T23:50:39Z"},
		{"2024-01-02", "2024-01-02T00:00:00Z"},
		{"2024-12-31 24:00:00", "2025-01-01T00:00:00Z"},
		{"12345-01-02 03:04:05", "12345-01-02T03:04:05Z"},
		{"2024-01-02 03:04:05.123456789", "2024-01-02T03:04:05.123456789Z"},
		{"infinity", ""},
		{"-infinity", ""},
		{"2024-01-02 03:04:05 BC", ""},
		{"2024-13-02 03:04:05", ""},
		{"2024-01-02 03:04", ""},
		{"2024-01-02 03:04:05.", ""},
		{"2024-01-02 03:04:05+", ""},
		{"2024-01-02 03:04:05.1234567890", ""},
		{"", ""},
	} {
		got, ok := parseTimestamp([]byte(c.in))
		switch {
		case c.want == "" && ok:
			t.Errorf("parseTimestamp(%q) = %v, want a rejection", c.in, got)
		case c.want != "" && (!ok || got.Format(time.RFC3339Nano) != c.want || got.Location() != time.UTC):
			t.Errorf("parseTimestamp(%q) = %v, %v; want %s", c.in, got, ok, c.want)
		}
	}
}

func TestColumnTime(t *testing.T) {
	for _, c := range []struct {
		oid  uint32
		in   string
		want string
	}{
		{20, "1700000000123", "2023-11-14T22:13:20.123Z"},
		{20, "-1000", "1969-12-31T23:59:59Z"},
		{23, "2024-01-02", ""}, // an integer column holds no ISO text
		{1184, "1700000000123", ""},
		{25, "1700000000123", "2023-11-14T22:13:20.123Z"},
		{25, "2024-01-02 03:04:05+00", "2024-01-02T03:04:05Z"},
		{25, "soon", ""},
		{20, "1234567890123456", ""}, // too far out
	} {
		got, ok := columnTime(c.oid, []byte(c.in))
		switch {
		case c.want == "" && ok:
			t.Errorf("columnTime(%d, %q) = %v, want a rejection", c.oid, c.in, got)
		case c.want != "" && (!ok || got.Format(time.RFC3339Nano) != c.want):
			t.Errorf("columnTime(%d, %q) = %v, %v; want %s", c.oid, c.in, got, ok, c.want)
		}
	}
}

func TestDecodeBytea(t *testing.T) {
	for _, c := range []struct {
		in, want string
		ok       bool
	}{
		{`\x`, "", true},
		{`\x0aFF`, "\x0a\xff", true},
		{`\x0`, "", false},
		{`\xzz`, "", false},
		{`abc`, "abc", true},
		{``, "", true},
		{`a\\b`, `a\b`, true},
		{`\000\377`, "\x00\xff", true},
		{`\400`, "", false},
		{`\0`, "", false},
		{`\`, "", false},
	} {
		got, err := decodeBytea([]byte(c.in))
		if (err == nil) != c.ok || (c.ok && string(got) != c.want) {
			t.Errorf("decodeBytea(%q) = %q, %v; want %q, ok=%v", c.in, got, err, c.want, c.ok)
		}
	}
}

func TestParsePartition(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int32
		ok   bool
	}{
		{"0", 0, true}, {"7", 7, true}, {"2147483647", 2147483647, true},
		{"2147483648", 0, false}, {"-1", 0, false}, {"+1", 0, false}, {"", 0, false}, {"1.0", 0, false}, {" 1", 0, false}, {"99999999999", 0, false},
	} {
		got, ok := parsePartition([]byte(c.in))
		if ok != c.ok || got != c.want {
			t.Errorf("parsePartition(%q) = %d, %v; want %d, %v", c.in, got, ok, c.want, c.ok)
		}
	}
}

func TestAppendJSONString(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"plain", `"plain"`},
		{"q\"b\\", `"q\"b\\"`},
		{"\b\t\n\f\r\x00\x1f\x7f", `"\b\t\n\f\r\u0000\u001F` + "\x7f\""},
		{"é€😀", `"é€😀"`},
		{"bad\xffutf8", "\"bad\uFFFDutf8\""},
		{"<&>\u2028", "\"<&>\u2028\""}, // as Jackson: no HTML escaping
	} {
		if got := string(appendJSONString(nil, []byte(c.in))); got != c.want {
			t.Errorf("appendJSONString(%q) = %s, want %s", c.in, got, c.want)
		}
	}
}

// FuzzJSONEncoding checks the JSON helpers against encoding/json.
func FuzzJSONEncoding(f *testing.F) {
	for _, s := range []string{"", "a\"b", "\x00\xff", "-0.5e+3", "01", "1.", "NaN", "é"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		out := appendJSONString(nil, in)
		var got string
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("appendJSONString(%q) = %s: %v", in, out, err)
		}
		var want strings.Builder
		for _, r := range string(in) {
			want.WriteRune(r)
		}
		if got != want.String() {
			t.Fatalf("appendJSONString(%q) decodes to %q, want %q", in, got, want.String())
		}
		isNum := isJSONNumber(in)
		validNum := len(in) > 0 && (in[0] == '-' || in[0] >= '0' && in[0] <= '9') && json.Valid(in) &&
			len(bytes.TrimRight(in, " \t\r\n")) == len(in) // json.Valid allows trailing space
		if isNum != validNum {
			t.Fatalf("isJSONNumber(%q) = %v, encoding/json says %v", in, isNum, validNum)
		}
	})
}
