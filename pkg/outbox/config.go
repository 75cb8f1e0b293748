package outbox

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// Defaults of Config and DedupConfig.
const (
	DefaultTable         = "public.outbox"
	DefaultMessagePrefix = "outbox"
	DefaultDedupTable    = "public.processed_events"
)

// Mode says how a Writer records events.
type Mode int

const (
	// ModeTable inserts one row per event into the outbox table. The rows
	// stay; delete them later (the relay ignores DELETEs).
	ModeTable Mode = iota
	// ModeTableDeleteAfterInsert inserts the rows and deletes them again in
	// the same transaction, so the table stays empty and needs no cleanup:
	// the WAL still carries the INSERTs, and logical decoding delivers them.
	ModeTableDeleteAfterInsert
	// ModeMessage writes no row: each event is a transactional logical
	// decoding message, pg_logical_emit_message(true, prefix, json), whose
	// content is a JSON object with the fields of a row. It needs no table
	// and no publication entry, and vanishes with a rollback like a row.
	ModeMessage
)

var modeNames = [...]string{
	ModeTable:                  "table",
	ModeTableDeleteAfterInsert: "table-delete-after-insert",
	ModeMessage:                "message",
}

// String returns the mode's name as used in configuration files: "table",
// "table-delete-after-insert" or "message".
func (m Mode) String() string {
	if m >= 0 && int(m) < len(modeNames) {
		return modeNames[m]
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// MarshalText returns the mode's name.
func (m Mode) MarshalText() ([]byte, error) {
	if m < 0 || int(m) >= len(modeNames) {
		return nil, fmt.Errorf("outbox: unknown mode %d", int(m))
	}
	return []byte(modeNames[m]), nil
}

// UnmarshalText parses a mode's name.
func (m *Mode) UnmarshalText(b []byte) error {
	for i, n := range modeNames {
		if string(b) == n {
			*m = Mode(i)
			return nil
		}
	}
	return fmt.Errorf("outbox: unknown mode %q (want %s)", b, strings.Join(modeNames[:], ", "))
}

// Columns names the outbox table's columns. Empty fields take Debezium's
// default names.
type Columns struct {
	ID            string `yaml:"id"`            // default "id"
	AggregateType string `yaml:"aggregatetype"` // default "aggregatetype"
	AggregateID   string `yaml:"aggregateid"`   // default "aggregateid"
	Type          string `yaml:"type"`          // default "type"
	Payload       string `yaml:"payload"`       // default "payload"
}

// DefaultColumns returns Debezium's column names.
func DefaultColumns() Columns {
	return Columns{ID: "id", AggregateType: "aggregatetype", AggregateID: "aggregateid", Type: "type", Payload: "payload"}
}

func (c Columns) withDefaults() Columns {
	d := DefaultColumns()
	for _, f := range [...]struct{ v, def *string }{
		{&c.ID, &d.ID}, {&c.AggregateType, &d.AggregateType}, {&c.AggregateID, &d.AggregateID},
		{&c.Type, &d.Type}, {&c.Payload, &d.Payload},
	} {
		if *f.v == "" {
			*f.v = *f.def
		}
	}
	return c
}

// names returns the column names in the order of a row and of the JSON
// object of ModeMessage.
func (c Columns) names() [5]string {
	return [5]string{c.ID, c.AggregateType, c.AggregateID, c.Type, c.Payload}
}

// Config configures a Writer. The zero value writes rows into public.outbox
// with Debezium's column names.
type Config struct {
	// Table is the outbox table, "schema.table" or "table" (schema public),
	// with plain identifiers ([A-Za-z_][A-Za-z0-9_$]*). Names are quoted, so
	// they are case-sensitive, as in pgoutbox's migrations. Default
	// "public.outbox". Unused in ModeMessage.
	Table string `yaml:"table"`
	// Columns names the table's columns. In ModeMessage they are the keys of
	// the JSON object, so that the relay maps a message exactly as a row.
	Columns Columns `yaml:"columns"`
	// Mode says how events are recorded. Default ModeTable.
	Mode Mode `yaml:"mode"`
	// MessagePrefix is the logical decoding message prefix in ModeMessage;
	// the relay picks messages by it. Default "outbox".
	MessagePrefix string `yaml:"message_prefix"`
	// AssumeSlot leaves out the check that ModeMessage and
	// ModeTableDeleteAfterInsert make in the statement they send, that the
	// database has a logical replication slot to decode the event (see
	// NoSlotError), and in ModeTableDeleteAfterInsert that a publication
	// carries the table's inserts (see NotPublishedError). It saves the
	// server 10 to 40 us of CPU per write, some 20 us more in
	// ModeTableDeleteAfterInsert (more for a driver that plans every
	// statement). Set it only where the deployment makes the relay's slot
	// and publication before any writer runs and nothing drops them:
	// without them such writes commit events nothing reads.
	AssumeSlot bool `yaml:"assume_slot"`
}

// WithDefaults returns c with every empty field set to its default.
func (c Config) WithDefaults() Config {
	if c.Table == "" {
		c.Table = DefaultTable
	}
	if c.MessagePrefix == "" {
		c.MessagePrefix = DefaultMessagePrefix
	}
	c.Columns = c.Columns.withDefaults()
	return c
}

// Validate reports the first problem of c after defaults.
func (c Config) Validate() error {
	c = c.WithDefaults()
	if _, err := quoteTable(c.Table); err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, n := range c.Columns.names() {
		if !identRE.MatchString(n) {
			return fmt.Errorf("outbox: invalid column name %q: want a plain identifier", n)
		}
		if seen[n] {
			return fmt.Errorf("outbox: column %q is named twice", n)
		}
		seen[n] = true
	}
	if c.Mode < 0 || int(c.Mode) >= len(modeNames) {
		return fmt.Errorf("outbox: unknown mode %d", int(c.Mode))
	}
	if strings.IndexByte(c.MessagePrefix, 0) >= 0 {
		return errors.New("outbox: message prefix contains a NUL byte")
	}
	return nil
}

// identRE matches the identifiers pgoutbox accepts, as its migrations do:
// plain, at most 63 bytes (PostgreSQL's limit).
var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_$]{0,62}$`)

func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// quoteTable validates "schema.table" or "table" and returns it quoted,
// with schema public when none is given.
func quoteTable(name string) (string, error) {
	schema, table := "public", name
	if i := strings.IndexByte(name, '.'); i >= 0 {
		schema, table = name[:i], name[i+1:]
	}
	if !identRE.MatchString(schema) || !identRE.MatchString(table) {
		return "", fmt.Errorf("outbox: invalid table %q: want schema.table with plain identifiers", name)
	}
	return quoteIdent(schema) + "." + quoteIdent(table), nil
}
