package outbox

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// maxEventsPerStatement bounds one statement's events, which keeps its
// parameters (5 per event in the table modes) far below PostgreSQL's limit
// of 65535. Larger writes take several statements in the same transaction.
const maxEventsPerStatement = 1000

// ErrNoTx is returned by Write and WriteSQL when given a nil transaction.
var ErrNoTx = errors.New("outbox: no transaction")

// ErrNoSlot is wrapped by every *NoSlotError, for errors.Is.
var ErrNoSlot = errors.New("outbox: no logical replication slot in the database")

// NoSlotError is the error of a Write or WriteSQL refused because only the
// WAL would hold its events and nothing decodes this database's WAL: the
// database has no logical replication slot (the relay's not made yet, or
// dropped; or wal_level is not logical, which allows none), or only one
// still being made, which decodes no transaction that commits meanwhile. Such events
// would be lost without a word: a slot made later starts after them, and
// the poll source reads neither messages nor deleted rows. It is the error
// of ModeMessage, and of ModeTableDeleteAfterInsert when it really deleted
// rows (a row kept by the poll source's keep trigger stays in the table and
// is read from there, so that write succeeds). As with every failed Write,
// the transaction fails: roll it back.
//
// Any logical slot of the database lets the write through, the relay's or
// another consumer's (Debezium's during a migration): the writer cannot
// tell which slot is the relay's, so this is a minimum, not a proof that
// the relay will read the event.
type NoSlotError struct {
	Mode Mode
	// Database is the database's name and WALLevel the server's wal_level,
	// read after the refusal; empty when they could not be read.
	Database string
	WALLevel string
}

// Error says what was refused, why, and what to do.
func (e *NoSlotError) Error() string {
	db := databasePhrase(e.Database)
	var b strings.Builder
	fmt.Fprintf(&b, "outbox: write refused in mode %s: %s has no logical replication slot (or only one still being made, which decodes no transaction that commits before it is), so nothing would ever decode ", e.Mode, db)
	if e.Mode == ModeTableDeleteAfterInsert {
		b.WriteString("the inserts of the rows just deleted")
	} else {
		b.WriteString("the messages")
	}
	b.WriteString(" from the WAL (a slot made later starts after them) and the events would be lost")
	if e.WALLevel != "" && e.WALLevel != "logical" {
		fmt.Fprintf(&b, "; wal_level is %s: set it to logical and restart PostgreSQL", e.WALLevel)
	}
	b.WriteString("; make the relay's slot first (pgoutbox migrate, or the relay's first start), or, with the poll source (relay.source=poll), write with ModeTable")
	if e.Mode == ModeTableDeleteAfterInsert {
		b.WriteString(" (or to the table pgoutbox migrate makes for it, whose trigger keeps the rows)")
	}
	return b.String()
}

// databasePhrase names a database in an error: by its name, read after
// the refusal, or "this database" when it could not be read.
func databasePhrase(name string) string {
	if name == "" {
		return "this database"
	}
	return fmt.Sprintf("database %q", name)
}

// Unwrap returns ErrNoSlot.
func (e *NoSlotError) Unwrap() error { return ErrNoSlot }

// ErrNotPublished is wrapped by every *NotPublishedError, for errors.Is.
var ErrNotPublished = errors.New("outbox: no publication carries the outbox table's inserts")

// NotPublishedError is the error of a ModeTableDeleteAfterInsert write
// refused because the database has a logical slot but no slot could decode
// the inserts of the table written to: the table is unlogged (or
// temporary), whose rows never reach the WAL, or no publication publishes
// its inserts (a second outbox table not yet added to the relay, another
// schema's table of that name found first on the search_path, a
// publication with publish = 'update, delete'). The rows were deleted and
// the events would be lost without a word. As with every failed Write, the
// transaction fails: roll it back.
//
// Any publication lets the write through (see NoSlotError): a minimum,
// not a proof that the relay's slot reads the event.
type NotPublishedError struct {
	// Table is Config.Table; Database the database's name.
	Table    string
	Database string
	// Unlogged is true when the table is not permanent; Kind is its
	// pg_class.relkind ("v" a view, "p" partitioned, ...).
	Unlogged bool
	Kind     string
}

