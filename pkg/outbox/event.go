package outbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Event is one outbox event: a row of the outbox table, or one logical
// decoding message in ModeMessage.
//
// With the relay's default routing (Debezium's Outbox Event Router), an event
// becomes a Kafka record on topic "outbox.event.<AggregateType>" with key
// AggregateID, value Payload and header "id" = ID.
type Event struct {
	// ID identifies the event; consumers de-duplicate on it. Leave it empty
	// to have Write generate a UUIDv7 (see NewID). A UUID given in the
	// canonical 8-4-4-4-12 form is written in lower case, as PostgreSQL
	// prints a uuid column.
	ID string
	// AggregateType names the kind of aggregate the event belongs to
	// ("Order"); it selects the topic. Required.
	AggregateType string
	// AggregateID identifies the aggregate ("42"); it is the record key, so
	// one aggregate's events stay on one partition, in order. Required.
	AggregateID string
	// Type is the event type ("OrderCreated"). Optional.
	Type string
	// Payload is the event's JSON document, the record value. Nil or empty
	// writes SQL NULL (in ModeMessage, JSON null), which the relay can turn
	// into a tombstone. NewEvent marshals any Go value into it.
	Payload json.RawMessage
}

// NewEvent returns an event whose Payload is payload marshalled with
// encoding/json (a json.RawMessage is used as it is, compacted). A nil
// payload gives a nil Payload, written as NULL. ID is left empty: Write
// generates one.
func NewEvent(aggregateType, aggregateID, eventType string, payload any) (Event, error) {
	e := Event{AggregateType: aggregateType, AggregateID: aggregateID, Type: eventType}
	if payload == nil {
		return e, nil
	}
	b, err := json.Marshal(payload)
	if err != nil {
		return Event{}, fmt.Errorf("outbox: marshal payload of %s %s: %w", aggregateType, aggregateID, err)
	}
	e.Payload = b
	return e, nil
}

// ErrInvalidEvent is matched (errors.Is) by every EventError.
var ErrInvalidEvent = errors.New("outbox: invalid event")

// EventError reports an event that Write refused before sending any
// event; Write made the transaction fail all the same (see Write): roll it
// back.
type EventError struct {
	Index int    // the event's position in the Write call
	ID    string // the event's ID, if it had one
	Err   error  // what is wrong
}

func (e *EventError) Error() string {
	if e.ID != "" {
		return fmt.Sprintf("outbox: event %d (id %s): %v", e.Index, e.ID, e.Err)
	}
	return fmt.Sprintf("outbox: event %d: %v", e.Index, e.Err)
}

func (e *EventError) Unwrap() error { return e.Err }

// Is reports ErrInvalidEvent as a match.
func (e *EventError) Is(target error) bool { return target == ErrInvalidEvent }

// validate checks what PostgreSQL would refuse (or accept and then route
// badly) before anything is sent.
func (e *Event) validate() error {
	if e.AggregateType == "" {
		return errors.New("aggregate type is empty")
	}
	if e.AggregateID == "" {
		return errors.New("aggregate id is empty")
	}
	for _, f := range [...]struct{ name, v string }{
		{"id", e.ID}, {"aggregate type", e.AggregateType}, {"aggregate id", e.AggregateID}, {"type", e.Type},
	} {
		if !utf8.ValidString(f.v) {
			return fmt.Errorf("%s is not valid UTF-8", f.name)
		}
		if strings.IndexByte(f.v, 0) >= 0 {
			return fmt.Errorf("%s contains a NUL byte", f.name)
		}
	}
	if len(e.Payload) > 0 && !json.Valid(e.Payload) {
		return errors.New("payload is not valid JSON")
	}
	// json.Valid takes bytes that are not UTF-8. The server refuses them
	// in a table's column, but ModeMessage sends them as bytes, and the
	// relay would find the committed event poison.
	if !utf8.Valid(e.Payload) {
		return errors.New("payload is not valid UTF-8")
	}
	return nil
}

// prepare validates events and returns their ids, generating the missing
// ones.
func prepare(events []Event) ([]string, error) {
	ids := make([]string, len(events))
	seen := make(map[string]int, len(events))
	for i := range events {
		e := &events[i]
		if err := e.validate(); err != nil {
			return nil, &EventError{Index: i, ID: e.ID, Err: err}
		}
		id := e.ID
		if id == "" {
			id = NewID()
		} else {
			id = canonicalID(id)
		}
		if j, dup := seen[id]; dup {
			return nil, &EventError{Index: i, ID: id, Err: fmt.Errorf("same id as event %d", j)}
		}
		seen[id] = i
		ids[i] = id
	}
	return ids, nil
}
