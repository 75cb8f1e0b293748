package poll

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/pgoutbox/migrations"
	"github.com/pgoutbox/pgoutbox/replication"
)

// The table Check looked at lives in the relay's memory, which ends with
// the process: after a stop on a *ReplacedError (a supervisor starts the
// relay again), or after a rename while the relay was stopped, a new
// process's Check would take the table the name then names, and the old
// table's unpublished rows would never be relayed, without a word. So the
// relay records the table it checked under each name, in the poll
// table's schema (migrations.PollState, made by pgoutbox migrate or by
// the relay's first start), and a new process starts by comparing with
// the record.

// ErrUnrecorded is wrapped by the error of a record table this role
// cannot make, read or write: the relay goes on without it (saying so),
// and then knows the table it checked only while it runs.
var ErrUnrecorded = errors.New("poll: the table the relay checked cannot be recorded")

// ErrChangedWhileChecked is wrapped by Record's error when the table's
// name named another table when Check looked than when Replaced did: the
// change is looked at again by the next session.
var ErrChangedWhileChecked = errors.New("poll: the table changed while it was checked")

// Recorded is the record of the table last checked under a name.
type Recorded struct {
	// Found: there is one; OID and RowType are the table's.
	Found        bool
	OID, RowType uint32
	CheckedAt    time.Time
	// Elsewhere: it was made in another cluster or database (a restored
	// copy, pg_upgrade, a database made from another as a template),
	// whose OIDs say nothing here: it is not used.
	Elsewhere bool
}

// recordTable returns the quoted record table of t and the statement
// that makes it.
func (t *Table) recordTable() (quoted, create string, err error) {
	quoted, create, err = migrations.PollState(t.Name)
	if err != nil {
		return "", "", fmt.Errorf("poll: the record of %s: %w", t.Name, err)
	}
	return quoted, create, nil
}

// unrecorded wraps an error of the record table; a missing table or
// privilege wraps ErrUnrecorded, with the fix.
func (t *Table) unrecorded(op, quoted string, err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && (pe.Code == "42501" || pe.Code == "42P01") { // insufficient_privilege, undefined_table
		return fmt.Errorf("%w: %s %s: %w; run pgoutbox migrate with the poll configuration (relay.source=poll) as the table's owner, which makes it, and GRANT SELECT, INSERT, UPDATE ON %s TO the relay's role",
			ErrUnrecorded, op, quoted, err, quoted)
	}
	return fmt.Errorf("poll: %s %s: %w", op, quoted, err)
}

// tableExists says whether the table quoted (quoted as needed) exists.
func tableExists(ctx context.Context, conn *pgx.Conn, quoted string) (bool, error) {
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", quoted).Scan(&exists); err != nil {
		return false, fmt.Errorf("poll: look up %s: %w", quoted, err)
	}
	return exists, nil
}

// EnsureRecordTable makes the record table of t unless it exists; an
// error that this role may not wraps ErrUnrecorded. Relays starting
// together may all call it: one whose creation loses to another's uses the
// table the other made.
func (t *Table) EnsureRecordTable(ctx context.Context, conn *pgx.Conn) error {
	quoted, create, err := t.recordTable()
	if err != nil {
		return err
	}
	if exists, err := tableExists(ctx, conn, quoted); err != nil || exists {
		return err
	}
	if _, err := conn.Exec(ctx, create, pgx.QueryExecModeSimpleProtocol); err != nil {
		if replication.CreatedConcurrently(err) {
			// Made by another relay starting at the same moment.
			if exists, xerr := tableExists(ctx, conn, quoted); xerr == nil && exists {
				return nil
			}
		}
		return t.unrecorded("make", quoted, err)
	}
	return nil
}

// ReadRecord reads the record of the table last checked under t's name;
// none if the record table does not exist. An error that this role may
// not read it wraps ErrUnrecorded.
func (t *Table) ReadRecord(ctx context.Context, conn *pgx.Conn) (Recorded, error) {
	var rec Recorded
	quoted, _, err := t.recordTable()
	if err != nil {
		return rec, err
	}
	if exists, err := tableExists(ctx, conn, quoted); err != nil || !exists {
		return rec, err
	}
	var here bool
	err = conn.QueryRow(ctx, `SELECT r.table_oid, r.row_type_oid, r.checked_at,
			r.system_identifier = s.system_identifier::text AND r.database_oid = (SELECT oid FROM pg_database WHERE datname = current_database())
		FROM `+quoted+` r, pg_control_system() s WHERE r.table_name = $1`, t.Name).Scan(&rec.OID, &rec.RowType, &rec.CheckedAt, &here)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return rec, nil
	case err != nil:
		return rec, t.unrecorded("read", quoted, err)
	}
	rec.Found, rec.Elsewhere = true, !here
	return rec, nil
}

// LoadRecord reads the record (ReadRecord) and, if it is of this cluster
// and database, takes its table as the one to compare with (Replaced):
// the table checked last, by this process or another instance.
func (t *Table) LoadRecord(ctx context.Context, conn *pgx.Conn) (Recorded, error) {
	rec, err := t.ReadRecord(ctx, conn)
	if err != nil {
		return rec, err
	}
	if rec.Found && !rec.Elsewhere {
		t.oid, t.rowType = rec.OID, rec.RowType
	}
	return rec, nil
}

// Record records the table Check looked at as the one last checked under
// t's name, if the name still names it. Call it after Replaced and Check:
// if the name named another table when Replaced looked (a rename in
// between), it records nothing and its error wraps
// ErrChangedWhileChecked, and the next session compares again. An error
// that this role may not write the record wraps ErrUnrecorded.
func (t *Table) Record(ctx context.Context, conn *pgx.Conn) error {
	if t.looked != 0 && t.looked != t.oid {
		return fmt.Errorf("%w: %s named table OID %d when the table checked before was compared, and table OID %d when it was checked; looking again",
			ErrChangedWhileChecked, t.Name, t.looked, t.oid)
	}
	quoted, _, err := t.recordTable()
	if err != nil {
		return err
	}
	// Committed without waiting for the WAL to be flushed: a record lost
	// with a crash is written again by the next start, and a flush here
	// (a disk sync at every session start) would also flush the WAL of
	// every commit made with synchronous_commit=off before it.
	var tag pgconn.CommandTag
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL synchronous_commit = off"); err != nil {
			return err
		}
		var err error
		tag, err = tx.Exec(ctx, `INSERT INTO `+quoted+` (table_name, table_oid, row_type_oid, system_identifier, database_oid, checked_at)
		SELECT $1, c.oid, c.reltype, s.system_identifier::text, d.oid, now()
		FROM pg_class c, pg_control_system() s, pg_database d
		WHERE c.oid = $3::oid AND c.reltype = $4::oid AND c.oid = to_regclass($2) AND d.datname = current_database()
		ON CONFLICT (table_name) DO UPDATE SET table_oid = EXCLUDED.table_oid, row_type_oid = EXCLUDED.row_type_oid,
			system_identifier = EXCLUDED.system_identifier, database_oid = EXCLUDED.database_oid, checked_at = EXCLUDED.checked_at`,
			t.Name, t.quoted, t.oid, t.rowType)
		return err
	})
	if err != nil {
		return t.unrecorded("record the table checked in", quoted, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: %s no longer names table OID %d, which was checked; looking again", ErrChangedWhileChecked, t.Name, t.oid)
	}
	return nil
}