// Error says what was refused, why, and what to do.
func (e *NotPublishedError) Error() string {
	db := databasePhrase(e.Database)
	switch e.Kind {
	case "r", "p", "":
	case "v":
		return fmt.Sprintf("outbox: refused a mode %s write: %s in %s is a view; the writer does not judge which table's inserts a view makes, nor whether a slot decodes them, and the events would be lost if none did: write to the table itself, or write with ModeTable",
			ModeTableDeleteAfterInsert, e.Table, db)
	default:
		return fmt.Sprintf("outbox: refused a mode %s write: %s in %s is no table (relkind %s), whose inserts no slot of this database decodes: the events would be lost; write to the outbox table, or write with ModeTable",
			ModeTableDeleteAfterInsert, e.Table, db, e.Kind)
	}
	if e.Kind == "p" {
		return fmt.Sprintf("outbox: refused a mode %s write: partitioned table %s in %s has a partition that is unlogged or that no publication publishes the inserts of (by name, by schema or FOR ALL TABLES, or through the table itself), so the event of a row landing there would be lost, decoded by no slot; publish the table itself, or every partition, or write with ModeTable",
			ModeTableDeleteAfterInsert, e.Table, db)
	}
	if e.Unlogged {
		return fmt.Sprintf("outbox: refused a mode %s write: table %s in %s is unlogged (or temporary), so its rows never reach the WAL and no slot would ever decode the inserts of the rows just deleted: the events would be lost; make the table permanent (ALTER TABLE ... SET LOGGED) or write with ModeTable",
			ModeTableDeleteAfterInsert, e.Table, db)
	}
	return fmt.Sprintf("outbox: refused a mode %s write: no publication in %s publishes the inserts of table %s (by name, by schema or FOR ALL TABLES), so no slot would decode the inserts of the rows just deleted and the events would be lost; write to the table the relay streams (its table.include.list), add this one to the relay's publication (pgoutbox migrate with the table in table.include.list), or write with ModeTable",
		ModeTableDeleteAfterInsert, db, e.Table)
}

// Unwrap returns ErrNotPublished.
func (e *NotPublishedError) Unwrap() error { return ErrNotPublished }

// logicalSlotExists is true when the database has a logical replication
// slot that can still decode its WAL: not temporary (gone with its
// session), not invalidated (wal_status 'lost') and made (a slot still
// being made, its confirmed_flush_lsn NULL, waits for the transactions
// running at its start and decodes none of them: a write it let through
// meanwhile was lost; found by a review). Any such slot will do
// (see NoSlotError). pg_replication_slots is readable by every role, and
// reads the slots' shared state, not a snapshot: a slot made or dropped by
// another session counts at once, at every isolation level. The condition
// does not depend on the statement's parameters: PostgreSQL evaluates it
// once per statement (a one-time filter), before the VALUES list or the
// rows are read.
const logicalSlotExists = `EXISTS (` + madeLogicalSlots + `)`

// madeLogicalSlots selects the logical slots of the database that can
// decode its WAL (see logicalSlotExists).
const madeLogicalSlots = `SELECT FROM pg_catalog.pg_replication_slots ` +
	`WHERE database = pg_catalog.current_database() AND slot_type = 'logical' ` +
	`AND NOT temporary AND wal_status IS DISTINCT FROM 'lost' AND confirmed_flush_lsn IS NOT NULL`

// Writer records outbox events inside the caller's transaction, so that an
// event exists if and only if the business change it describes commits.
//
// A Writer holds no connection and no state beyond its configuration: it is
// safe for concurrent use, and one Writer serves every transaction.
type Writer struct {
	cfg        Config
	table      string    // quoted table name
	insertHead string    // INSERT INTO t (cols) VALUES
	deleteHead string    // WITH deleted AS (DELETE FROM t WHERE id IN (
	jsonKeys   [5]string // the JSON object's keys, quoted, with their colon
}

// NewWriter returns a Writer for cfg after defaults (see Config).
func NewWriter(cfg Config) (*Writer, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	table, _ := quoteTable(cfg.Table) // validated
	w := &Writer{cfg: cfg, table: table}
	names := cfg.Columns.names()
	quoted := make([]string, len(names))
	for i, n := range names {
		quoted[i] = quoteIdent(n)
		w.jsonKeys[i] = string(appendJSONString(nil, n)) + ":"
	}
	w.insertHead = "INSERT INTO " + table + " (" + strings.Join(quoted, ", ") + ") VALUES "
	w.deleteHead = "WITH deleted AS (DELETE FROM " + table + " WHERE " + quoted[0] + " IN ("
	return w, nil
}

// Config returns the Writer's configuration, defaults filled in.
func (w *Writer) Config() Config { return w.cfg }

