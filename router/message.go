package router

import (
	"errors"
	"fmt"
	"slices"
)

// OIDConnectJSON is the type, in a Row made of a message (Row.Message), of
// a column holding a JSON object or array that Debezium made a Kafka
// Connect struct or array of (see DecodeMessage): its value is already the
// JsonConverter bytes of that struct or array. PostgreSQL could give a
// type this OID once its OID counter wraps, so it has this meaning only in
// a message's row. The router writes such a column as the payload only,
// under value.converter=JsonConverter, where Debezium writes the struct as
// a JSON object; a key, header, envelope field, routing value or timestamp
// of this type is an error.
const OIDConnectJSON uint32 = 0xFFFF_FF01

// Errors of DecodeMessage, each wrapped with the details.
var (
	// ErrMessageNotJSON: the content is not a JSON object Debezium's
	// DecodeLogicalDecodingMessageContent reads (its task stops on it).
	ErrMessageNotJSON = errors.New("content is not a JSON object")
	// ErrMessageNoSchema: Debezium infers no Kafka Connect schema for the
	// content, or its value does not fit the schema (its task stops).
	ErrMessageNoSchema = errors.New("Debezium makes no Kafka Connect struct of the content")
)

// DecodeMessage returns the row of a table-less outbox event, a logical
// decoding message's content, read as Debezium's
// DecodeLogicalDecodingMessageContent transform reads it before its
// EventRouter routes it (Debezium 3's table-less outbox):
//
//   - the content must start with "{" (no white space first) and be one
//     JSON object (Jackson's grammar; pgoutbox also refuses content after
//     the object and unpaired surrogate escapes, which Jackson reads);
//   - Kafka Connect schemas are inferred as for table.expand.json.payload
//     (io.debezium.transforms.outbox.JsonSchemaData), with null fields
//     left out: a field that is null, or an empty array, is no column;
//   - each member becomes a column: a string is text, true and false a
//     boolean, an integer an int4 or int8 (Jackson's int and long), any
//     other number a float8, and an object or array an OIDConnectJSON
//     column holding the JsonConverter bytes of its struct or array;
//   - the columns are sorted by name (the router keys its lookup on the
//     column list).
//
// Where Debezium's task would stop (content not an object, no schema, an
// integer beyond 64 bits, array elements of mixed types) it returns an
// error wrapping ErrMessageNotJSON or ErrMessageNoSchema. The row's values
// are newly allocated; content is not retained.
func (r *Router) DecodeMessage(table string, content []byte) (Row, error) {
	d := &r.msg
	d.shrink()
	defer func() { d.src = nil }()
	if len(content) == 0 || content[0] != '{' {
		if len(content) > 0 && content[0] == '[' {
			return Row{}, fmt.Errorf("%w: it is a JSON array (Debezium's task stops: it casts the content's value to a struct)", ErrMessageNotJSON)
		}
		return Row{}, fmt.Errorf("%w: it does not start with { (Debezium's DecodeLogicalDecodingMessageContent parses only content that does, white space first included)", ErrMessageNotJSON)
	}
	if !d.parse(content) {
		return Row{}, fmt.Errorf("%w: it is not one valid JSON object (Jackson's grammar, with nothing after the object and no unpaired surrogate escape)", ErrMessageNotJSON)
	}
	d.resetSchemas()
	root, ok := d.schemaOf(0)
	if !ok {
		return Row{}, fmt.Errorf("%w: an array mixes types or number classes, holds only nulls or empty arrays, or a member name is empty", ErrMessageNoSchema)
	}
	row := Row{Table: table, Op: OpInsert, Message: true}
	// Never nil, so that an empty string is an empty value, not NULL.
	buf := make([]byte, 0, len(content))
	var ends []int
	// The schema's fields follow the live members' order (schemaOf): one
	// pass over the members finds each field's.
	m := d.nodes[0].first
	for f := d.schemas[root].first; f >= 0; f = d.fields[f].next {
		name := d.fieldName(f)
		for m >= 0 && (d.nodes[m].dead || string(d.key(m)) != string(name)) {
			m = d.nodes[m].next
		}
		if m < 0 {
			return Row{}, fmt.Errorf("%w: member %q not found", ErrMessageNoSchema, name) // cannot happen
		}
		s := d.fields[f].schema
		nd := &d.nodes[m]
		var typ uint32
		switch {
		case s == sString:
			typ, buf = oidText, append(buf, d.text[nd.start:nd.end]...)
		case s == sBool:
			typ = oidBool
			if nd.kind == jsonTrue {
				buf = append(buf, 't')
			} else {
				buf = append(buf, 'f')
			}
		case s == sInt32:
			typ = oidInt4
			tok := d.src[nd.start:nd.end]
			if string(tok) == "-0" {
				tok = tok[1:]
			}
			buf = append(buf, tok...)
		case s == sInt64:
			typ, buf = oidInt8, append(buf, d.src[nd.start:nd.end]...)
		case s == sFloat64 && nd.num == numDouble:
			typ, buf = oidFloat8, append(buf, d.src[nd.start:nd.end]...)
		case s == sFloat64:
			return Row{}, fmt.Errorf("%w: member %q is an integer beyond 64 bits, which Debezium cannot put in the FLOAT64 field it infers for it", ErrMessageNoSchema, name)
		default:
			typ = OIDConnectJSON
			var ok bool
			if buf, ok = d.appendWithSchema(buf, m, s); !ok {
				return Row{}, fmt.Errorf("%w: member %q does not fit the schema Debezium infers for it (an integer beyond 64 bits, or array elements whose members conflict)", ErrMessageNoSchema, name)
			}
		}
		row.Names = append(row.Names, string(name))
		row.Types = append(row.Types, typ)
		ends = append(ends, len(buf))
		m = d.nodes[m].next
	}
	row.Values = make([][]byte, len(row.Names))
	prev := 0
	for i, end := range ends {
		row.Values[i] = buf[prev:end:end]
		prev = end
	}
	sortRow(&row)
	return row, nil
}

// sortRow sorts row's columns by name.
func sortRow(row *Row) {
	idx := make([]int, len(row.Names))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int {
		switch {
		case row.Names[a] < row.Names[b]:
			return -1
		case row.Names[a] > row.Names[b]:
			return 1
		}
		return 0
	})
	names, types, values := make([]string, len(idx)), make([]uint32, len(idx)), make([][]byte, len(idx))
	for i, j := range idx {
		names[i], types[i], values[i] = row.Names[j], row.Types[j], row.Values[j]
	}
	row.Names, row.Types, row.Values = names, types, values
}
