package router

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"strconv"
	"time"
	"unicode/utf16"
	"unicode/utf8"
)

// PostgreSQL type OIDs the router treats specially; every other type is
// taken as text.
const (
	oidBool        = 16
	oidText        = 25
	oidBytea       = 17
	oidInt8        = 20
	oidInt2        = 21
	oidInt4        = 23
	oidOID         = 26
	oidJSON        = 114
	oidFloat4      = 700
	oidFloat8      = 701
	oidTimestamp   = 1114
	oidTimestampTZ = 1184
	oidNumeric     = 1700
	oidJSONB       = 3802
)

// stringType reports whether Debezium's PostgreSQL connector gives columns
// of type oid a string value (text, varchar, char, json, jsonb, uuid, xml,
// timestamptz, unknown and extension types, ...), which is what
// table.expand.json.payload expands. Bytea, booleans, numbers and arrays
// are not strings; Debezium warns that such a payload is not a string.
func stringType(oid uint32) bool {
	switch oid {
	case oidBool, oidBytea, oidInt2, oidInt4, oidInt8, oidOID, oidFloat4, oidFloat8, oidNumeric,
		// Arrays of the built-in types (_bool, _bytea, _int2, _int4, _text,
		// _bpchar, _varchar, _int8, _float4, _float8, _oid, _timestamp,
		// _date, _time, _timestamptz, _numeric, _uuid, _json, _jsonb).
		1000, 1001, 1005, 1007, 1009, 1014, 1015, 1016, 1021, 1022, 1028,
		1115, 1182, 1183, 1185, 1231, 2951, 199, 3807:
		return false
	}
	return true
}

// validTraceparent reports whether v is a W3C Trace Context traceparent:
// version-traceid-parentid-flags in lower-case hex, version 00 to fe,
// trace and parent ids not all zeros. Version 00 is exactly 55 characters;
// later versions may append fields after a dash, as the specification
// requires parsers to accept.
func validTraceparent(v []byte) bool {
	if len(v) < 55 || v[2] != '-' || v[35] != '-' || v[52] != '-' {
		return false
	}
	if !lowerHex(v[0:2]) || !lowerHex(v[3:35]) || !lowerHex(v[36:52]) || !lowerHex(v[53:55]) {
		return false
	}
	if string(v[0:2]) == "ff" || allZeros(v[3:35]) || allZeros(v[36:52]) {
		return false
	}
	if string(v[0:2]) == "00" {
		return len(v) == 55
	}
	return len(v) == 55 || v[55] == '-'
}

