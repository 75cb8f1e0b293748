package router

import (
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"time"
)

// This file holds the Kafka Connect values Debezium's PostgreSQL connector
// makes of the column types whose value is not their text, at the
// connector's default handling modes (decimal.handling.mode=precise,
// time.precision.mode=adaptive, interval.handling.mode=numeric), which the
// connector import refuses to change:
//
//   - numeric(p,s): Connect's Decimal, the unscaled value with scale s;
//     numeric without a precision: io.debezium.data.VariableScaleDecimal,
//     a struct {scale, value} of the value with its trailing zeros
//     stripped. NaN and the infinities, which neither holds, are null,
//     as Debezium 3.6.1 writes them.
//   - date: io.debezium.time.Date, INT32 days since 1970-01-01.
//   - time(p): io.debezium.time.Time, INT32 milliseconds since midnight,
//     for p <= 3; io.debezium.time.MicroTime, INT64 microseconds, for
//     p <= 6 or no precision.
//   - timestamp(p): io.debezium.time.Timestamp, INT64 milliseconds since
//     the epoch, for p <= 3; io.debezium.time.MicroTimestamp, INT64
//     microseconds, for p <= 6 or no precision.
//   - timestamptz(p): io.debezium.time.ZonedTimestamp, the instant in UTC
//     as ISO-8601 text with exactly p (6 without a precision) digits of
//     fraction, "infinity" and "-infinity" as they are.
//   - interval: io.debezium.time.MicroDuration, INT64 microseconds, a
//     month counted as 365.25/12 days, computed in doubles as Debezium
//     does.
//
// The conformance suite (pkg/conformance) holds each against the real
// Debezium. money, timetz, the built-in array types, the built-in types
// outside builtinReproduced and the user-defined types other than enums,
// citext and domains (see NotReproducedType) get Connect values pgoutbox
// does not reproduce: placed through a Kafka Connect converter,
// they are an error (a poison row) rather than other bytes than Debezium's.

// PostgreSQL type OIDs of the logical types.
const (
	oidMoney    = 790
	oidDate     = 1082
	oidTime     = 1083
	oidInterval = 1186
	oidTimeTZ   = 1266
	oidBit      = 1560
	oidVarbit   = 1562
)

// connectKind is the kind of a Connect value.
type connectKind uint8

const (
	cvText       connectKind = iota // not a logical type: the column's text encodings apply
	cvInt                           // INT32 or INT64: n
	cvDecimal                       // Connect's Decimal
	cvVarDecimal                    // io.debezium.data.VariableScaleDecimal
	cvString                        // STRING: s
	cvNull                          // null: a numeric's NaN or infinity
)

// connectValue is the Connect value of a logical-type column.
type connectValue struct {
	kind connectKind
	n    int64
	// Decimals: the sign, the unscaled value's decimal digits (no leading
	// zeros, "0" for zero) and the scale.
	neg    bool
	digits []byte
	scale  int
	s      []byte
}

// errNotEmulated is the error of a type whose Connect value pgoutbox does
// not reproduce.
var errNotEmulated = errors.New("pgoutbox does not reproduce the Kafka Connect value Debezium makes of this type: route it through the raw converter, or not at all")

// logicalValue returns the Connect value Debezium makes of column value v
// (not NULL) of type oid with type modifier mod, or kind cvText when
// the type is not a logical one.
func logicalValue(oid uint32, mod int32, v []byte) (connectValue, error) {
	switch oid {
	case oidNumeric:
		return numericValue(mod, v)
	case oidDate:
		t, ok := parseDate(v)
		if !ok {
			return connectValue{}, fmt.Errorf("date %q: only dates of years 1 to 9999 have a Debezium value pgoutbox reproduces", v)
		}
		return connectValue{kind: cvInt, n: floorDiv(t.Unix(), 86400)}, nil
	case oidTime:
		us, ok := parseTimeOfDay(v)
		if !ok {
			return connectValue{}, fmt.Errorf("time %q: not HH:MM:SS[.ffffff]", v)
		}
		if precision(mod) <= 3 {
			return connectValue{kind: cvInt, n: floorDiv(us, 1000)}, nil
		}
		return connectValue{kind: cvInt, n: us}, nil
	case oidTimestamp:
		t, ok := parseTimestamp(v)
		if !ok {
			return connectValue{}, fmt.Errorf("timestamp %q: only timestamps of years 1 to 9999 have a Debezium value pgoutbox reproduces", v)
		}
		if precision(mod) <= 3 {
			return connectValue{kind: cvInt, n: t.UnixMilli()}, nil
		}
		return connectValue{kind: cvInt, n: t.UnixMicro()}, nil
	case oidTimestampTZ:
		if string(v) == "infinity" || string(v) == "-infinity" {
			return connectValue{kind: cvString, s: v}, nil
		}
		t, ok := parseTimestamp(v)
		if !ok || t.Year() < 1 || t.Year() > 9999 {
			return connectValue{}, fmt.Errorf("timestamptz %q: only timestamps of years 1 to 9999 have a Debezium value pgoutbox reproduces", v)
		}
		return connectValue{kind: cvString, s: appendZonedTimestamp(nil, t, precision(mod))}, nil
	case oidInterval:
		us, err := intervalMicros(v)
		if err != nil {
			return connectValue{}, err
		}
		return connectValue{kind: cvInt, n: us}, nil
	}
	return connectValue{}, ConnectTypeRefused(oid)
}

