package router

import (
	"encoding/base64"
	"math"
	"strconv"
)

// This file holds the Kafka Connect encodings: the bytes Kafka Connect's
// JsonConverter (schemas.enable=false) and StringConverter write for the
// Connect value Debezium's PostgreSQL connector makes of a column.
//
// Debezium gives text-like columns (text, varchar, char, uuid, json, jsonb,
// xml, ...) a STRING schema, booleans BOOLEAN, int2/int4 INT16/INT32,
// int8 and oid INT64, float4 FLOAT32, float8 FLOAT64 and bytea BYTES.
// JsonConverter writes those with Jackson: strings as JSON string literals,
// numbers as Java prints them, bytes as a base64 string, and an optional
// field's null as null. StringConverter writes Java's toString() of the
// value as UTF-8, and a null value as a null (Kafka null) record value or
// key.
//
// Numeric, date, time, timestamp, timestamptz and interval get Debezium's
// logical types (logical.go), at the connector's default handling modes;
// money, timetz, arrays and the types outside builtinReproduced (and
// NotReproducedType) are an error. Other types are written as for
// pgoutbox's own envelope, a string of their PostgreSQL text, which is
// what Debezium makes of the text-like ones (enums, citext, inet, ...).

var (
	// Shared read-only values; the capacity is the length so that an append
	// by the caller copies instead of writing into them.
	nullJSON  = []byte("null")[:4:4]
	textTrue  = []byte("true")[:4:4]
	textFalse = []byte("false")[:5:5]
)

// appendConnectJSON appends column value v of type oid and type modifier
// mod as JsonConverter writes the Connect value Debezium makes of it (see
// the file comment).
func appendConnectJSON(dst []byte, oid uint32, mod int32, v []byte) ([]byte, error) {
	if v == nil {
		return append(dst, "null"...), nil
	}
	if c, err := logicalValue(oid, mod, v); err != nil || c.kind != cvText {
		if err != nil {
			return dst, err
		}
		return c.appendJSON(dst), nil
	}
	switch oid {
	case oidJSON, oidJSONB:
		// Debezium's io.debezium.data.Json is a STRING: the JSON text
		// becomes a JSON string literal.
		return appendJacksonString(dst, v), nil
	case oidFloat4, oidFloat8:
		f, ok := parsePGFloat(oid, v)
		if !ok {
			return appendJacksonString(dst, v), nil
		}
		return appendJacksonFloat(dst, f, floatBits(oid)), nil
	}
	return appendJSONValueAs(dst, oid, v, appendJacksonString)
}

// connectText returns column value v of type oid and type modifier mod as
// StringConverter writes the Connect value Debezium makes of it: Java's
// toString() in UTF-8. Booleans become true or false, floats Java's decimal
// form and logical types their Connect value's text; bytea, whose
// toString() in Java is an object address, is written as its bytes; other
// types as their text (aliased).
func connectText(oid uint32, mod int32, v []byte) ([]byte, error) {
	if v == nil {
		return nil, nil
	}
	if c, err := logicalValue(oid, mod, v); err != nil || c.kind != cvText {
		if err != nil {
			return nil, err
		}
		return c.text(false)
	}
	switch oid {
	case oidBool:
		switch string(v) {
		case "t", "true":
			return textTrue, nil
		case "f", "false":
			return textFalse, nil
		}
	case oidFloat4, oidFloat8:
		if f, ok := parsePGFloat(oid, v); ok {
			return appendJavaFloat(make([]byte, 0, 24), f, floatBits(oid)), nil
		}
	case oidBytea:
		return decodeBytea(v)
	}
	return v, nil
}

// headerText returns column value v of type oid and type modifier mod as
// Kafka Connect's SimpleHeaderConverter writes the Connect value Debezium
// makes of it: Java's text of it, as StringConverter, except that bytes are
// written in base64 (an empty bytea as an empty header, not a null one) and
// a struct as JSON.
func headerText(oid uint32, mod int32, v []byte) ([]byte, error) {
	if v == nil {
		return nil, nil
	}
	switch c, err := logicalValue(oid, mod, v); {
	case err != nil:
		return nil, err
	case c.kind != cvText:
		return c.text(true)
	}
	if oid == oidBytea {
		b, err := decodeBytea(v)
		if err != nil {
			return nil, err
		}
		return base64.StdEncoding.AppendEncode(make([]byte, 0, base64.StdEncoding.EncodedLen(len(b))), b), nil
	}
	return connectText(oid, -1, v)
}

