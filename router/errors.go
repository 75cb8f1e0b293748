package router

import (
	"errors"
	"strconv"
	"strings"
)

// Sentinel errors. A *RowError's Err is one of the row errors below, so a
// caller can test the class with errors.Is; Validate's *OptionError wraps
// ErrInvalidOption or ErrUnsupportedOption.
var (
	// ErrMissingColumn: a column the options name (event id, payload,
	// routing field, timestamp, or an additional field with
	// table.field.additional.missing=error) is not in the row.
	ErrMissingColumn = errors.New("router: column missing from row")
	// ErrNullEventID: the table.field.event.id column is NULL: consumers
	// could not de-duplicate the event. (Debezium delivers it with a null
	// id header.)
	ErrNullEventID = errors.New("router: event id is NULL")
	// ErrNotExpandable: with table.expand.json.payload and
	// value.converter=JsonConverter, a payload whose expansion Kafka
	// Connect's converter fails on in Debezium (a top-level array, an
	// integer beyond 64 bits, conflicting array elements).
	ErrNotExpandable = errors.New("router: payload cannot be expanded as Debezium converts it")
	// ErrNullRoutingValue: the route.by.field column is NULL.
	ErrNullRoutingValue = errors.New("router: routing value is NULL")
	// ErrInvalidTopic: the topic computed from the routing value is not a
	// legal Kafka topic name.
	ErrInvalidTopic = errors.New("router: invalid topic name")
	// ErrBadPartition: a column placed as partition is not an integer in
	// [0, 2147483647].
	ErrBadPartition = errors.New("router: bad partition value")
	// ErrBadTimestamp: the table.field.event.timestamp column is neither an
	// ISO timestamp nor an integer count of epoch milliseconds.
	ErrBadTimestamp = errors.New("router: bad timestamp value")
	// ErrBadValue: a column value is malformed for its type (e.g. bad bytea
	// hex text).
	ErrBadValue = errors.New("router: bad column value")
	// ErrInvalidOperation: an UPDATE on the outbox table with
	// table.op.invalid.behavior=fatal.
	ErrInvalidOperation = errors.New("router: UPDATE on an outbox table (table.op.invalid.behavior=fatal)")
	// ErrUnknownOp: the row's Op is not OpInsert, OpUpdate or OpDelete.
	ErrUnknownOp = errors.New("router: unknown row operation")
	// ErrMalformedRow: Names and Values have different lengths.
	ErrMalformedRow = errors.New("router: malformed row")

	// ErrInvalidOption: an option has a value outside its domain.
	ErrInvalidOption = errors.New("router: invalid option")
	// ErrUnsupportedOption: a Debezium or Kafka Connect option (or value)
	// that pgoutbox recognises but does not implement, or an unknown option
	// name given to Options.Set.
	ErrUnsupportedOption = errors.New("router: unsupported option")
)

// RowError reports a row that cannot be mapped to a record. Every such error
// means the event cannot be relayed as configured; a relay should stop
// rather than skip it (skipping would let a later position be confirmed and
// the event be lost), as a Kafka Connect task fails on the same rows.
type RowError struct {
	Table   string // Row.Table
	Column  string // the column concerned, or "" when no single column is
	EventID string // the event id column's text, or "" when unknown or NULL
	Reason  string // detail, e.g. the offending value; may be ""
	Err     error  // the error class: one of the Err* row sentinels
}

// Error describes the failure with the table, event id and column.
func (e *RowError) Error() string {
	var b strings.Builder
	b.WriteString("route ")
	if e.Table != "" {
		b.WriteString(e.Table)
		b.WriteByte(' ')
	}
	b.WriteString("row")
	if e.EventID != "" {
		b.WriteString(" id ")
		b.WriteString(e.EventID)
	}
	if e.Column != "" {
		b.WriteString(" column ")
		b.WriteString(strconv.Quote(e.Column))
	}
	b.WriteString(": ")
	if e.Err != nil {
		b.WriteString(e.Err.Error())
	} else {
		b.WriteString("router: row error")
	}
	if e.Reason != "" {
		b.WriteString(": ")
		b.WriteString(e.Reason)
	}
	return b.String()
}

// Unwrap returns the error class, for errors.Is.
func (e *RowError) Unwrap() error { return e.Err }

// OptionError reports an option value that Validate, New, NewSet or
// Options.Set rejects. Option is the option's name (Debezium's, or
// pgoutbox's own).
type OptionError struct {
	// Table is the table whose per-table options (NewSet) hold the value,
	// or "" for a Router's or a Set's default options.
	Table  string
	Option string // e.g. "route.topic.regex"; "" for a bad table name given to NewSet
	Value  string // the rejected value
	Reason string // why, in words
	Err    error  // ErrInvalidOption or ErrUnsupportedOption
}

// Error names the table (if any), the option, the value and the reason.
func (e *OptionError) Error() string {
	var b strings.Builder
	b.WriteString("router: ")
	if e.Table != "" || e.Option == "" {
		b.WriteString("table ")
		b.WriteString(strconv.Quote(e.Table))
		b.WriteString(": ")
	}
	if e.Option != "" {
		b.WriteString("option ")
		b.WriteString(e.Option)
		b.WriteByte('=')
		b.WriteString(strconv.Quote(e.Value))
		b.WriteString(": ")
	}
	b.WriteString(e.Reason)
	return b.String()
}

// Unwrap returns ErrInvalidOption or ErrUnsupportedOption.
func (e *OptionError) Unwrap() error { return e.Err }