// ConnectTypeRefused says why a column of type oid (as its caller resolves
// it: see NotReproducedType) is refused when written through a Kafka
// Connect converter, or nil when pgoutbox writes Debezium's bytes of it.
// Its refusal makes every row with a value in such a column a poison row.
func ConnectTypeRefused(oid uint32) error {
	switch oid {
	case oidMoney:
		return fmt.Errorf("money: %w", errNotEmulated)
	case oidTimeTZ:
		return fmt.Errorf("timetz: %w", errNotEmulated)
	case oidBit, oidVarbit:
		return fmt.Errorf("bit: %w", errNotEmulated)
	}
	if arrayType(oid) {
		return fmt.Errorf("an array (type OID %d): %w", oid, errNotEmulated)
	}
	switch {
	case oid == NotReproducedType:
		return fmt.Errorf("a user-defined type (an array of an enum or a domain, a composite, a range or an extension's type such as hstore): %w", errNotEmulated)
	case oid < firstUserOID && !builtinReproduced(oid):
		return fmt.Errorf("%s: %w", builtinName(oid), errNotEmulated)
	}
	return nil
}

// firstUserOID is PostgreSQL's FirstNormalObjectId: types with lower OIDs
// are built in. A user type reaches the router resolved by its caller: a
// domain as its base type, one pgoutbox does not reproduce as
// NotReproducedType; any other (an enum, citext) is its text.
const firstUserOID = 16384

// builtinReproduced reports whether pgoutbox writes the Connect value
// Debezium 3.6.1 makes of built-in type oid (0: no type given, taken as
// text), at its default handling modes. Each is placed by the conformance
// suite's typed configurations and held against the real Debezium. Every
// other built-in type is refused rather than written as bytes Debezium
// does not write: point (Debezium makes a struct of it), box, circle,
// line, lseg, path, polygon, pg_lsn, the reg* and other types Debezium
// leaves out of its record (its EventRouter then stops on the placed
// column), and name, which Debezium writes as null.
func builtinReproduced(oid uint32) bool {
	switch oid {
	case 0,
		oidBool, oidBytea, 18 /* "char" */, oidInt8, oidInt2, oidInt4, 25 /* text */, oidOID,
		oidJSON, 142 /* xml */, 650 /* cidr */, oidFloat4, oidFloat8, 774 /* macaddr8 */, 829 /* macaddr */, 869, /* inet */
		1042 /* bpchar */, 1043 /* varchar */, oidDate, oidTime, oidTimestamp, oidTimestampTZ, oidInterval, oidNumeric,
		2950 /* uuid */, 3614 /* tsvector */, oidJSONB,
		3904, 3906, 3908, 3910, 3912, 3926: // int4range, numrange, tsrange, tstzrange, daterange, int8range
		return true
	}
	return false
}

// builtinName names a built-in type pgoutbox does not reproduce.
func builtinName(oid uint32) string {
	switch oid {
	case 19:
		return "name (Debezium writes it as null)"
	case 600:
		return "point (Debezium makes a struct of it)"
	case 603, 718, 628, 601, 602, 604:
		return fmt.Sprintf("a geometric type (OID %d), which Debezium leaves out of its record", oid)
	}
	return fmt.Sprintf("built-in type OID %d, which Debezium leaves out of its record or converts in its own way", oid)
}

// NotReproducedType is the type a caller gives a column of a user-defined
// type whose Connect value pgoutbox does not reproduce: an array of an enum
// or a domain (Debezium makes a Connect array), a composite, a range or
// multirange of a user type, or an extension's type such as hstore (JSON)
// or PostGIS's geometry (a struct). Placed through a Kafka Connect
// converter, such a column is an error (a poison row); through the raw
// converter, its text as ever. It is the largest OID; a real type of that
// OID never reaches the router, since callers map every type that is not
// built in to a built-in type or to this.
const NotReproducedType uint32 = math.MaxUint32