func floatBits(oid uint32) int {
	if oid == oidFloat4 {
		return 32
	}
	return 64
}

// parsePGFloat parses float4 or float8 output text, including NaN and
// [-]Infinity.
func parsePGFloat(oid uint32, v []byte) (float64, bool) {
	f, err := strconv.ParseFloat(string(v), floatBits(oid))
	if err != nil {
		if ne, ok := err.(*strconv.NumError); !ok || ne.Err != strconv.ErrRange {
			return 0, false
		}
	}
	return f, true
}

// appendJacksonFloat appends f as Jackson writes a float or double: Java's
// Float.toString or Double.toString, except that NaN and the infinities are
// quoted strings (Jackson's default QUOTE_NON_NUMERIC_NUMBERS).
func appendJacksonFloat(dst []byte, f float64, bitSize int) []byte {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		dst = append(dst, '"')
		dst = appendJavaFloat(dst, f, bitSize)
		return append(dst, '"')
	}
	return appendJavaFloat(dst, f, bitSize)
}

// appendJavaFloat appends f as Java's Double.toString (bitSize 64) or
// Float.toString (bitSize 32) print it since Java 19, whose output is
// specified exactly: the shortest decimal that rounds to f (when that has
// one digit, the closest of one or two digits), written as
// [-]ddd.ddd when 10^-3 <= |f| < 10^7 and as [-]d.dddE[-]n otherwise, with
// at least one digit after the point. Java 17 and older use an earlier
// algorithm that prints a few values with more digits than needed.
func appendJavaFloat(dst []byte, f float64, bitSize int) []byte {
	switch {
	case math.IsNaN(f):
		return append(dst, "NaN"...)
	case math.IsInf(f, 1):
		return append(dst, "Infinity"...)
	case math.IsInf(f, -1):
		return append(dst, "-Infinity"...)
	case f == 0:
		if math.Signbit(f) {
			return append(dst, "-0.0"...)
		}
		return append(dst, "0.0"...)
	}
	if f < 0 {
		dst = append(dst, '-')
		f = -f
	}
	var buf [32]byte
	digits, exp := decimalDigits(strconv.AppendFloat(buf[:0], f, 'e', -1, bitSize))
	if len(digits) == 1 {
		// Java takes the closest decimal of one or two digits that still
		// rounds to f; strconv's two-digit rounding is the closest.
		var buf2 [32]byte
		two := strconv.AppendFloat(buf2[:0], f, 'e', 1, bitSize)
		if back, err := strconv.ParseFloat(string(two), bitSize); err == nil && back == f {
			if d2, e2 := decimalDigits(two); d2[1] != '0' {
				digits, exp = d2, e2
			}
		}
	}
	if exp >= -3 && exp < 7 {
		if exp < 0 {
			dst = append(dst, '0', '.')
			for range -exp - 1 {
				dst = append(dst, '0')
			}
			return append(dst, digits...)
		}
		if len(digits) <= exp+1 {
			dst = append(dst, digits...)
			for range exp + 1 - len(digits) {
				dst = append(dst, '0')
			}
			return append(dst, '.', '0')
		}
		dst = append(dst, digits[:exp+1]...)
		dst = append(dst, '.')
		return append(dst, digits[exp+1:]...)
	}
	dst = append(dst, digits[0], '.')
	if len(digits) == 1 {
		dst = append(dst, '0')
	} else {
		dst = append(dst, digits[1:]...)
	}
	dst = append(dst, 'E')
	return strconv.AppendInt(dst, int64(exp), 10)
}

// decimalDigits splits strconv's 'e' format "d.ddde±xx" (or "de±xx") into
// its significant digits and decimal exponent. It overwrites e.
func decimalDigits(e []byte) ([]byte, int) {
	i := 0
	for i < len(e) && e[i] != 'e' {
		i++
	}
	mant, exp := e[:i], e[i+1:]
	digits := mant[:0]
	for _, c := range mant {
		if c != '.' {
			digits = append(digits, c)
		}
	}
	n, neg := 0, false
	for _, c := range exp {
		switch {
		case c == '-':
			neg = true
		case isDigit(c):
			n = n*10 + int(c-'0')
		}
	}
	if neg {
		n = -n
	}
	return digits, n
}
