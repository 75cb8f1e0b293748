package relay

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"unicode/utf8"

	"github.com/pgoutbox/pgoutbox/replication"
	"github.com/pgoutbox/pgoutbox/router"
)

// PostgreSQL type OIDs given to the fields of a table-less outbox message.
const (
	oidText    = 25
	oidJSONB   = 3802
	oidNumeric = 1700
	oidBool    = 16
)

// errNotObject is returned for a message whose content is not a JSON object.
var errNotObject = errors.New("content is not a JSON object")

// messageRow turns the JSON object of a table-less outbox message
// (pg_logical_emit_message(true, '<prefix>', '{"id": ..., "aggregatetype":
// ..., "aggregateid": ..., "type": ..., "payload": {...}}')) into a row the
// router maps like a row of the outbox table pgoutbox migrate makes: the
// payload field (payloadField) is jsonb, whatever its JSON (a string stays a
// JSON string, as in the table's jsonb column: "" is no empty payload, "x"
// keeps its quotes); of the others, string fields are text, objects and
// arrays are jsonb, numbers and booleans keep their JSON text; null is NULL.
// The row's table is "message:<prefix>".
func messageRow(prefix, payloadField string, content []byte) (router.Row, error) {
	var fields map[string]json.RawMessage
	trimmed := bytes.TrimSpace(content)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return router.Row{}, errNotObject
	}
	err := parseText(trimmed, func() error {
		if err := json.Unmarshal(trimmed, &fields); err != nil {
			return fmt.Errorf("content is not valid JSON: %w", err)
		}
		return nil
	})
	if err != nil {
		return router.Row{}, err
	}
	names := make([]string, 0, len(fields))
	for k := range fields {
		names = append(names, k)
	}
	sort.Strings(names) // a stable column order lets the router reuse its lookup
	row := router.Row{
		Table:  "message:" + prefix,
		Op:     router.OpInsert,
		Names:  names,
		Types:  make([]uint32, len(names)),
		Values: make([][]byte, len(names)),
	}
	for i, k := range names {
		raw := bytes.TrimSpace(fields[k])
		switch {
		case len(raw) == 0 || bytes.Equal(raw, []byte("null")):
			row.Types[i] = oidText
		case k == payloadField:
			row.Types[i], row.Values[i] = oidJSONB, raw
		case raw[0] == '"':
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				return router.Row{}, fmt.Errorf("field %q: %w", k, err)
			}
			row.Types[i], row.Values[i] = oidText, []byte(s)
		case raw[0] == '{' || raw[0] == '[':
			row.Types[i], row.Values[i] = oidJSONB, raw
		case raw[0] == 't' || raw[0] == 'f':
			row.Types[i], row.Values[i] = oidBool, raw
		default:
			row.Types[i], row.Values[i] = oidNumeric, raw
		}
	}
	return row, nil
}

// debeziumMessageRow is messageRow for messages.format=debezium: the row
// Debezium's DecodeLogicalDecodingMessageContent makes of m (see
// router.DecodeMessage), with the checks messageRow makes of its bytes
// (parseText).
func (s *session) debeziumMessageRow(m *replication.Message) (router.Row, error) {
	var row router.Row
	err := parseText(m.Content, func() (err error) {
		row, err = s.r.router.For("message:"+m.Prefix).DecodeMessage("message:"+m.Prefix, m.Content)
		return err
	})
	if err != nil {
		return router.Row{}, err
	}
	return row, nil
}

// parseText runs parse, the JSON parsing of a message's content, after
// the checks of its bytes both message formats make, whose errors say
// where: the content is UTF-8 (encoding/json would turn each invalid byte
// into U+FFFD without a word: a key Müller in LATIN1 would become
// M\ufffdller, on another partition, and the payload would go out as
// LATIN1 bytes), and holds no escape that no text holds (badEscape).
func parseText(content []byte, parse func() error) error {
	if !utf8.Valid(content) {
		return invalidUTF8(content)
	}
	if err := badEscape(content); err != nil {
		return err
	}
	return parse()
}

// badEscape finds, in JSON content, a \u escape no text can hold: a
// surrogate that is not half of a pair, or \u0000. encoding/json turns
// the first into U+FFFD without a word (two keys written \ud800 and
// \udfff became one, on one partition: a black-box review), and keeps the
// second as a NUL; PostgreSQL's jsonb refuses both, so the same event
// written to an outbox table could not have been committed. Poison, as
// content that is not UTF-8 is.
func badEscape(content []byte) error {
	hex4 := func(i int) (rune, bool) {
		if i+6 > len(content) || content[i] != '\\' || content[i+1] != 'u' {
			return 0, false
		}
		v, err := strconv.ParseUint(string(content[i+2:i+6]), 16, 16)
		return rune(v), err == nil
	}
	inString := false
	for i := 0; i < len(content); i++ {
		switch c := content[i]; {
		case c == '"':
			inString = !inString
		case c == '\\' && inString:
			r, ok := hex4(i)
			if !ok {
				i++ // \", \\ and the others: one character
				continue
			}
			switch {
			case r == 0:
				return fmt.Errorf("content has the escape \\u0000 at offset %d: PostgreSQL's text and jsonb hold no NUL character; leave it out", i)
			case r >= 0xD800 && r <= 0xDBFF:
				if lo, ok := hex4(i + 6); ok && lo >= 0xDC00 && lo <= 0xDFFF {
					i += 11
					continue
				}
				fallthrough
			case r >= 0xDC00 && r <= 0xDFFF:
				return fmt.Errorf("content has the escape %s at offset %d, a surrogate that is not half of a pair: no text holds it (PostgreSQL's jsonb refuses it), and decoding it would make it U+FFFD, so that distinct keys became one; write the character itself, or its pair", content[i:i+6], i)
			}
			i += 5
		}
	}
	return nil
}

// invalidUTF8 describes content that is not valid UTF-8, naming the first
// bad byte and the likely cause.
func invalidUTF8(content []byte) error {
	off := 0
	for off < len(content) {
		r, size := utf8.DecodeRune(content[off:])
		if r == utf8.RuneError && size == 1 {
			break
		}
		off += size
	}
	return fmt.Errorf("content is not valid UTF-8 (byte %d is 0x%02x): a message emitted with pg_logical_emit_message's text variant in a database whose encoding is not UTF8 carries that encoding's bytes; emit UTF-8 bytes instead, pg_logical_emit_message(true, prefix, convert_to(content, 'UTF8')), as pkg/outbox does", off, content[off])
}

// rowJSON renders a row as a JSON object of its columns' text (null for
// NULL), the dead-letter value of a row the router could not map.
func rowJSON(row *router.Row) []byte {
	m := make(map[string]any, len(row.Names))
	for i, n := range row.Names {
		if i < len(row.Values) && row.Values[i] != nil {
			m[n] = string(row.Values[i])
		} else {
			m[n] = nil
		}
	}
	b, _ := json.Marshal(m)
	return b
}