// arrayType reports whether oid is one of the built-in array types
// (Debezium makes Connect arrays of them).
func arrayType(oid uint32) bool {
	switch oid {
	case 199, 629, 1000, 1001, 1002, 1003, 1005, 1006, 1007, 1008, 1009, 1014, 1015, 1016, 1021, 1022,
		1028, 1115, 1182, 1183, 1185, 1187, 1231, 1270, 2951, 3807, 143:
		return true
	}
	return false
}

// precision is the precision of a time type with type modifier mod: 6
// without one, as PostgreSQL and Debezium take it.
func precision(mod int32) int {
	if mod < 0 || mod > 6 {
		return 6
	}
	return int(mod)
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// numericValue makes numeric text v (with type modifier mod) a Decimal, or
// without a precision a VariableScaleDecimal, as Debezium does.
func numericValue(mod int32, v []byte) (connectValue, error) {
	c := connectValue{kind: cvDecimal}
	if mod < 0 {
		c.kind = cvVarDecimal
	}
	s := v
	if len(s) > 0 && (s[0] == '-' || s[0] == '+') {
		c.neg = s[0] == '-'
		s = s[1:]
	}
	var digits []byte
	sawPoint, ok := false, len(s) > 0
	for _, ch := range s {
		switch {
		case ch == '.' && !sawPoint:
			sawPoint = true
		case isDigit(ch):
			digits = append(digits, ch)
			if sawPoint {
				c.scale++
			}
		default:
			ok = false
		}
	}
	if !ok || len(digits) == 0 {
		switch string(v) {
		case "NaN", "Infinity", "-Infinity":
			// A Decimal cannot hold them: a real Debezium 3.6.1 makes
			// the column null (key, value, header, envelope) and goes on
			// (a black-box review; pgoutbox took it for a task that
			// stops, and made the row poison).
			return connectValue{kind: cvNull}, nil
		}
		return connectValue{}, fmt.Errorf("numeric %q: not a number PostgreSQL prints", v)
	}
	for len(digits) > 1 && digits[0] == '0' {
		digits = digits[1:]
	}
	if c.kind == cvVarDecimal {
		// BigDecimal.stripTrailingZeros, then a negative scale set back
		// to 0.
		for c.scale > 0 && len(digits) > 1 && digits[len(digits)-1] == '0' {
			digits, c.scale = digits[:len(digits)-1], c.scale-1
		}
		if len(digits) == 1 && digits[0] == '0' {
			c.scale = 0
		}
	} else if want := numericScale(mod); c.scale != want {
		// PostgreSQL prints a numeric(p,s) with s digits of fraction.
		return connectValue{}, fmt.Errorf("numeric %q: %d digits of fraction, not the column's scale %d", v, c.scale, want)
	}
	if len(digits) == 1 && digits[0] == '0' {
		c.neg = false
	}
	c.digits = digits
	return c, nil
}

// numericScale is the scale of a numeric type modifier (PostgreSQL 15
// allows a negative one: the low 11 bits, signed).
func numericScale(mod int32) int {
	return int(((mod-4)&0x7ff)^1024) - 1024
}

// unscaledBytes is Java's BigInteger.toByteArray of the unscaled value: the
// shortest two's-complement, big-endian bytes.
func (c *connectValue) unscaledBytes() []byte {
	var x big.Int
	x.SetString(string(c.digits), 10)
	if !c.neg {
		b := x.Bytes()
		if len(b) == 0 || b[0]&0x80 != 0 {
			b = append([]byte{0}, b...)
		}
		return b
	}
	// -x in n bytes is 2^(8n) - x, for the least n with x <= 2^(8n-1).
	var m big.Int
	m.Sub(&x, big.NewInt(1)) // |value| - 1 = ^value
	n := m.BitLen()/8 + 1
	var y big.Int
	y.Lsh(big.NewInt(1), uint(8*n))
	y.Sub(&y, &x)
	b := y.Bytes()
	for len(b) < n {
		b = append([]byte{0}, b...)
	}
	return b
}

// appendJavaBigDecimal appends the decimal as Java's BigDecimal.toString
// prints it: plain when the scale is not negative and the adjusted
// exponent is at least -6, else in scientific notation (1.000E-7).
func (c *connectValue) appendJavaBigDecimal(dst []byte) []byte {
	if c.neg {
		dst = append(dst, '-')
	}
	coeff, scale := c.digits, c.scale
	adjusted := -scale + len(coeff) - 1
	switch {
	case scale == 0:
		return append(dst, coeff...)
	case scale > 0 && adjusted >= -6:
		if len(coeff) > scale {
			dst = append(dst, coeff[:len(coeff)-scale]...)
			dst = append(dst, '.')
			return append(dst, coeff[len(coeff)-scale:]...)
		}
		dst = append(dst, "0."...)
		for range scale - len(coeff) {
			dst = append(dst, '0')
		}
		return append(dst, coeff...)
	}
	dst = append(dst, coeff[0])
	if len(coeff) > 1 {
		dst = append(dst, '.')
		dst = append(dst, coeff[1:]...)
	}
	dst = append(dst, 'E')
	if adjusted > 0 {
		dst = append(dst, '+')
	}
	return strconv.AppendInt(dst, int64(adjusted), 10)
}

// appendVarDecimalJSON appends a VariableScaleDecimal as JsonConverter and
// SimpleHeaderConverter write the struct: {"scale":S,"value":"<base64>"}.
func (c *connectValue) appendVarDecimalJSON(dst []byte) []byte {
	dst = append(dst, `{"scale":`...)
	dst = strconv.AppendInt(dst, int64(c.scale), 10)
	dst = append(dst, `,"value":"`...)
	dst = base64.StdEncoding.AppendEncode(dst, c.unscaledBytes())
	return append(dst, `"}`...)
}

// appendJSON appends c as Kafka Connect's JsonConverter writes it
// (schemas.enable=false, decimal.format=BASE64).
func (c *connectValue) appendJSON(dst []byte) []byte {
	switch c.kind {
	case cvNull:
		return append(dst, "null"...)
	case cvInt:
		return strconv.AppendInt(dst, c.n, 10)
	case cvDecimal:
		dst = append(dst, '"')
		dst = base64.StdEncoding.AppendEncode(dst, c.unscaledBytes())
		return append(dst, '"')
	case cvVarDecimal:
		return c.appendVarDecimalJSON(dst)
	}
	return appendJacksonString(dst, c.s)
}

// text returns c as StringConverter (header false) or
// SimpleHeaderConverter (header true) writes it.
func (c *connectValue) text(header bool) ([]byte, error) {
	switch c.kind {
	case cvNull:
		return nil, nil
	case cvInt:
		return strconv.AppendInt(nil, c.n, 10), nil
	case cvDecimal:
		return c.appendJavaBigDecimal(nil), nil
	case cvVarDecimal:
		if !header {
			// Struct.toString(), with the bytes' identity hash code.
			return nil, errors.New("numeric without a precision: Debezium's StringConverter writes its VariableScaleDecimal struct's Java toString (with an object address), no value pgoutbox can reproduce; give the column a precision (numeric(p,s))")
		}
		return c.appendVarDecimalJSON(nil), nil
	}
	return c.s, nil
}

// parseDate parses PostgreSQL's ISO date output "YYYY-MM-DD" (years 1 to
// 9999, no BC, no infinity) as midnight UTC.
func parseDate(v []byte) (time.Time, bool) {
	if len(v) != 10 || v[4] != '-' || v[7] != '-' {
		return time.Time{}, false
	}
	y, ok1 := atoiN(v[0:4])
	m, ok2 := atoiN(v[5:7])
	d, ok3 := atoiN(v[8:10])
	if !ok1 || !ok2 || !ok3 || y < 1 || m < 1 || m > 12 || d < 1 || d > 31 {
		return time.Time{}, false
	}
	return time.Date(y, time.Month(m), d, 0, 0, 0, 0, time.UTC), true
}

// parseTimeOfDay parses PostgreSQL's time output "HH:MM:SS[.f...]" (24:00:00
// included) into microseconds since midnight.
func parseTimeOfDay(v []byte) (int64, bool) {
	if len(v) < 8 || v[2] != ':' || v[5] != ':' {
		return 0, false
	}
	h, ok1 := atoiN(v[0:2])
	m, ok2 := atoiN(v[3:5])
	s, ok3 := atoiN(v[6:8])
	if !ok1 || !ok2 || !ok3 || h > 24 || m > 59 || s > 59 {
		return 0, false
	}
	us := int64(h*3600+m*60+s) * 1_000_000
	if len(v) > 8 {
		f := v[9:]
		if v[8] != '.' || len(f) == 0 || len(f) > 6 {
			return 0, false
		}
		frac, ok := atoiN(f)
		if !ok {
			return 0, false
		}
		for range 6 - len(f) {
			frac *= 10
		}
		us += int64(frac)
	}
	return us, true
}

// atoiN parses unsigned decimal digits only.
func atoiN(b []byte) (int, bool) {
	n := 0
	for _, c := range b {
		if !isDigit(c) {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, len(b) > 0
}

// appendZonedTimestamp appends t (UTC) as Debezium's ZonedTimestamp with
// fractional width w: YYYY-MM-DDTHH:MM:SS, then exactly w digits of the
// second's fraction (none for w 0, where Java's ISO_OFFSET_DATE_TIME prints
// as many as are not zero), then Z.
func appendZonedTimestamp(dst []byte, t time.Time, w int) []byte {
	dst = t.AppendFormat(dst, "2006-01-02T15:04:05")
	frac := fmt.Sprintf("%09d", t.Nanosecond())
	switch {
	case w > 0:
		dst = append(dst, '.')
		dst = append(dst, frac[:w]...)
	case t.Nanosecond() != 0:
		// ISO_LOCAL_TIME: 3, 6 or 9 digits, as few as hold it.
		n := 9
		for n > 3 && frac[n-3:n] == "000" {
			n -= 3
		}
		dst = append(dst, '.')
		dst = append(dst, frac[:n]...)
	}
	return append(dst, 'Z')
}

// intervalMicros converts PostgreSQL's interval output (IntervalStyle
// postgres, the default: "1 year 2 mons 3 days 04:05:06.789", "-01:00:00")
// into Debezium's MicroDuration: the JDBC driver's PGInterval reads the
// fields (the seconds rounded to whole microseconds), and Debezium adds them
// up in doubles, a month as 365.25/12 days, and truncates to a long.
func intervalMicros(v []byte) (int64, error) {
	var years, months, days, hours, minutes int64
	var seconds float64
	fields := splitSpace(v)
	bad := func() (int64, error) {
		return 0, fmt.Errorf("interval %q: not in PostgreSQL's default IntervalStyle (postgres), the one whose Debezium value pgoutbox reproduces", v)
	}
	for i := 0; i < len(fields); i++ {
		f := fields[i]
		if c := indexByte(f, ':'); c >= 0 {
			neg := f[0] == '-'
			if neg || f[0] == '+' {
				f = f[1:]
				c--
			}
			h, err := strconv.ParseInt(string(f[:c]), 10, 64)
			if err != nil || len(f) < c+3 {
				return bad()
			}
			m, err := strconv.ParseInt(string(f[c+1:c+3]), 10, 64)
			if err != nil {
				return bad()
			}
			var s float64
			if len(f) > c+3 {
				if f[c+3] != ':' {
					return bad()
				}
				if s, err = strconv.ParseFloat(string(f[c+4:]), 64); err != nil {
					return bad()
				}
			}
			if neg {
				h, m, s = -h, -m, -s
			}
			hours, minutes, seconds = h, m, s
			continue
		}
		if i+1 >= len(fields) {
			return bad()
		}
		n, err := strconv.ParseInt(string(f), 10, 32)
		if err != nil {
			return bad()
		}
		switch unit := string(fields[i+1]); unit {
		case "year", "years":
			years = n
		case "mon", "mons":
			months = n
		case "day", "days":
			days = n
		default:
			return bad()
		}
		i++
	}
	// PGInterval.setSeconds: whole microseconds, Math.round; getSeconds
	// adds them back as a double.
	total := int64(math.Floor(float64(seconds*1e6) + 0.5))
	sec := float64(total/1_000_000) + float64(total%1_000_000)/1e6
	// MicroDuration.durationMicros, step by step (each product rounded as
	// Java rounds it: no fused multiply-add).
	daysTotal := float64(float64(years*12+months)*(365.25/12.0)) + float64(days)
	secs := float64(float64(float64(float64(float64(daysTotal*24)+float64(hours))*60)+float64(minutes))*60) + sec
	us := float64(secs * 1e6)
	// Java's (long) saturates where Go's conversion is undefined.
	switch {
	case us >= math.MaxInt64:
		return math.MaxInt64, nil
	case us <= math.MinInt64:
		return math.MinInt64, nil
	}
	return int64(us), nil
}

func splitSpace(v []byte) [][]byte {
	var out [][]byte
	start := -1
	for i, c := range v {
		if c == ' ' {
			if start >= 0 {
				out = append(out, v[start:i])
				start = -1
			}
			continue
		}
		if start < 0 {
			start = i
		}
	}
	if start >= 0 {
		out = append(out, v[start:])
	}
	return out
}

func indexByte(b []byte, c byte) int {
	for i, x := range b {
		if x == c {
			return i
		}
	}
	return -1
}