// Write records events in tx, a pgx transaction, and returns their ids in
// the order of events (generated where Event.ID is empty). The events are
// sent in one statement (two in ModeTableDeleteAfterInsert); they become
// visible to the relay when tx commits, and vanish if it rolls back.
//
// In ModeMessage and ModeTableDeleteAfterInsert, whose events only the WAL
// holds, the same statement checks that the database has a logical
// replication slot, and the write fails with a *NoSlotError if it has none
// (see there): no extra round trip.
//
// Any error aborts the transaction: roll it back. An invalid event (see
// EventError) fails the whole call before any event is sent, and then Write
// itself makes the transaction fail on the server (see SQLStateWriteFailed),
// as a database error does, so that a Commit that follows returns an error
// (pgx.ErrTxCommitRollback with pgx and its stdlib driver) instead of
// keeping the business change without its event.
func (w *Writer) Write(ctx context.Context, tx pgx.Tx, events ...Event) ([]string, error) {
	if tx == nil {
		return nil, ErrNoTx
	}
	if c := tx.Conn(); c != nil && w.cfg.Mode != ModeMessage && len(events) > 0 {
		if err := textEncoding(c.PgConn()); err != nil {
			return nil, failTx(ctx, pgxExec{tx}, err)
		}
	}
	return w.writeInTx(ctx, pgxExec{tx}, events)
}

// textEncoding refuses a connection that would have the server read the
// UTF-8 text of events in another encoding: pgx sends strings as they are
// and sets no client_encoding, so a session in a LATIN1 database takes the
// database's, and Müller would be stored as MÃ¼ller (and relayed so, its
// key on another partition). The session's settings come with the
// connection (ParameterStatus): no round trip. A SQL_ASCII database
// converts nothing and keeps the bytes. (Messages are sent as bytea, which
// no encoding touches.)
func textEncoding(pc *pgconn.PgConn) error {
	enc := pc.ParameterStatus("client_encoding")
	if enc == "" || enc == "UTF8" || enc == "SQL_ASCII" && pc.ParameterStatus("server_encoding") == "SQL_ASCII" {
		return nil
	}
	return encodingError(enc)
}

func encodingError(enc string) error {
	return fmt.Errorf("outbox: the connection's client_encoding is %s, not UTF8: PostgreSQL would read the events' UTF-8 text as %s, and store (and pgoutbox relay) other characters than written; connect with client_encoding=UTF8 (in the DSN: client_encoding=UTF8, or pgx.ConnConfig's RuntimeParams)", enc, enc)
}

// textEncodingOK is textEncoding's rule in SQL, for database/sql, whose
// transactions do not show their connection's settings: the table modes'
// INSERT through WriteSQL returns its rows only where it holds, so that a
// session that would misread the text writes nothing that commits (see
// checkedInsert).
const textEncodingOK = `(pg_catalog.current_setting('client_encoding') = 'UTF8' OR ` +
	`pg_catalog.current_setting('client_encoding') = 'SQL_ASCII' AND pg_catalog.current_setting('server_encoding') = 'SQL_ASCII')`

// WriteSQL is Write for a database/sql transaction (any PostgreSQL driver
// that accepts $n placeholders, such as github.com/jackc/pgx/v5/stdlib).
// As with Write, any error aborts the transaction: roll it back. A
// database/sql transaction does not show its connection's settings, so in
// the table modes the INSERT itself checks the session's client_encoding
// (see Write), in the same statement.
func (w *Writer) WriteSQL(ctx context.Context, tx *sql.Tx, events ...Event) ([]string, error) {
	if tx == nil {
		return nil, ErrNoTx
	}
	return w.writeInTx(ctx, sqlExec{tx}, events)
}

// writeInTx writes events in the transaction db and makes the transaction
// fail when that fails (see failTx).
func (w *Writer) writeInTx(ctx context.Context, db execer, events []Event) ([]string, error) {
	ids, err := w.write(ctx, db, events)
	if err != nil {
		return nil, failTx(ctx, db, err)
	}
	return ids, nil
}

func (w *Writer) write(ctx context.Context, db execer, events []Event) ([]string, error) {
	if len(events) == 0 {
		return nil, nil
	}
	ids, err := prepare(events)
	if err != nil {
		return nil, err
	}
	for lo := 0; lo < len(events); lo += maxEventsPerStatement {
		hi := min(lo+maxEventsPerStatement, len(events))
		if err := w.writeBatch(ctx, db, events[lo:hi], ids[lo:hi]); err != nil {
			return nil, err
		}
	}
	return ids, nil
}