func lowerHex(b []byte) bool {
	for _, c := range b {
		if !isDigit(c) && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

func allZeros(b []byte) bool {
	for _, c := range b {
		if c != '0' {
			return false
		}
	}
	return true
}

// decodeBytea decodes bytea text output: the hex format ("\x0a0b", the
// default since PostgreSQL 9.0) or the escape format (bytea_output=escape).
func decodeBytea(v []byte) ([]byte, error) {
	if len(v) >= 2 && v[0] == '\\' && v[1] == 'x' {
		h := v[2:]
		if len(h)%2 != 0 {
			return nil, errors.New("bytea hex text has an odd number of digits")
		}
		out := make([]byte, len(h)/2)
		if _, err := hex.Decode(out, h); err != nil {
			return nil, errors.New("bytea hex text: " + err.Error())
		}
		return out, nil
	}
	out := make([]byte, 0, len(v))
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c != '\\' {
			out = append(out, c)
			continue
		}
		switch {
		case i+1 < len(v) && v[i+1] == '\\':
			out = append(out, '\\')
			i++
		case i+3 < len(v) && isOctal(v[i+1]) && v[i+1] <= '3' && isOctal(v[i+2]) && isOctal(v[i+3]):
			out = append(out, (v[i+1]-'0')<<6|(v[i+2]-'0')<<3|(v[i+3]-'0'))
			i += 3
		default:
			return nil, errors.New("bytea escape text: bad backslash sequence")
		}
	}
	return out, nil
}

func isOctal(c byte) bool { return c >= '0' && c <= '7' }
func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// isInt32 reports whether v is a decimal integer in int32's range, as
// PostgreSQL prints one.
func isInt32(v []byte) bool {
	n, err := strconv.ParseInt(string(v), 10, 32)
	return err == nil && n == int64(int32(n))
}

// spanContext reads the traceparent and tracestate of a java.util.Properties
// text (Debezium's tracing.span.context.field): key=value or key:value
// lines, # and ! comments, backslash escapes. Either is nil when absent.
func spanContext(v []byte) (traceparent, tracestate []byte) {
	for _, line := range bytes.Split(v, []byte("\n")) {
		line = bytes.TrimLeft(bytes.TrimRight(line, "\r"), " \t\f")
		if len(line) == 0 || line[0] == '#' || line[0] == '!' {
			continue
		}
		key, val := splitProperty(line)
		switch string(key) {
		case "traceparent":
			traceparent = val
		case "tracestate":
			tracestate = val
		}
	}
	return traceparent, tracestate
}

// splitProperty splits one Properties line at its first unescaped =, : or
// white space and unescapes both sides.
func splitProperty(line []byte) (key, val []byte) {
	i := 0
	for i < len(line) {
		c := line[i]
		if c == '\\' {
			i += 2
			continue
		}
		if c == '=' || c == ':' || c == ' ' || c == '\t' || c == '\f' {
			break
		}
		i++
	}
	key = unescapeProperty(line[:min(i, len(line))])
	rest := line[min(i, len(line)):]
	rest = bytes.TrimLeft(rest, " \t\f")
	if len(rest) > 0 && (rest[0] == '=' || rest[0] == ':') {
		rest = bytes.TrimLeft(rest[1:], " \t\f")
	}
	return key, unescapeProperty(rest)
}

func unescapeProperty(b []byte) []byte {
	if bytes.IndexByte(b, '\\') < 0 {
		return b
	}
	out := make([]byte, 0, len(b))
	for i := 0; i < len(b); i++ {
		if b[i] != '\\' || i+1 == len(b) {
			out = append(out, b[i])
			continue
		}
		i++
		switch b[i] {
		case 't':
			out = append(out, '\t')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 'f':
			out = append(out, '\f')
		case 'u':
			if r, ok := hex4(b, i+1); ok {
				out = utf8.AppendRune(out, r)
				i += 4
				continue
			}
			out = append(out, 'u')
		default:
			out = append(out, b[i])
		}
	}
	return out
}

// parsePartition parses a non-negative int32 in decimal, with no sign or
// spaces (PostgreSQL's integer output).
func parsePartition(v []byte) (int32, bool) {
	if len(v) == 0 || len(v) > 10 {
		return 0, false
	}
	var n int64
	for _, c := range v {
		if !isDigit(c) {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	if n > 1<<31-1 {
		return 0, false
	}
	return int32(n), true
}

// parseEpochMillis parses an optionally signed decimal integer of
// milliseconds since the Unix epoch.
func parseEpochMillis(v []byte) (time.Time, bool) {
	neg := false
	if len(v) > 0 && (v[0] == '-' || v[0] == '+') {
		neg = v[0] == '-'
		v = v[1:]
	}
	if len(v) == 0 || len(v) > 15 { // 15 digits: beyond year 30000
		return time.Time{}, false
	}
	var n int64
	for _, c := range v {
		if !isDigit(c) {
			return time.Time{}, false
		}
		n = n*10 + int64(c-'0')
	}
	if neg {
		n = -n
	}
	return time.UnixMilli(n).UTC(), true
}

// parseTimestamp parses PostgreSQL's ISO timestamp output (DateStyle ISO,
// the server default): "YYYY-MM-DD[ HH:MM:SS[.ffffff]][+HH[:MM[:SS]]]".
// 'T' is accepted in place of the space. A value without an offset is
// taken as UTC. BC dates and infinity are rejected. The result is in UTC;
// no time.Location is allocated.
func parseTimestamp(v []byte) (time.Time, bool) {
	p := tsParser{b: v}
	year := p.digits(4, 7)
	if year < 0 || !p.byte('-') {
		return time.Time{}, false
	}
	month := p.digits(2, 2)
	if month < 1 || month > 12 || !p.byte('-') {
		return time.Time{}, false
	}
	day := p.digits(2, 2)
	if day < 1 || day > 31 {
		return time.Time{}, false
	}
	var hour, minute, sec, nsec int
	if p.byte(' ') || p.byte('T') {
		hour = p.digits(2, 2)
		if hour < 0 || hour > 24 || !p.byte(':') {
			return time.Time{}, false
		}
		minute = p.digits(2, 2)
		if minute < 0 || minute > 59 || !p.byte(':') {
			return time.Time{}, false
		}
		sec = p.digits(2, 2)
		if sec < 0 || sec > 60 {
			return time.Time{}, false
		}
		if p.byte('.') {
			start := p.i
			frac := p.digits(1, 9)
			if frac < 0 {
				return time.Time{}, false
			}
			for n := p.i - start; n < 9; n++ {
				frac *= 10
			}
			nsec = frac
		}
	}
	var offset int // seconds east of UTC
	if p.i < len(p.b) && (p.b[p.i] == '+' || p.b[p.i] == '-') {
		sign := 1
		if p.b[p.i] == '-' {
			sign = -1
		}
		p.i++
		oh := p.digits(2, 2)
		if oh < 0 || oh > 15 {
			return time.Time{}, false
		}
		offset = oh * 3600
		if p.byte(':') {
			om := p.digits(2, 2)
			if om < 0 || om > 59 {
				return time.Time{}, false
			}
			offset += om * 60
			if p.byte(':') {
				os := p.digits(2, 2)
				if os < 0 || os > 59 {
					return time.Time{}, false
				}
				offset += os
			}
		}
		offset *= sign
	}
	if p.i != len(p.b) {
		return time.Time{}, false
	}
	t := time.Date(year, time.Month(month), day, hour, minute, sec, nsec, time.UTC)
	return t.Add(-time.Duration(offset) * time.Second), true
}

type tsParser struct {
	b []byte
	i int
}

// digits reads between minN and maxN decimal digits, or returns -1.
func (p *tsParser) digits(minN, maxN int) int {
	n, v := 0, 0
	for p.i < len(p.b) && n < maxN && isDigit(p.b[p.i]) {
		v = v*10 + int(p.b[p.i]-'0')
		p.i++
		n++
	}
	if n < minN {
		return -1
	}
	return v
}

func (p *tsParser) byte(c byte) bool {
	if p.i < len(p.b) && p.b[p.i] == c {
		p.i++
		return true
	}
	return false
}

// appendJSONValue appends a column value as JSON: NULL as null; json and
// jsonb as they are (PostgreSQL only stores valid JSON); booleans as true
// or false; integers, floats and numerics as numbers when their text is a
// JSON number (NaN and Infinity become strings); bytea as a base64 string of
// its bytes (as Kafka Connect's JsonConverter writes bytes); everything
// else as a JSON string of its text.
func appendJSONValue(dst []byte, oid uint32, v []byte) ([]byte, error) {
	return appendJSONValueAs(dst, oid, v, appendJSONString)
}

// appendJSONValueAs is appendJSONValue with str writing the strings.
func appendJSONValueAs(dst []byte, oid uint32, v []byte, str func(dst, s []byte) []byte) ([]byte, error) {
	if v == nil {
		return append(dst, "null"...), nil
	}
	switch oid {
	case oidJSON, oidJSONB:
		if len(v) == 0 {
			return append(dst, "null"...), nil
		}
		return append(dst, v...), nil
	case oidBool:
		switch string(v) {
		case "t", "true":
			return append(dst, "true"...), nil
		case "f", "false":
			return append(dst, "false"...), nil
		}
	case oidInt2, oidInt4, oidInt8, oidOID, oidFloat4, oidFloat8, oidNumeric:
		if isJSONNumber(v) {
			return append(dst, v...), nil
		}
	case oidBytea:
		raw, err := decodeBytea(v)
		if err != nil {
			return dst, err
		}
		dst = append(dst, '"')
		dst = base64.StdEncoding.AppendEncode(dst, raw)
		return append(dst, '"'), nil
	}
	return str(dst, v), nil
}

// isJSONNumber reports whether v matches JSON's number grammar.
func isJSONNumber(v []byte) bool {
	i := 0
	if i < len(v) && v[i] == '-' {
		i++
	}
	switch {
	case i < len(v) && v[i] == '0':
		i++
	case i < len(v) && v[i] >= '1' && v[i] <= '9':
		for i < len(v) && isDigit(v[i]) {
			i++
		}
	default:
		return false
	}
	if i < len(v) && v[i] == '.' {
		i++
		if i == len(v) || !isDigit(v[i]) {
			return false
		}
		for i < len(v) && isDigit(v[i]) {
			i++
		}
	}
	if i < len(v) && (v[i] == 'e' || v[i] == 'E') {
		i++
		if i < len(v) && (v[i] == '+' || v[i] == '-') {
			i++
		}
		if i == len(v) || !isDigit(v[i]) {
			return false
		}
		for i < len(v) && isDigit(v[i]) {
			i++
		}
	}
	return i == len(v)
}

// escapeGrowth returns how many bytes appendJacksonString adds to s
// besides the quotes (appendJSONString adds no more), except for invalid
// UTF-8, so that one allocation holds it.
func escapeGrowth(s []byte) int {
	n := 0
	for _, c := range s {
		switch {
		case c == '"' || c == '\\' || c == '\b' || c == '\t' || c == '\n' || c == '\f' || c == '\r':
			n++
		case c < 0x20:
			n += 5
		case c >= 0xF0:
			n += 8 // a 4-byte character becomes two \uXXXX escapes
		}
	}
	return n
}

// appendJSONString appends s as a JSON string: ", \ and control
// characters escaped (\b \t \n \f \r, others as \u00XX), everything else
// as UTF-8; invalid UTF-8 becomes U+FFFD. It is pgoutbox's own JSON (raw
// envelopes and expansions).
func appendJSONString(dst, s []byte) []byte { return appendString(dst, s, false) }

// appendJacksonString appends s as a JSON string the way Jackson, Kafka
// Connect's JSON library, writes a Java string: as appendJSONString, except
// that a character outside the Basic Multilingual Plane, two UTF-16 code
// units in Java, is written as an escaped surrogate pair (\uD83D\uDE00)
// rather than as its UTF-8 bytes.
func appendJacksonString(dst, s []byte) []byte { return appendString(dst, s, true) }

// AppendJacksonString appends s as a JSON string literal the way Kafka
// Connect's JsonConverter (Jackson) writes it: control characters escaped,
// characters outside the Basic Multilingual Plane as escaped surrogate
// pairs, the rest as UTF-8.
func AppendJacksonString(dst, s []byte) []byte { return appendJacksonString(dst, s) }

func appendString(dst, s []byte, surrogates bool) []byte {
	const hexDigits = "0123456789ABCDEF"
	dst = append(dst, '"')
	for i := 0; i < len(s); {
		// Copy a run of characters that need no escaping at once.
		j := i
		for j < len(s) && s[j] >= 0x20 && s[j] < utf8.RuneSelf && s[j] != '"' && s[j] != '\\' {
			j++
		}
		dst = append(dst, s[i:j]...)
		if i = j; i == len(s) {
			break
		}
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				dst = append(dst, '\\', c)
			case c >= 0x20:
				dst = append(dst, c)
			case c == '\b':
				dst = append(dst, '\\', 'b')
			case c == '\t':
				dst = append(dst, '\\', 't')
			case c == '\n':
				dst = append(dst, '\\', 'n')
			case c == '\f':
				dst = append(dst, '\\', 'f')
			case c == '\r':
				dst = append(dst, '\\', 'r')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			continue
		}
		r, size := utf8.DecodeRune(s[i:])
		switch {
		case surrogates && size == 1 && c == 0xED && i+2 < len(s) && s[i+1] >= 0xA0 && s[i+1] <= 0xBF && s[i+2]&0xC0 == 0x80:
			// An unpaired surrogate, kept by a Jackson-mode parse as WTF-8:
			// Jackson writes it escaped.
			u := rune(s[i+1]&0x3F)<<6 | rune(s[i+2]&0x3F) | 0xD000
			dst = append(dst, '\\', 'u', hexDigits[u>>12&0xF], hexDigits[u>>8&0xF], hexDigits[u>>4&0xF], hexDigits[u&0xF])
			size = 3
		case r == utf8.RuneError && size == 1:
			dst = utf8.AppendRune(dst, utf8.RuneError)
		case surrogates && r > 0xFFFF:
			hi, lo := utf16.EncodeRune(r)
			for _, u := range [2]rune{hi, lo} {
				dst = append(dst, '\\', 'u', hexDigits[u>>12&0xF], hexDigits[u>>8&0xF], hexDigits[u>>4&0xF], hexDigits[u&0xF])
			}
		default:
			dst = append(dst, s[i:i+size]...)
		}
		i += size
	}
	return append(dst, '"')
}
