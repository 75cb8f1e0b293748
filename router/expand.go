package router

import (
	"bytes"
	"slices"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// This file implements table.expand.json.payload: a JSON parser with the
// acceptance rules of Jackson's ObjectMapper.readTree (Debezium's parser),
// and two renderings of the parsed payload: pgoutbox's raw JSON, and the
// bytes Kafka Connect's JsonConverter writes for the Struct Debezium builds
// from it (io.debezium.transforms.outbox.JsonSchemaData).

// Limits, as Jackson's default StreamReadConstraints (2.15 and later).
const (
	maxJSONDepth     = 1000 // nesting of objects and arrays
	maxJSONNumberLen = 1000 // characters of one number
)

// jsonKind is the kind of a JSON value.
type jsonKind uint8

const (
	jsonNull jsonKind = iota + 1
	jsonFalse
	jsonTrue
	jsonNumber
	jsonString
	jsonArray
	jsonObject
)

// numClass is how Jackson reads a number: an integer that fits an int, one
// that fits a long, a larger integer (BigInteger), or a double (any number
// with a fraction or an exponent).
type numClass uint8

const (
	numInt32 numClass = iota + 1
	numInt64
	numBig
	numDouble
)

// jsonNode is one value of a parsed document. Children of an array or
// object are linked through first and next; an object member's key is
// kept on the member's node.
type jsonNode struct {
	kind jsonKind
	num  numClass
	// dead marks an object member superseded by a later one with the same
	// key (Jackson keeps the first position and the last value).
	dead bool
	// start, end: a number's token in the source, or a string's decoded
	// text in jsonDoc.text.
	start, end int32
	// keyStart, keyEnd: an object member's decoded key in jsonDoc.text.
	keyStart, keyEnd int32
	first, last      int32 // first and last child, -1 if none
	next             int32 // next sibling, -1 if none
	count            int32 // children, superseded members included
}

// jsonDoc is a parsed document: its nodes in one slice (the root first) and
// its decoded strings in one byte slice. A Router keeps one and reuses its
// memory, so that parsing allocates only while documents grow.
type jsonDoc struct {
	src       []byte
	nodes     []jsonNode
	text      []byte
	keepNulls bool // table.json.payload.null.behavior=optional_bytes
	// jackson parses as Jackson's readTree does beyond JSON's grammar, for
	// the JsonConverter rendering: content after the root value is
	// ignored, and unpaired UTF-16 surrogate escapes are kept (in d.text as
	// the 3-byte sequences of WTF-8, which appendJacksonString escapes).
	jackson bool

	order []int32 // scratch for finding duplicate keys

	// Connect schemas inferred for the JsonConverter rendering.
	schemas  []connectSchema
	fields   []schemaField
	fieldMap map[string]int32 // field lookup for large structs
	mapFor   int32            // the struct fieldMap indexes, or -1
}

// shrink drops scratch memory grown beyond maxScratch by a large document.
func (d *jsonDoc) shrink() {
	if cap(d.nodes) > maxScratch/16 {
		d.nodes = nil
	}
	if cap(d.text) > maxScratch {
		d.text = nil
	}
	if cap(d.order) > maxScratch/16 {
		d.order = nil
	}
	if cap(d.schemas) > maxScratch/16 || cap(d.fields) > maxScratch/16 {
		d.schemas, d.fields = nil, nil
	}
	if len(d.fieldMap) > 1024 {
		d.fieldMap = nil
	}
	d.src = nil
}

// parse parses src, a complete JSON document whose root is an object or an
// array, with leading and trailing whitespace. It reports false for
// anything Jackson rejects (no comments, no trailing commas, no leading
// zeros, no NaN, no unescaped control characters in strings, depth and
// number length limits), for unpaired UTF-16 surrogate escapes (which
// Jackson reads but cannot write back), and for anything but whitespace
// after the root value (which Jackson ignores by default; pgoutbox does not
// silently drop part of a payload).
func (d *jsonDoc) parse(src []byte) bool {
	d.src, d.nodes, d.text = src, d.nodes[:0], d.text[:0]
	i := skipJSONSpace(src, 0)
	if i == len(src) || src[i] != '{' && src[i] != '[' {
		return false
	}
	_, i, ok := d.value(i, 1)
	return ok && (d.jackson || skipJSONSpace(src, i) == len(src))
}

// skipJSONSpace skips the whitespace Jackson accepts: space, tab, CR, LF.
func skipJSONSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

func (d *jsonDoc) add(kind jsonKind) int32 {
	d.nodes = append(d.nodes, jsonNode{kind: kind, first: -1, last: -1, next: -1})
	return int32(len(d.nodes) - 1)
}

func (d *jsonDoc) link(parent, child int32) {
	p := &d.nodes[parent]
	if p.last < 0 {
		p.first = child
	} else {
		d.nodes[p.last].next = child
	}
	p.last = child
	p.count++
}

// value parses the value at src[i] (not whitespace) at nesting depth
// depth, and returns its node and the position after it.
func (d *jsonDoc) value(i, depth int) (int32, int, bool) {
	src := d.src
	if i >= len(src) {
		return 0, i, false
	}
	switch c := src[i]; {
	case c == '{':
		if depth > maxJSONDepth {
			return 0, i, false
		}
		n := d.add(jsonObject)
		i = skipJSONSpace(src, i+1)
		if i < len(src) && src[i] == '}' {
			return n, i + 1, true
		}
		for {
			if i >= len(src) || src[i] != '"' {
				return 0, i, false
			}
			ks, ke, j, ok := d.str(i)
			if !ok {
				return 0, j, false
			}
			i = skipJSONSpace(src, j)
			if i >= len(src) || src[i] != ':' {
				return 0, i, false
			}
			child, j, ok := d.value(skipJSONSpace(src, i+1), depth+1)
			if !ok {
				return 0, j, false
			}
			d.nodes[child].keyStart, d.nodes[child].keyEnd = ks, ke
			d.link(n, child)
			i = skipJSONSpace(src, j)
			if i < len(src) && src[i] == ',' {
				i = skipJSONSpace(src, i+1)
				continue
			}
			if i < len(src) && src[i] == '}' {
				d.dedupe(n)
				return n, i + 1, true
			}
			return 0, i, false
		}
	case c == '[':
		if depth > maxJSONDepth {
			return 0, i, false
		}
		n := d.add(jsonArray)
		i = skipJSONSpace(src, i+1)
		if i < len(src) && src[i] == ']' {
			return n, i + 1, true
		}
		for {
			child, j, ok := d.value(i, depth+1)
			if !ok {
				return 0, j, false
			}
			d.link(n, child)
			i = skipJSONSpace(src, j)
			if i < len(src) && src[i] == ',' {
				i = skipJSONSpace(src, i+1)
				continue
			}
			if i < len(src) && src[i] == ']' {
				return n, i + 1, true
			}
			return 0, i, false
		}
	case c == '"':
		s, e, j, ok := d.str(i)
		if !ok {
			return 0, j, false
		}
		n := d.add(jsonString)
		d.nodes[n].start, d.nodes[n].end = s, e
		return n, j, true
	case c == 't':
		return d.literal(i, "true", jsonTrue)
	case c == 'f':
		return d.literal(i, "false", jsonFalse)
	case c == 'n':
		return d.literal(i, "null", jsonNull)
	case c == '-' || isDigit(c):
		return d.number(i)
	}
	return 0, i, false
}

func (d *jsonDoc) literal(i int, lit string, kind jsonKind) (int32, int, bool) {
	if len(d.src)-i < len(lit) || string(d.src[i:i+len(lit)]) != lit {
		return 0, i, false
	}
	return d.add(kind), i + len(lit), true
}

// number parses a JSON number and classifies it as Jackson does.
func (d *jsonDoc) number(i int) (int32, int, bool) {
	src := d.src
	j := i
	if src[j] == '-' {
		j++
	}
	switch {
	case j < len(src) && src[j] == '0':
		j++
	case j < len(src) && src[j] >= '1' && src[j] <= '9':
		for j < len(src) && isDigit(src[j]) {
			j++
		}
	default:
		return 0, j, false
	}
	class := numInt32
	if j < len(src) && src[j] == '.' {
		class = numDouble
		j++
		k := j
		for j < len(src) && isDigit(src[j]) {
			j++
		}
		if j == k {
			return 0, j, false
		}
	}
	if j < len(src) && (src[j] == 'e' || src[j] == 'E') {
		class = numDouble
		j++
		if j < len(src) && (src[j] == '+' || src[j] == '-') {
			j++
		}
		k := j
		for j < len(src) && isDigit(src[j]) {
			j++
		}
		if j == k {
			return 0, j, false
		}
	}
	if j-i > maxJSONNumberLen {
		return 0, j, false
	}
	if class == numInt32 {
		n, err := strconv.ParseInt(string(src[i:j]), 10, 64)
		switch {
		case err != nil:
			class = numBig
		case n < -1<<31 || n > 1<<31-1:
			class = numInt64
		}
	}
	n := d.add(jsonNumber)
	d.nodes[n].num, d.nodes[n].start, d.nodes[n].end = class, int32(i), int32(j)
	return n, j, true
}

// str decodes the string literal at src[i] into d.text and returns the
// decoded text's span and the position after the literal.
func (d *jsonDoc) str(i int) (int32, int32, int, bool) {
	src := d.src
	start := int32(len(d.text))
	i++
	for {
		j := i
		for j < len(src) && src[j] != '"' && src[j] != '\\' && src[j] >= 0x20 {
			j++
		}
		d.text = append(d.text, src[i:j]...)
		if j >= len(src) || src[j] < 0x20 {
			return 0, 0, j, false
		}
		if src[j] == '"' {
			return start, int32(len(d.text)), j + 1, true
		}
		// A backslash escape.
		j++
		if j >= len(src) {
			return 0, 0, j, false
		}
		switch c := src[j]; c {
		case '"', '\\', '/':
			d.text = append(d.text, c)
		case 'b':
			d.text = append(d.text, '\b')
		case 'f':
			d.text = append(d.text, '\f')
		case 'n':
			d.text = append(d.text, '\n')
		case 'r':
			d.text = append(d.text, '\r')
		case 't':
			d.text = append(d.text, '\t')
		case 'u':
			r, ok := hex4(src, j+1)
			if !ok {
				return 0, 0, j, false
			}
			j += 4
			if utf16.IsSurrogate(r) {
				// Only a high surrogate followed by an escaped low one
				// makes a character.
				r2, ok := rune(0), false
				if r < 0xDC00 && j+6 < len(src) && src[j+1] == '\\' && src[j+2] == 'u' {
					r2, ok = hex4(src, j+3)
					ok = ok && r2 >= 0xDC00 && r2 <= 0xDFFF
				}
				switch {
				case ok:
					r = utf16.DecodeRune(r, r2)
					j += 6
				case d.jackson:
					d.text = append(d.text, 0xE0|byte(r>>12), 0x80|byte(r>>6)&0x3F, 0x80|byte(r)&0x3F)
					i = j + 1
					continue
				default:
					return 0, 0, j, false
				}
			}
			d.text = utf8.AppendRune(d.text, r)
		default:
			return 0, 0, j, false
		}
		i = j + 1
	}
}

// hex4 reads four hex digits at b[i:].
func hex4(b []byte, i int) (rune, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, c := range b[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

func (d *jsonDoc) key(n int32) []byte {
	return d.text[d.nodes[n].keyStart:d.nodes[n].keyEnd]
}

// dedupe applies Jackson's rule for repeated keys in an object: the member
// keeps the position of the key's first occurrence and takes the value of
// its last one.
func (d *jsonDoc) dedupe(obj int32) {
	o := d.nodes[obj]
	if o.count < 2 {
		return
	}
	if o.count <= 16 {
		for m := d.nodes[o.first].next; m >= 0; m = d.nodes[m].next {
			for k := o.first; k != m; k = d.nodes[k].next {
				if !d.nodes[k].dead && bytes.Equal(d.key(k), d.key(m)) {
					d.supersede(k, m)
					break
				}
			}
		}
		return
	}
	// Many members: sort them by key, keeping document order among equal
	// keys, and merge each run of equal keys into its first member.
	d.order = d.order[:0]
	for m := o.first; m >= 0; m = d.nodes[m].next {
		d.order = append(d.order, m)
	}
	slices.SortStableFunc(d.order, d.compareKeys)
	for i := 0; i < len(d.order); {
		j := i + 1
		for j < len(d.order) && bytes.Equal(d.key(d.order[i]), d.key(d.order[j])) {
			d.supersede(d.order[i], d.order[j])
			j++
		}
		i = j
	}
}

func (d *jsonDoc) compareKeys(a, b int32) int { return bytes.Compare(d.key(a), d.key(b)) }

// supersede gives member k the value of the later member m with the same
// key, and marks m dead.
func (d *jsonDoc) supersede(k, m int32) {
	v := d.nodes[m]
	v.keyStart, v.keyEnd, v.next = d.nodes[k].keyStart, d.nodes[k].keyEnd, d.nodes[k].next
	d.nodes[k] = v
	d.nodes[m].dead = true
}

// appendRaw appends node n as compact JSON: no whitespace, strings
// re-escaped as Jackson writes them, numbers as written, repeated keys
// resolved, and (unless keepNulls) object members whose value is null left
// out, at every depth. Null array elements are kept: dropping them would
// move the elements after them.
func (d *jsonDoc) appendRaw(dst []byte, n int32) []byte {
	nd := &d.nodes[n]
	switch nd.kind {
	case jsonNull:
		return append(dst, "null"...)
	case jsonFalse:
		return append(dst, "false"...)
	case jsonTrue:
		return append(dst, "true"...)
	case jsonNumber:
		return append(dst, d.src[nd.start:nd.end]...)
	case jsonString:
		return appendJSONString(dst, d.text[nd.start:nd.end])
	case jsonArray:
		dst = append(dst, '[')
		for c := nd.first; c >= 0; c = d.nodes[c].next {
			if c != nd.first {
				dst = append(dst, ',')
			}
			dst = d.appendRaw(dst, c)
		}
		return append(dst, ']')
	}
	dst = append(dst, '{')
	first := true
	for c := nd.first; c >= 0; c = d.nodes[c].next {
		m := &d.nodes[c]
		if m.dead || m.kind == jsonNull && !d.keepNulls {
			continue
		}
		if !first {
			dst = append(dst, ',')
		}
		first = false
		dst = appendJSONString(dst, d.key(c))
		dst = append(dst, ':')
		dst = d.appendRaw(dst, c)
	}
	return append(dst, '}')
}

// Kafka Connect schemas, as Debezium's JsonSchemaData infers them from a
// document.

type schemaType uint8

const (
	schString schemaType = iota + 1
	schBool
	schInt32
	schInt64
	schFloat64
	schBytes
	schArray
	schStruct
)

// connectSchema is one inferred schema. The primitive schemas sit at fixed
// indexes (sString...sBytes) of jsonDoc.schemas.
type connectSchema struct {
	typ         schemaType
	elem        int32 // an array's element schema
	first, last int32 // a struct's fields in jsonDoc.fields, -1 if none
	count       int32
}

type schemaField struct {
	keyStart, keyEnd int32 // the name, in jsonDoc.text
	schema           int32
	next             int32
}

const (
	sString int32 = iota
	sBool
	sInt32
	sInt64
	sFloat64
	sBytes
	sNone int32 = -1 // no schema: Debezium leaves the field out
)

// connectResult is appendConnect's verdict.
type connectResult uint8

const (
	connectOK connectResult = iota
	// connectNoSchema: Debezium infers no schema; it warns and leaves the
	// payload as it was.
	connectNoSchema
	// connectFails: Debezium infers a schema but the value does not fit it
	// (or is a top-level array); Kafka Connect's converter then fails on
	// the record.
	connectFails
)

// appendConnect appends the expanded document as Kafka Connect's
// JsonConverter (schemas.enable=false) writes the Struct that Debezium's
// EventRouter builds from it, or reports where Debezium's conversion fails.
//
// Debezium infers a schema from the document: a field whose value is null
// has none and is left out (with table.json.payload.null.behavior=ignore)
// or is an optional bytes field written as null (optional_bytes); a field
// whose value is an empty array has none and is left out; an array's
// elements must all have one type (nulls aside), and numbers one class
// (int, long or double); the elements of an array of objects share one
// struct schema with the fields of all of them, so an element lacking a
// field gets it as null. Integers beyond 64 bits fail. Numbers are written
// as Java writes an int, long or double (12.50 becomes 12.5, 1e2 100.0).
//
// Debezium sets the payload's schema before it converts the value, so a
// value that fails conversion after its schema was inferred (an integer
// beyond 64 bits, array elements whose members conflict, and any non-empty
// top-level array, which it converts as a struct) leaves a string under a
// struct or array schema, which the converter rejects. A top-level []
// has no schema and stays a string. For arrays of objects whose elements
// have different fields, Debezium's field order follows a HashSet of the
// element schemas, whose hash codes vary from one JVM to the next;
// pgoutbox uses the order in which the fields first appear.
func (d *jsonDoc) appendConnect(dst []byte) ([]byte, connectResult) {
	d.resetSchemas()
	s, ok := d.schemaOf(0)
	if !ok || s == sNone {
		return dst, connectNoSchema
	}
	if d.nodes[0].kind == jsonArray {
		return dst, connectFails
	}
	out, ok := d.appendWithSchema(dst, 0, s)
	if !ok {
		return out, connectFails
	}
	return out, connectOK
}

// resetSchemas drops the schemas inferred for the last document, keeping
// the primitive ones (sString...sBytes).
func (d *jsonDoc) resetSchemas() {
	d.schemas = append(d.schemas[:0],
		connectSchema{typ: schString}, connectSchema{typ: schBool}, connectSchema{typ: schInt32},
		connectSchema{typ: schInt64}, connectSchema{typ: schFloat64}, connectSchema{typ: schBytes})
	d.fields = d.fields[:0]
	d.mapFor = -1
}

// schemaOf infers node n's schema as JsonSchemaData.toConnectSchema does;
// sNone means none.
func (d *jsonDoc) schemaOf(n int32) (int32, bool) {
	nd := d.nodes[n]
	switch nd.kind {
	case jsonString:
		return sString, true
	case jsonFalse, jsonTrue:
		return sBool, true
	case jsonNumber:
		return numSchema(nd.num), true
	case jsonNull:
		if d.keepNulls {
			return sBytes, true
		}
		return sNone, true
	case jsonArray:
		if nd.count == 0 {
			return sNone, true
		}
		// The first non-null element is the sample; every other non-null
		// element must be of its kind (and, for numbers, class).
		ref := int32(-1)
		for c := nd.first; c >= 0; c = d.nodes[c].next {
			cn := d.nodes[c]
			if cn.kind == jsonNull {
				continue
			}
			if ref < 0 {
				ref = c
				continue
			}
			rn := d.nodes[ref]
			if kindClass(cn.kind) != kindClass(rn.kind) || cn.kind == jsonNumber && numSchema(cn.num) != numSchema(rn.num) {
				return 0, false
			}
		}
		var elem int32
		switch {
		case ref >= 0 && d.nodes[ref].kind == jsonObject:
			elem = sNone
			for c := nd.first; c >= 0; c = d.nodes[c].next {
				if d.nodes[c].kind != jsonObject {
					continue
				}
				s, ok := d.schemaOf(c)
				if !ok {
					return 0, false
				}
				elem = d.merge(elem, s)
			}
		case ref >= 0:
			s, ok := d.schemaOf(ref)
			if !ok {
				return 0, false
			}
			elem = s
		case d.keepNulls: // only nulls
			elem = sBytes
		default:
			elem = sNone
		}
		if elem == sNone {
			return 0, false // "Array ... has unrecognized member schema"
		}
		d.schemas = append(d.schemas, connectSchema{typ: schArray, elem: elem})
		return int32(len(d.schemas) - 1), true
	}
	st := d.newStruct()
	for c := nd.first; c >= 0; c = d.nodes[c].next {
		if d.nodes[c].dead {
			continue
		}
		s, ok := d.schemaOf(c)
		if !ok {
			return 0, false
		}
		if s == sNone {
			continue
		}
		if d.nodes[c].keyEnd == d.nodes[c].keyStart {
			return 0, false // Kafka Connect's SchemaBuilder rejects an empty field name
		}
		d.addField(st, d.nodes[c].keyStart, d.nodes[c].keyEnd, s)
	}
	return st, true
}

func numSchema(c numClass) int32 {
	switch c {
	case numInt32:
		return sInt32
	case numInt64:
		return sInt64
	}
	return sFloat64 // doubles, and integers beyond 64 bits
}

// kindClass folds true and false into one kind, as Jackson's BOOLEAN.
func kindClass(k jsonKind) jsonKind {
	if k == jsonTrue {
		return jsonFalse
	}
	return k
}

func (d *jsonDoc) newStruct() int32 {
	d.schemas = append(d.schemas, connectSchema{typ: schStruct, first: -1, last: -1})
	return int32(len(d.schemas) - 1)
}

func (d *jsonDoc) addField(st, ks, ke, schema int32) {
	d.fields = append(d.fields, schemaField{keyStart: ks, keyEnd: ke, schema: schema, next: -1})
	f := int32(len(d.fields) - 1)
	s := &d.schemas[st]
	if s.last < 0 {
		s.first = f
	} else {
		d.fields[s.last].next = f
	}
	s.last = f
	s.count++
	if d.mapFor == st {
		d.fieldMap[string(d.text[ks:ke])] = f
	}
}

func (d *jsonDoc) fieldName(f int32) []byte {
	return d.text[d.fields[f].keyStart:d.fields[f].keyEnd]
}

// findField returns struct st's field named name, or -1.
func (d *jsonDoc) findField(st int32, name []byte) int32 {
	s := d.schemas[st]
	if s.count <= 32 {
		for f := s.first; f >= 0; f = d.fields[f].next {
			if bytes.Equal(d.fieldName(f), name) {
				return f
			}
		}
		return -1
	}
	if d.mapFor != st {
		if d.fieldMap == nil {
			d.fieldMap = make(map[string]int32)
		}
		clear(d.fieldMap)
		for f := s.first; f >= 0; f = d.fields[f].next {
			d.fieldMap[string(d.fieldName(f))] = f
		}
		d.mapFor = st
	}
	if f, ok := d.fieldMap[string(name)]; ok {
		return f
	}
	return -1
}

// merge merges struct schema right into left (sNone for none yet), as
// JsonSchemaData.mergeSchema does for the elements of an array of objects:
// left's fields, then right's new ones; a field that is bytes in left
// (a null with optional_bytes) takes right's type. left is changed in
// place: it is a schema of no other node.
func (d *jsonDoc) merge(left, right int32) int32 {
	if left == sNone {
		return right
	}
	for f := d.schemas[right].first; f >= 0; f = d.fields[f].next {
		rf := d.fields[f]
		old := d.findField(left, d.fieldName(f))
		switch {
		case old < 0:
			d.addField(left, rf.keyStart, rf.keyEnd, rf.schema)
		case d.fields[old].schema == sBytes && rf.schema != sBytes:
			d.fields[old].schema = rf.schema
		}
	}
	return left
}

// appendWithSchema appends node n converted to schema s and written as
// JsonConverter writes it, or reports false where the value does not fit
// the schema (Kafka Connect's Struct.put rejects it).
func (d *jsonDoc) appendWithSchema(dst []byte, n, s int32) ([]byte, bool) {
	nd := &d.nodes[n]
	switch nd.kind {
	case jsonNull:
		return append(dst, "null"...), true
	case jsonString:
		return appendJacksonString(dst, d.text[nd.start:nd.end]), s == sString
	case jsonFalse:
		return append(dst, "false"...), s == sBool
	case jsonTrue:
		return append(dst, "true"...), s == sBool
	case jsonNumber:
		tok := d.src[nd.start:nd.end]
		switch nd.num {
		case numInt32:
			if string(tok) == "-0" {
				tok = tok[1:]
			}
			return append(dst, tok...), s == sInt32
		case numInt64:
			return append(dst, tok...), s == sInt64
		case numDouble:
			f, ok := parsePGFloat(oidFloat8, tok)
			return appendJacksonFloat(dst, f, 64), ok && s == sFloat64
		}
		return dst, false // a BigDecimal fits no inferred schema
	case jsonArray:
		if s < 0 || d.schemas[s].typ != schArray {
			return dst, false
		}
		elem := d.schemas[s].elem
		dst = append(dst, '[')
		for c := nd.first; c >= 0; c = d.nodes[c].next {
			if c != nd.first {
				dst = append(dst, ',')
			}
			var ok bool
			if dst, ok = d.appendWithSchema(dst, c, elem); !ok {
				return dst, false
			}
		}
		return append(dst, ']'), true
	}
	if s < 0 || d.schemas[s].typ != schStruct {
		return dst, false
	}
	// Every field of the schema, in the schema's order, with the member of
	// that name or null. When the schema was inferred from this object its
	// fields follow the members' order, so look at the next member first.
	dst = append(dst, '{')
	cursor := nd.first
	for f := d.schemas[s].first; f >= 0; f = d.fields[f].next {
		if f != d.schemas[s].first {
			dst = append(dst, ',')
		}
		name := d.fieldName(f)
		dst = appendJacksonString(dst, name)
		dst = append(dst, ':')
		m := int32(-1)
		for c := cursor; c >= 0; c = d.nodes[c].next {
			if !d.nodes[c].dead && bytes.Equal(d.key(c), name) {
				m, cursor = c, d.nodes[c].next
				break
			}
		}
		if m < 0 {
			for c := nd.first; c >= 0; c = d.nodes[c].next {
				if !d.nodes[c].dead && bytes.Equal(d.key(c), name) {
					m = c
					break
				}
			}
		}
		if m < 0 {
			dst = append(dst, "null"...)
			continue
		}
		var ok bool
		if dst, ok = d.appendWithSchema(dst, m, d.fields[f].schema); !ok {
			return dst, false
		}
	}
	return append(dst, '}'), true
}