func (w *Writer) writeBatch(ctx context.Context, db execer, events []Event, ids []string) error {
	if w.cfg.Mode == ModeMessage {
		query, args := w.messageStatement(events, ids)
		n, err := db.exec(ctx, query, args)
		if err != nil {
			return fmt.Errorf("outbox: emit %d messages with prefix %q: %w", len(events), w.cfg.MessagePrefix, err)
		}
		if n != int64(len(events)) {
			// No row: no logical slot, and no message emitted.
			return w.noSlot(ctx, db)
		}
		return nil
	}
	query, args := w.insertStatement(events, ids)
	_, checked := db.(sqlExec)
	if checked {
		query = checkedInsert(query)
	}
	n, err := db.exec(ctx, query, args)
	if err != nil {
		return fmt.Errorf("outbox: insert %d events into %s: %w", len(events), w.cfg.Table, err)
	}
	if n != int64(len(events)) {
		if checked {
			var enc string
			if db.queryRow(ctx, `SELECT pg_catalog.current_setting('client_encoding') WHERE NOT `+textEncodingOK, &enc) == nil {
				return encodingError(enc)
			}
		}
		// A BEFORE INSERT trigger that returned NULL, or a rule DO INSTEAD
		// NOTHING: the rows not inserted never reach the WAL, so no relay
		// sees them. (A rule that inserts elsewhere instead reports its
		// own count: pgoutbox run refuses an outbox table with one.)
		return fmt.Errorf("outbox: inserted %d of %d events into %s: a BEFORE INSERT trigger (returning NULL) or a rule (DO INSTEAD NOTHING) kept the others out, and their events would never be relayed", n, len(events), w.cfg.Table)
	}
	if w.cfg.Mode == ModeTableDeleteAfterInsert {
		query, args := w.deleteStatement(ids)
		n, err := db.exec(ctx, query, args)
		if err != nil {
			return fmt.Errorf("outbox: delete %d events from %s: %w", len(ids), w.cfg.Table, err)
		}
		if n != 1 {
			// No row: rows were deleted and no logical slot exists, or
			// nothing publishes the table's inserts. (Rows not deleted,
			// such as those the poll source's keep trigger keeps, stay in
			// the table with their events: as in ModeTable, they are not
			// lost.)
			return w.notDecoded(ctx, db, len(ids))
		}
	}
	return nil
}

// noSlot returns the *NoSlotError of a write refused in db, with the
// database's name and wal_level if they can be read (a query on the
// failure path only; failTx makes the transaction fail afterwards).
func (w *Writer) noSlot(ctx context.Context, db execer) error {
	e := &NoSlotError{Mode: w.cfg.Mode}
	var name, level string
	if db.queryRow(ctx, `SELECT pg_catalog.current_database()::text, pg_catalog.current_setting('wal_level')`, &name, &level) == nil {
		e.Database, e.WALLevel = name, level
	}
	return e
}

// notDecoded returns the error of a delete-after-insert write refused in
// db: a *NoSlotError without a logical slot, a *NotPublishedError when the
// table's inserts reach no publication. A query on the failure path only
// (failTx makes the transaction fail afterwards).
func (w *Writer) notDecoded(ctx context.Context, db execer, n int) error {
	var name, level, persistence, kind string
	var slot bool
	err := db.queryRow(ctx, `SELECT pg_catalog.current_database()::text, pg_catalog.current_setting('wal_level'), `+
		logicalSlotExists+`, c.relpersistence::text, c.relkind::text FROM pg_catalog.pg_class c WHERE c.oid = `+
		escapedLiteral(w.table)+`::pg_catalog.regclass`, &name, &level, &slot, &persistence, &kind)
	switch {
	case err != nil:
		return fmt.Errorf("outbox: refused to delete %d events from %s: the database has no logical replication slot, or no publication publishes the table's inserts, and their events would be lost (reading which failed: %w)", n, w.cfg.Table, err)
	case !slot:
		return &NoSlotError{Mode: w.cfg.Mode, Database: name, WALLevel: level}
	}
	return &NotPublishedError{Table: w.cfg.Table, Database: name, Kind: kind, Unlogged: kind == "r" && persistence != "p"}
}

// insertStatement returns one multi-row INSERT for events.
func (w *Writer) insertStatement(events []Event, ids []string) (string, []any) {
	var b strings.Builder
	b.Grow(len(w.insertHead) + len(events)*32)
	b.WriteString(w.insertHead)
	args := make([]any, 0, 5*len(events))
	for i := range events {
		e := &events[i]
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteByte('(')
		for c := range 5 {
			if c > 0 {
				b.WriteString(", ")
			}
			writeParam(&b, len(args)+c+1)
		}
		b.WriteByte(')')
		// The payload goes as text: the server parses it into the column's
		// type (jsonb, json or text), and pgx sends a string for a json
		// type as it is.
		var payload any
		if len(e.Payload) > 0 {
			payload = string(e.Payload)
		}
		args = append(args, ids[i], e.AggregateType, e.AggregateID, e.Type, payload)
	}
	return b.String(), args
}

// checkedInsert wraps insert (an INSERT without RETURNING) so that it
// returns a row per row inserted where the session reads text as UTF-8
// (textEncodingOK), and none elsewhere: still one statement and one round
// trip, whose count the caller compares with the events. The INSERT runs
// either way; the caller then fails the transaction.
func checkedInsert(insert string) string {
	return "WITH inserted AS (" + insert + " RETURNING 1) SELECT FROM inserted WHERE " + textEncodingOK
}

// deleteStatement returns the DELETE of the rows with ids, in a statement
// that returns one row unless it deleted rows in a database without a
// logical replication slot (whose inserts nothing would decode). It is
// one statement, and so one round trip, as the DELETE alone was; the
// DELETE in its WITH runs to completion whatever the rest reads of it.
func (w *Writer) deleteStatement(ids []string) (string, []any) {
	var b strings.Builder
	b.WriteString(w.deleteHead)
	args := make([]any, len(ids))
	for i, id := range ids {
		if i > 0 {
			b.WriteString(", ")
		}
		writeParam(&b, i+1)
		args[i] = id
	}
	b.WriteString(") RETURNING 1) SELECT WHERE NOT EXISTS (SELECT FROM deleted)")
	if !w.cfg.AssumeSlot {
		args = append(args, w.table)
		b.WriteString(" OR " + logicalSlotExists + " AND " + tableRelayable(len(args)))
	} else {
		b.WriteString(" OR true")
	}
	return b.String(), args
}

// escapedLiteral returns s as an escape string constant (E'...'), which
// reads the same whatever standard_conforming_strings is.
func escapedLiteral(s string) string {
	return "E'" + strings.NewReplacer(`\`, `\\`, `'`, `''`).Replace(s) + "'"
}

// tableRelayable is true when a slot could decode the inserts of the
// table named (quoted) by text parameter $param: it is a table (a view,
// a foreign table and the like are refused: their rows are another
// table's, or no table's of this WAL), it is permanent, and so is every
// partition of it (an unlogged or temporary table's rows never reach the
// WAL), and a slot of another plugin than pgoutput exists (wal2json,
// decoderbufs and the like decode every table) or a publication
// publishes its inserts (tablePublished). Like logicalSlotExists it is a
// minimum, not a proof that the relay's slot reads the event: the writer
// cannot tell which slot or publication is the relay's, nor judge a row
// filter. It depends on no row of the statement, so PostgreSQL evaluates
// it once; the catalogs it reads are readable by every role.
func tableRelayable(param int) string {
	return `EXISTS (SELECT FROM pg_catalog.pg_class c WHERE c.oid = $` + strconv.Itoa(param) +
		`::text::pg_catalog.regclass AND c.relkind IN ('r', 'p') AND (c.relkind = 'p' OR c.relpersistence = 'p') ` +
		`AND NOT EXISTS (SELECT FROM pg_catalog.pg_partition_tree(c.oid) l JOIN pg_catalog.pg_class lc ON lc.oid = l.relid ` +
		`WHERE l.isleaf AND lc.relpersistence <> 'p') AND (` + otherPluginSlot + ` OR ` + tablePublished + `))`
}

// otherPluginSlot is true when the database has a made logical slot (as
// logicalSlotExists) of another output plugin than pgoutput, which takes
// no publication and decodes every table.
const otherPluginSlot = `EXISTS (` + madeLogicalSlots + ` AND plugin <> 'pgoutput')`

// tablePublished is true when a publication publishes the inserts of
// table c (c.oid): the table itself or a partitioned ancestor of it, by
// name, by schema (FOR TABLES IN SCHEMA) or FOR ALL TABLES; or, for a
// partitioned table, every one of its partitions so (a row lands in one,
// and one left out would lose it).
var tablePublished = `(` + relPublished("c.oid") + ` OR c.relkind = 'p' AND NOT EXISTS (SELECT FROM pg_catalog.pg_partition_tree(c.oid) l ` +
	`WHERE l.isleaf AND NOT ` + relPublished("l.relid") + `))`

// relPublished is true when a publication publishes the inserts of the
// relation of OID rel or of a partitioned ancestor of it.
func relPublished(rel string) string {
	return `EXISTS (SELECT FROM pg_catalog.pg_publication p WHERE p.pubinsert AND (p.puballtables ` +
		`OR EXISTS (SELECT FROM pg_catalog.pg_class ac WHERE ac.oid IN (SELECT ` + rel + ` UNION SELECT relid FROM pg_catalog.pg_partition_ancestors(` + rel + `)) ` +
		`AND (EXISTS (SELECT FROM pg_catalog.pg_publication_rel r WHERE r.prpubid = p.oid AND r.prrelid = ac.oid) ` +
		`OR EXISTS (SELECT FROM pg_catalog.pg_publication_namespace n WHERE n.pnpubid = p.oid AND n.pnnspid = ac.relnamespace)))))`
}

// messageStatement returns one SELECT that emits a transactional message
// per event, in the order of events (a VALUES list is scanned in order),
// and returns a row per message; none, and emits none, in a database
// without a logical replication slot (see logicalSlotExists).
// The casts pick pg_logical_emit_message's bytea variant, whose content
// reaches the WAL as the UTF-8 bytes sent: the text variant converts its
// content to the database's encoding first, and pgoutput sends a message's
// bytes as they are, so in a LATIN1 database the relay read LATIN1 bytes
// where the content promises UTF-8 JSON.
func (w *Writer) messageStatement(events []Event, ids []string) (string, []any) {
	var b strings.Builder
	b.WriteString("SELECT pg_catalog.pg_logical_emit_message(true, $1::text, m.content) FROM (VALUES ")
	args := make([]any, 1, 1+len(events))
	args[0] = w.cfg.MessagePrefix
	for i := range events {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteByte('(')
		writeParam(&b, i+2)
		b.WriteString("::bytea)")
		args = append(args, w.messageJSON(&events[i], ids[i]))
	}
	b.WriteString(") AS m(content) WHERE ")
	b.WriteString(w.slotCheck())
	return b.String(), args
}

// slotCheck is the condition of the WAL-only modes' statements:
// logicalSlotExists, or true under Config.AssumeSlot.
func (w *Writer) slotCheck() string {
	if w.cfg.AssumeSlot {
		return "true"
	}
	return logicalSlotExists
}

func writeParam(b *strings.Builder, n int) {
	var buf [12]byte
	b.WriteByte('$')
	b.Write(strconv.AppendInt(buf[:0], int64(n), 10))
}

// messageJSON returns the content of e's message: a JSON object with the
// row's columns as keys, in the order id, aggregate type, aggregate id,
// type, payload; the payload embedded as JSON (compacted), or null.
func (w *Writer) messageJSON(e *Event, id string) []byte {
	b := make([]byte, 0, 96+len(id)+len(e.AggregateType)+len(e.AggregateID)+len(e.Type)+len(e.Payload))
	b = append(b, '{')
	for i, v := range [...]string{id, e.AggregateType, e.AggregateID, e.Type} {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, w.jsonKeys[i]...)
		b = appendJSONString(b, v)
	}
	b = append(b, ',')
	b = append(b, w.jsonKeys[4]...)
	if len(e.Payload) == 0 {
		b = append(b, "null"...)
	} else {
		buf := bytes.NewBuffer(b)
		// The payload was validated, so Compact cannot fail.
		_ = json.Compact(buf, e.Payload)
		b = buf.Bytes()
	}
	return append(b, '}')
}

// appendJSONString appends s, which is valid UTF-8, as a JSON string. Unlike
// encoding/json it leaves <, > and & alone: the content is for machines.
func appendJSONString(b []byte, s string) []byte {
	const hexDigits = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c >= utf8.RuneSelf {
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && size == 1 {
				b = append(b, `\ufffd`...)
			} else {
				b = append(b, s[i:i+size]...)
			}
			i += size
			continue
		}
		switch {
		case c == '"', c == '\\':
			b = append(b, '\\', c)
		case c == '\n':
			b = append(b, '\\', 'n')
		case c == '\r':
			b = append(b, '\\', 'r')
		case c == '\t':
			b = append(b, '\\', 't')
		case c < 0x20:
			b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
		default:
			b = append(b, c)
		}
		i++
	}
	return append(b, '"')
}
