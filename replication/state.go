package replication

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrSlotVanished is wrapped by the error of a slot that the relay's history
// says existed but that is gone: events committed after the last confirmed
// position may be lost, so the relay will not create a new slot by itself.
var ErrSlotVanished = errors.New("replication: the slot pgoutbox used before is gone")

// ErrSlotAdvanced is wrapped by the error of a slot found past where
// pgoutbox's last session on it stopped: someone else moved it while
// pgoutbox was stopped, and the events in between were skipped.
var ErrSlotAdvanced = errors.New("replication: the slot was moved on while pgoutbox was stopped")

// DefaultStateTable is the table that keeps the relay's history, one row per
// slot.
const DefaultStateTable = "public.pgoutbox_state"

// State is the relay's history of one slot, kept in the database beside the
// outbox (postgres.state.table) so that it outlives the process and the
// slot: a slot that vanished while pgoutbox was stopped (dropped by a DBA,
// or lost in a failover before PostgreSQL 17) is found out at the next start
// instead of being replaced silently.
type State struct {
	Slot             string
	SystemIdentifier string
	Database         string
	Timeline         int32
	// SlotCreatedAt and SlotCreatedLSN say when and where pgoutbox created
	// the slot; zero when it found the slot already there.
	SlotCreatedAt  time.Time
	SlotCreatedLSN LSN
	// ConfirmedLSN is the position pgoutbox last recorded as confirmed;
	// the slot may be a little further (it is recorded every few seconds).
	ConfirmedLSN LSN
	ConfirmedAt  time.Time
	// Instance is the pgoutbox process that last started a session on the
	// slot, and SessionStartedAt when.
	Instance         string
	SessionStartedAt time.Time
	Note             string
	// PublicationOID and TableOIDs are the catalog the last session
	// streamed with: a publication or table recreated while pgoutbox was
	// stopped is found out at the next start.
	PublicationOID uint32
	TableOIDs      map[string]uint32
	// Publication is the publication's name (for the guard of migrate
	// --guard, which sees only names once a publication is dropped).
	Publication string
	// PublicationXmin and Membership are the publication's catalog row
	// and the outbox tables' membership rows the last session streamed
	// with (see Catalog): a table taken out of the publication and put
	// back, or inserts unpublished for a while, while pgoutbox was stopped,
	// are found out at the next start. Zero and nil when none were
	// recorded (a version from before them).
	PublicationXmin uint32
	Membership      map[string]Membership
	// Attached are the outbox tables' partitions when the last session
	// started, by OID, with the transaction that made each part of its
	// table (PartitionInfo.Joined): they were looked at for rows from
	// before that (see AttachedWithOlderRows), or accepted. nil when none
	// were recorded (a version from before them).
	Attached map[uint32]uint32
	// RetiredOIDs are the OIDs of outbox tables that were dropped and
	// created again (recorded by migrate --accept-catalog), by the table's
	// name: rows of the old table may still be in the WAL to read.
	RetiredOIDs map[uint32]string
	// StoppedLSN is the fence: the furthest position the process of the
	// last session may have confirmed to the slot (0 when none was
	// recorded: a state table or a version from before the fence). A
	// session records it ahead of what it confirms (RaiseFence) and lowers
	// it to what it last confirmed when it stops, so it holds after a
	// SIGKILL too. The slot moves only when a client confirms, so a slot
	// found past it at the next start was moved by someone else while
	// pgoutbox was stopped (pg_replication_slot_advance, another client on
	// the slot): the events in between were skipped. The one exception is
	// the server's shutdown, which waits for the end of its WAL to be
	// confirmed and refuses the connection the fence is written on.
	StoppedLSN LSN
	// MessagesPrefix is the messages.prefix the last session relayed
	// table-less messages with ("": none), when MessagesRecorded is true
	// (a version from before it, or Prepare alone, recorded none): a
	// poll relay's handover counts the slot's pending messages with it.
	MessagesPrefix   string
	MessagesRecorded bool
	// AwaitingSnapshot, when not empty, says why the slot is missing on
	// purpose (handed over to the poll source, recreated by migrate
	// --recreate-slot for an initial snapshot): the row is a placeholder
	// with no history, and the slot is to be made by the initial snapshot
	// of the WAL source (snapshot.mode: initial), which publishes the rows
	// written since. A start without one refuses it (see AwaitSnapshot).
	AwaitingSnapshot string
	// Destination is where the last session on the slot published (a
	// fingerprint of its Kafka cluster and topic-deciding settings, with
	// a description; the relay makes and reads it), "" when none was
	// recorded (a version from before it): an instance with another
	// destination does not take the slot over while an instance with this
	// one runs.
	Destination string
}

// FencePassedBy says whether a slot confirmed at at is past the fence
// (never when no fence was recorded): something other than the last
// session moved it, or PostgreSQL's shutdown did (see Start.CheckFence).
func (s State) FencePassedBy(at LSN) bool {
	return s.StoppedLSN != 0 && at > s.StoppedLSN
}

// FenceStale says the row records a session that confirmed past its fence
// (confirmed_lsn above stopped_lsn), which only a pgoutbox version from
// before the fence does: the fence is older than that session (see
// FenceStale). Cleanup and the poll handover still refuse such a slot: a
// start of the relay judges it (Start.CheckFence) and, passing, moves the
// fence to the slot.
func (s State) FenceStale() bool {
	return s.StoppedLSN != 0 && s.ConfirmedLSN > s.StoppedLSN && s.Note != fenceRefusedNote
}

// ServerIdentity is what identifies the server and its history.
type ServerIdentity struct {
	SystemIdentifier string
	Database         string
	Timeline         int32
	// VersionNum is server_version_num (170002 for 17.2).
	VersionNum int
	// StartedAt is pg_postmaster_start_time(), and CheckpointLSN the
	// position of the latest checkpoint record (pg_control_checkpoint()):
	// together they tell whether a slot found past the recorded fence may
	// have been moved by the server's own shutdown (see RaiseFence).
	StartedAt     time.Time
	CheckpointLSN LSN
	// WALEnd is the end of the server's WAL (ReadWALEnd), read by Prepare
	// after the slot: no client can have confirmed past it. 0: not known.
	WALEnd LSN
}

// ReadServerIdentity reads the system identifier, database and timeline.
func ReadServerIdentity(ctx context.Context, conn *pgx.Conn) (ServerIdentity, error) {
	var id ServerIdentity
	var ckpt string
	// The timeline is the current WAL file's: pg_control_checkpoint()'s is
	// the latest checkpoint's, which after a promotion stays the old one
	// until the new timeline's first checkpoint (a standby has no WAL
	// position of its own: its checkpoint's it is).
	err := conn.QueryRow(ctx, `SELECT s.system_identifier::text, current_database(),
		CASE WHEN pg_is_in_recovery() THEN c.timeline_id
			ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int END,
		current_setting('server_version_num')::int, pg_postmaster_start_time(), c.checkpoint_lsn::text
		FROM pg_control_system() s, pg_control_checkpoint() c`).Scan(&id.SystemIdentifier, &id.Database, &id.Timeline, &id.VersionNum,
		&id.StartedAt, &ckpt)
	if err != nil {
		return id, fmt.Errorf("replication: read the server's system identifier: %w", err)
	}
	if id.CheckpointLSN, err = parseLSN(ckpt); err != nil {
		return id, err
	}
	return id, nil
}

// ReadWALEnd reads the end of the server's WAL, its insert position: read
// after a slot, it is at or past anything a client of the slot can have
// confirmed. 0 on a standby, where what was received and replayed so far
// may trail a synchronized slot for a while after a restart.
func ReadWALEnd(ctx context.Context, conn *pgx.Conn) (LSN, error) {
	var end string
	if err := conn.QueryRow(ctx, `SELECT (CASE WHEN pg_is_in_recovery() THEN '0/0'
		ELSE pg_current_wal_insert_lsn() END)::text`).Scan(&end); err != nil {
		return 0, fmt.Errorf("replication: read the end of WAL: %w", err)
	}
	return parseLSN(end)
}

// stateDDL creates the state table. It holds no events and is small: one row
// per slot, updated every few seconds while events flow.
const stateDDL = `CREATE TABLE IF NOT EXISTS %s (
	slot_name          text PRIMARY KEY,
	system_identifier  text NOT NULL,
	database           text NOT NULL,
	timeline           integer NOT NULL,
	slot_created_at    timestamptz,
	slot_created_lsn   pg_lsn,
	confirmed_lsn      pg_lsn NOT NULL,
	confirmed_at       timestamptz NOT NULL,
	instance           text NOT NULL,
	session_started_at timestamptz NOT NULL,
	note               text NOT NULL DEFAULT '',
	publication_oid    oid,
	table_oids         jsonb,
	publication_name   text,
	retired_oids       jsonb,
	stopped_lsn        pg_lsn,
	membership         jsonb,
	cleanup_hold       text,
	messages_prefix    text,
	awaiting_snapshot  text,
	destination        text
)`

// stateAddColumnsDDL adds the columns of later versions to a state table
// made before them.
const stateAddColumnsDDL = `ALTER TABLE %s ADD COLUMN IF NOT EXISTS stopped_lsn pg_lsn, ADD COLUMN IF NOT EXISTS membership jsonb,
	ADD COLUMN IF NOT EXISTS cleanup_hold text, ADD COLUMN IF NOT EXISTS messages_prefix text, ADD COLUMN IF NOT EXISTS awaiting_snapshot text,
	ADD COLUMN IF NOT EXISTS destination text`

// membershipRecord is the membership column: what State.PublicationXmin and
// State.Membership hold.
type membershipRecord struct {
	PublicationXmin uint32                `json:"publication_xmin"`
	Tables          map[string]Membership `json:"tables"`
	// Absent (nil) in a record from before it: nothing was looked at.
	Partitions map[uint32]uint32 `json:"partitions"`
}

// StateTableDDL returns the statements that create the state table, or
// bring one made by an earlier version up to date.
func StateTableDDL(table string) (string, error) {
	q, err := qualifiedIdent(table)
	if err != nil {
		return "", fmt.Errorf("replication: state.table: %w", err)
	}
	return fmt.Sprintf(stateDDL, q) + ";\n" + fmt.Sprintf(stateAddColumnsDDL, q), nil
}

// EnsureStateTable creates the state table unless it exists. A role that may
// not create it gets an error that says how to have it created. Instances
// starting together may all call it: the one whose creation loses to
// another's (CreatedConcurrently) uses the table the other made.
func EnsureStateTable(ctx context.Context, conn *pgx.Conn, table string) error {
	exists, err := StateTableExists(ctx, conn, table)
	if err != nil {
		return err
	}
	if exists {
		// A table made by an earlier version lacks stopped_lsn,
		// membership, cleanup_hold, messages_prefix, awaiting_snapshot or
		// destination:
		// add them when this role may (it owns the table), or go on
		// without the checks they serve (pgoutbox migrate adds them).
		var has int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_attribute WHERE attrelid = to_regclass($1)
			AND attname IN ('stopped_lsn', 'membership', 'cleanup_hold', 'messages_prefix', 'awaiting_snapshot', 'destination') AND NOT attisdropped`, quoteTable(table)).Scan(&has); err != nil {
			return fmt.Errorf("replication: look up state table %s: %w", table, err)
		}
		if has < 6 {
			q, err := qualifiedIdent(table)
			if err != nil {
				return err
			}
			// Not behind a long transaction on the table: without the
			// columns pgoutbox goes on, and adds them another time.
			_, _ = conn.Exec(ctx, "SET LOCAL lock_timeout = '2s'; "+fmt.Sprintf(stateAddColumnsDDL, q))
		}
		return nil
	}
	ddl, err := StateTableDDL(table)
	if err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, ddl); err != nil {
		if CreatedConcurrently(err) {
			// Another instance starting at the same moment made it: go on
			// as with a table that existed.
			if exists, xerr := StateTableExists(ctx, conn, table); xerr == nil && exists {
				return EnsureStateTable(ctx, conn, table)
			}
		}
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "42501" { // insufficient_privilege
			return fmt.Errorf("replication: create state table %s: %w; run pgoutbox migrate as the outbox tables' owner (it creates the table), grant this role CREATE on the schema, or set postgres.state.table to \"\" to keep no history (a slot dropped while pgoutbox is stopped is then replaced silently)", table, err)
		}
		return fmt.Errorf("replication: create state table %s: %w", table, err)
	}
	return nil
}

// ReadState reads the state row of slot; ok is false when there is none.
func ReadState(ctx context.Context, conn *pgx.Conn, table, slot string) (s State, ok bool, err error) {
	q, err := qualifiedIdent(table)
	if err != nil {
		return s, false, err
	}
	var createdLSN *string
	var createdAt *time.Time
	var confirmed string
	var pubOID *uint32
	var stopped *string
	var membership *membershipRecord
	var prefix *string
	// The later columns through to_jsonb: a table made before them has no
	// such columns, and reads as never stopped, with no membership or
	// messages prefix or destination recorded, awaiting nothing.
	err = conn.QueryRow(ctx, `SELECT slot_name, system_identifier, database, timeline, slot_created_at, slot_created_lsn::text,
		confirmed_lsn::text, confirmed_at, instance, session_started_at, note, publication_oid, table_oids,
		coalesce(publication_name, ''), retired_oids, to_jsonb(st) ->> 'stopped_lsn', to_jsonb(st) -> 'membership',
		to_jsonb(st) ->> 'messages_prefix', coalesce(to_jsonb(st) ->> 'awaiting_snapshot', ''), coalesce(to_jsonb(st) ->> 'destination', '')
		FROM `+q+` AS st WHERE slot_name = $1`, slot).Scan(
		&s.Slot, &s.SystemIdentifier, &s.Database, &s.Timeline, &createdAt, &createdLSN, &confirmed, &s.ConfirmedAt,
		&s.Instance, &s.SessionStartedAt, &s.Note, &pubOID, &s.TableOIDs, &s.Publication, &s.RetiredOIDs, &stopped, &membership,
		&prefix, &s.AwaitingSnapshot, &s.Destination)
	if prefix != nil {
		s.MessagesPrefix, s.MessagesRecorded = *prefix, true
	}
	if membership != nil {
		s.PublicationXmin, s.Membership, s.Attached = membership.PublicationXmin, membership.Tables, membership.Partitions
	}
	if pubOID != nil {
		s.PublicationOID = *pubOID
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return s, false, nil
	}
	if err != nil {
		return s, false, fmt.Errorf("replication: read state of slot %q from %s: %w", slot, table, err)
	}
	if createdAt != nil {
		s.SlotCreatedAt = *createdAt
	}
	if createdLSN != nil {
		if s.SlotCreatedLSN, err = parseLSN(*createdLSN); err != nil {
			return s, false, err
		}
	}
	if s.ConfirmedLSN, err = parseLSN(confirmed); err != nil {
		return s, false, err
	}
	if stopped != nil {
		if s.StoppedLSN, err = parseLSN(*stopped); err != nil {
			return s, false, err
		}
	}
	return s, true, nil
}

// writeStateSQL upserts a state row; its verbs fill in the later columns'
// names, values and updates (stateLater), or fewer for a table made before
// them.
const writeStateSQL = `INSERT INTO %[1]s (slot_name, system_identifier, database, timeline, slot_created_at, slot_created_lsn,
		confirmed_lsn, confirmed_at, instance, session_started_at, note, publication_oid, table_oids, publication_name, retired_oids%[2]s)
		VALUES ($1, $2, $3, $4, $5, $6::pg_lsn, $7::pg_lsn, $8, $9, $10, $11, $12, $13, $14, $15%[3]s)
		ON CONFLICT (slot_name) DO UPDATE SET system_identifier = EXCLUDED.system_identifier, database = EXCLUDED.database,
		timeline = EXCLUDED.timeline, slot_created_at = EXCLUDED.slot_created_at, slot_created_lsn = EXCLUDED.slot_created_lsn,
		confirmed_lsn = EXCLUDED.confirmed_lsn, confirmed_at = EXCLUDED.confirmed_at, instance = EXCLUDED.instance,
		session_started_at = EXCLUDED.session_started_at, note = EXCLUDED.note, publication_oid = EXCLUDED.publication_oid,
		table_oids = EXCLUDED.table_oids, publication_name = EXCLUDED.publication_name, retired_oids = EXCLUDED.retired_oids%[4]s`

// WriteState inserts or replaces the state row of s.Slot.
func WriteState(ctx context.Context, conn *pgx.Conn, table string, s State) error {
	return writeState(ctx, conn, table, s, true)
}

// WriteStateIfAbsent inserts the state row of s.Slot unless there is one:
// a start that found none must not replace the row of an instance that
// started streaming meanwhile (its fence would then be lost to it).
func WriteStateIfAbsent(ctx context.Context, conn *pgx.Conn, table string, s State) error {
	return writeState(ctx, conn, table, s, false)
}

func writeState(ctx context.Context, conn *pgx.Conn, table string, s State, replace bool) error {
	q, err := qualifiedIdent(table)
	if err != nil {
		return err
	}
	var createdAt *time.Time
	var createdLSN *string
	if !s.SlotCreatedAt.IsZero() {
		createdAt = &s.SlotCreatedAt
		l := s.SlotCreatedLSN.String()
		createdLSN = &l
	}
	var pubOID *uint32
	if s.PublicationOID != 0 {
		pubOID = &s.PublicationOID
	}
	var stopped *string
	if s.StoppedLSN != 0 {
		l := s.StoppedLSN.String()
		stopped = &l
	}
	var membership *membershipRecord
	if s.Membership != nil {
		membership = &membershipRecord{PublicationXmin: s.PublicationXmin, Tables: s.Membership, Partitions: s.Attached}
	}
	var prefix, awaiting, destination *string
	if s.MessagesRecorded {
		prefix = &s.MessagesPrefix
	}
	if s.AwaitingSnapshot != "" {
		awaiting = &s.AwaitingSnapshot
	}
	if s.Destination != "" {
		destination = &s.Destination
	}
	args := []any{s.Slot, s.SystemIdentifier, s.Database, s.Timeline, createdAt, createdLSN, s.ConfirmedLSN.String(), s.ConfirmedAt,
		s.Instance, s.SessionStartedAt, s.Note, pubOID, s.TableOIDs, s.Publication, s.RetiredOIDs, stopped, membership, prefix, awaiting, destination}
	// The later columns, newest last: a table made before one of them
	// (whose owner did not let this role add it) is written without it and
	// those after it.
	for n := len(stateLater); ; n-- {
		var cols, vals, sets string
		for i, c := range stateLater[:n] {
			cols += ", " + c.name
			vals += fmt.Sprintf(", $%d%s", 16+i, c.cast)
			sets += ", " + c.name + " = EXCLUDED." + c.name
		}
		sql := fmt.Sprintf(writeStateSQL, q, cols, vals, sets)
		if !replace {
			sql = sql[:strings.Index(sql, "ON CONFLICT")] + "ON CONFLICT (slot_name) DO NOTHING"
		}
		_, err = conn.Exec(ctx, sql, args[:15+n]...)
		if n == 0 || !undefinedColumn(err) {
			break
		}
	}
	if err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "42501" {
			return fmt.Errorf("replication: write state of slot %q to %s: %w; let pgoutbox's role write it: GRANT SELECT, INSERT, UPDATE ON %s TO <the role>", s.Slot, table, err, q)
		}
		return fmt.Errorf("replication: write state of slot %q to %s: %w", s.Slot, table, err)
	}
	return nil
}

// stateLater are the state table's columns added after its first version,
// in the order they were added.
var stateLater = []struct{ name, cast string }{
	{"stopped_lsn", "::pg_lsn"},
	{"membership", ""},
	{"messages_prefix", ""},
	{"awaiting_snapshot", ""},
	{"destination", ""},
}

// RecordConfirmed moves the recorded confirmed position of slot forward to
// lsn (never back), if instance still owns the row.
func RecordConfirmed(ctx context.Context, conn *pgx.Conn, table, slot, instance string, lsn LSN) error {
	q, err := qualifiedIdent(table)
	if err != nil {
		return err
	}
	_, err = conn.Exec(ctx, `UPDATE `+q+` SET confirmed_lsn = $3::pg_lsn, confirmed_at = now()
		WHERE slot_name = $1 AND instance = $2 AND confirmed_lsn < $3::pg_lsn`, slot, instance, lsn.String())
	if err != nil {
		return fmt.Errorf("replication: record confirmed position of slot %q in %s: %w", slot, table, err)
	}
	return nil
}

// RecordPartitions adds to the state row of slot, while instance holds
// it, partitions looked at for rows from before their attach (OID to
// attaching transaction, as State.Attached), so that the next start and
// pgoutbox cleanup do not look at them again. A row that records no
// partitions (an earlier version's) is left so.
func RecordPartitions(ctx context.Context, conn *pgx.Conn, table, slot, instance string, parts map[uint32]uint32) error {
	q, err := qualifiedIdent(table)
	if err != nil {
		return err
	}
	_, err = conn.Exec(ctx, `UPDATE `+q+` SET membership = jsonb_set(membership, '{partitions}', (membership -> 'partitions') || $3::jsonb)
		WHERE slot_name = $1 AND instance = $2 AND jsonb_typeof(membership -> 'partitions') = 'object'`, slot, instance, parts)
	if undefinedColumn(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("replication: record partitions of slot %q in %s: %w", slot, table, err)
	}
	return nil
}

// RecordStopped records where a session of instance stopped: the furthest
// position its process may have confirmed to the slot. A state table made
// before stopped_lsn keeps no such record.
func RecordStopped(ctx context.Context, conn *pgx.Conn, table, slot, instance string, lsn LSN) error {
	q, err := qualifiedIdent(table)
	if err != nil {
		return err
	}
	_, err = conn.Exec(ctx, `UPDATE `+q+` SET stopped_lsn = $3::pg_lsn WHERE slot_name = $1 AND instance = $2`, slot, instance, lsn.String())
	if undefinedColumn(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("replication: record where the session on slot %q stopped in %s: %w", slot, table, err)
	}
	return nil
}

// RaiseFence moves slot's fence (stopped_lsn) forward to lsn, never back,
// if instance still owns the row, and returns the fence the row now holds.
// ErrFenceLost means the row is another instance's, or gone: nothing past
// the old fence may be confirmed. ok is false on a state table made before
// stopped_lsn, which keeps no fence.
func RaiseFence(ctx context.Context, conn *pgx.Conn, table, slot, instance string, lsn LSN) (fence LSN, ok bool, err error) {
	q, err := qualifiedIdent(table)
	if err != nil {
		return 0, false, err
	}
	var got string
	err = conn.QueryRow(ctx, `UPDATE `+q+` SET stopped_lsn = greatest(coalesce(stopped_lsn, $3::pg_lsn), $3::pg_lsn)
		WHERE slot_name = $1 AND instance = $2 RETURNING stopped_lsn::text`, slot, instance, lsn.String()).Scan(&got)
	switch {
	case undefinedColumn(err):
		return 0, false, nil
	case errors.Is(err, pgx.ErrNoRows):
		return 0, true, fmt.Errorf("%w: slot %q in %s", ErrFenceLost, slot, table)
	case err != nil:
		return 0, true, fmt.Errorf("replication: record how far slot %q may be confirmed in %s: %w", slot, table, err)
	}
	fence, err = parseLSN(got)
	return fence, true, err
}

// readFence reads slot's fence (stopped_lsn; 0 when none) and its
// recorded confirmed position together: CheckFence judges the one by the
// other (FenceStale), so both must come from the same moment.
func readFence(ctx context.Context, conn *pgx.Conn, table, slot string) (fence, confirmed LSN, err error) {
	q, err := qualifiedIdent(table)
	if err != nil {
		return 0, 0, err
	}
	var got *string
	var conf string
	err = conn.QueryRow(ctx, `SELECT stopped_lsn::text, confirmed_lsn::text FROM `+q+` WHERE slot_name = $1`, slot).Scan(&got, &conf)
	switch {
	case errors.Is(err, pgx.ErrNoRows) || undefinedColumn(err):
		return 0, 0, nil
	case err != nil:
		return 0, 0, fmt.Errorf("replication: read the fence of slot %q from %s: %w", slot, table, err)
	}
	if confirmed, err = parseLSN(conf); err != nil {
		return 0, 0, err
	}
	if got == nil {
		return 0, confirmed, nil
	}
	fence, err = parseLSN(*got)
	return fence, confirmed, err
}

// ErrFenceLost: the state row no longer names this instance, so the fence
// cannot be raised.
var ErrFenceLost = errors.New("replication: the state row is no longer this instance's")

// undefinedColumn says err is PostgreSQL's undefined_column (42703): here,
// a state table made before stopped_lsn.
func undefinedColumn(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "42703"
}

// DeleteState removes the state row of slot (when the slot is dropped on
// purpose).
func DeleteState(ctx context.Context, conn *pgx.Conn, table, slot string) error {
	q, err := qualifiedIdent(table)
	if err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, `DELETE FROM `+q+` WHERE slot_name = $1`, slot); err != nil {
		return fmt.Errorf("replication: delete state of slot %q from %s: %w", slot, table, err)
	}
	return nil
}

// AwaitSnapshot makes the state row of slot a placeholder that says why
// the slot is missing on purpose (State.AwaitingSnapshot): no history (no
// position, fence, catalog or instance), and the slot to be made by the
// WAL source's initial snapshot, which publishes the rows written since
// (a start without one is refused: a slot made then would skip them). A
// cleanup hold not yet released stays. id is the server's; publication,
// when not empty, keeps the publication protected by migrate --guard.
// q may be a transaction: a handover marks the row in the one that drops
// the slot. A state table made before awaiting_snapshot fails with
// PostgreSQL's undefined_column (see EnsureStateTable).
func AwaitSnapshot(ctx context.Context, q interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, table, slot string, id ServerIdentity, publication, why string) error {
	qt, err := qualifiedIdent(table)
	if err != nil {
		return err
	}
	var pub *string
	if publication != "" {
		pub = &publication
	}
	_, err = q.Exec(ctx, `INSERT INTO `+qt+` AS st (slot_name, system_identifier, database, timeline, confirmed_lsn, confirmed_at,
			instance, session_started_at, note, publication_name, awaiting_snapshot)
		VALUES ($1, $2, $3, $4, '0/0', now(), '', now(), $5, $6, $5)
		ON CONFLICT (slot_name) DO UPDATE SET system_identifier = EXCLUDED.system_identifier, database = EXCLUDED.database,
			timeline = EXCLUDED.timeline, slot_created_at = NULL, slot_created_lsn = NULL, confirmed_lsn = EXCLUDED.confirmed_lsn,
			confirmed_at = EXCLUDED.confirmed_at, instance = '', session_started_at = EXCLUDED.session_started_at, note = EXCLUDED.note,
			publication_oid = NULL, table_oids = NULL, publication_name = EXCLUDED.publication_name, retired_oids = NULL,
			stopped_lsn = NULL, membership = NULL, messages_prefix = NULL, awaiting_snapshot = EXCLUDED.awaiting_snapshot`,
		slot, id.SystemIdentifier, id.Database, id.Timeline, why, pub)
	if err != nil {
		return fmt.Errorf("replication: record in %s that slot %q is to be made by an initial snapshot: %w", table, slot, err)
	}
	return nil
}

// StateTableExists says whether the state table exists.
func StateTableExists(ctx context.Context, conn *pgx.Conn, table string) (bool, error) {
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", quoteTable(table)).Scan(&exists); err != nil {
		return false, fmt.Errorf("replication: look up state table %s: %w", table, err)
	}
	return exists, nil
}

// UndefinedColumn says err is PostgreSQL's undefined_column (42703): for
// the state table, one made by an earlier version whose owner has not run
// pgoutbox migrate since.
func UndefinedColumn(err error) bool { return undefinedColumn(err) }

// CatalogChangedHold is the cleanup hold a start that finds the catalog
// changed records (once, however often it is refused).
const CatalogChangedHold = "pgoutbox found the outbox table or publication changed since it last streamed: events committed while it was changed may never have been relayed from the WAL"

// SetCleanupHold records in the state row of slot why pgoutbox cleanup must
// delete nothing: after migrate --recreate-slot or --accept-catalog (or a
// start that found the catalog changed), events committed in a gap were
// never relayed from the WAL, and cleanup, which deletes by the slot's
// position, would delete their rows as relayed. A hold not yet released is
// kept and why is appended to it (unless it says so already). The relay's
// own writes of the row leave the hold as it is; cleanup --release-hold
// clears it.
func SetCleanupHold(ctx context.Context, conn *pgx.Conn, table, slot, why string) (string, error) {
	q, err := qualifiedIdent(table)
	if err != nil {
		return "", err
	}
	// A table of an earlier version gains the column where this role may
	// add it; where it may not, the UPDATE below fails and says so.
	if err := EnsureStateTable(ctx, conn, table); err != nil {
		return "", err
	}
	var hold string
	err = conn.QueryRow(ctx, `UPDATE `+q+` SET cleanup_hold = CASE
		WHEN coalesce(cleanup_hold, '') = '' THEN $2
		WHEN strpos(cleanup_hold, $2) > 0 THEN cleanup_hold
		ELSE cleanup_hold || '; and ' || $2 END
		WHERE slot_name = $1 RETURNING cleanup_hold`, slot, why).Scan(&hold)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("replication: record the cleanup hold of slot %q in %s: no state row", slot, table)
	}
	if err != nil {
		return "", fmt.Errorf("replication: record the cleanup hold of slot %q in %s: %w", slot, table, err)
	}
	return hold, nil
}

// HoldID names a cleanup hold by its text: cleanup prints it beside the
// hold, and --release-hold takes it, so that a release clears only the
// hold its operator was shown, never a gap added to it since.
func HoldID(hold string) string {
	sum := sha256.Sum256([]byte(hold))
	return hex.EncodeToString(sum[:6])
}

// ErrHoldChanged is wrapped by the error of a release that named a hold
// other than the one recorded.
var ErrHoldChanged = errors.New("replication: the cleanup hold is not the one named")

// CleanupHold returns the cleanup hold of slot ("" when there is none, also
// when the state table or its row or column does not exist).
func CleanupHold(ctx context.Context, conn *pgx.Conn, table, slot string) (string, error) {
	q, err := qualifiedIdent(table)
	if err != nil {
		return "", err
	}
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", quoteTable(table)).Scan(&exists); err != nil || !exists {
		return "", err
	}
	var hold string
	err = conn.QueryRow(ctx, `SELECT coalesce(to_jsonb(st) ->> 'cleanup_hold', '') FROM `+q+` AS st WHERE slot_name = $1`, slot).Scan(&hold)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("replication: read the cleanup hold of slot %q from %s: %w", slot, table, err)
	}
	return hold, nil
}

// ReleaseCleanupHold clears the cleanup hold of slot if its HoldID is id,
// and returns the hold it cleared ("" when there was none). A hold that is
// another (a gap added since it was shown) stays, and the error wraps
// ErrHoldChanged and names the hold and its ID.
func ReleaseCleanupHold(ctx context.Context, conn *pgx.Conn, table, slot, id string) (string, error) {
	hold, err := CleanupHold(ctx, conn, table, slot)
	if err != nil || hold == "" {
		return "", err
	}
	if got := HoldID(hold); got != id {
		return "", fmt.Errorf("%w: slot %q is held by %q (ID %s), and --release-hold named %s: relay the events it names, then release ID %s", ErrHoldChanged, slot, hold, got, id, got)
	}
	q, err := qualifiedIdent(table)
	if err != nil {
		return "", err
	}
	// Only the hold that was read and named: one that grew in between
	// stays.
	tag, err := conn.Exec(ctx, `UPDATE `+q+` SET cleanup_hold = NULL WHERE slot_name = $1 AND cleanup_hold = $2`, slot, hold)
	if err != nil {
		return "", fmt.Errorf("replication: release the cleanup hold of slot %q in %s: %w", slot, table, err)
	}
	if tag.RowsAffected() != 1 {
		return "", fmt.Errorf("%w: the cleanup hold of slot %q changed while it was released; run pgoutbox cleanup to see it", ErrHoldChanged, slot)
	}
	return hold, nil
}

func parseLSN(s string) (LSN, error) {
	l, err := pglogrepl.ParseLSN(s)
	if err != nil {
		return 0, fmt.Errorf("replication: LSN %q: %w", s, err)
	}
	return LSN(l), nil
}

// qualifiedIdent quotes a schema.table name (public when no schema).
func qualifiedIdent(name string) (string, error) {
	schema, table, err := splitTable(name)
	if err != nil {
		return "", err
	}
	return quoteIdent(schema) + "." + quoteIdent(table), nil
}

// SetCatalog records in s the catalog c a session streams with: the
// publication's and tables' OIDs, the publication's row version and the
// tables' membership.
func (s *State) SetCatalog(c *Catalog) {
	s.PublicationOID, s.PublicationXmin = c.Publication, c.PublicationXmin
	s.TableOIDs = make(map[string]uint32, len(c.Tables))
	s.Membership = make(map[string]Membership, len(c.Tables))
	s.Attached = c.PartitionJoins()
	for _, t := range c.Tables {
		s.TableOIDs[t.Name] = t.OID
		s.Membership[t.Name] = t.Membership
	}
}

// PrefixSharer is another slot of the database whose last pgoutbox session
// relayed table-less messages with the same prefix (PrefixSharers).
type PrefixSharer struct {
	Slot, Publication string
}

// PrefixSharers names the other slots of this database, in the state table
// table, whose last pgoutbox session relayed table-less messages with
// prefix through another publication than publication. A message belongs
// to no table: every slot of the database decodes it, so each of those
// relays puts it in its own topics too. Slots of one publication (regions
// relaying the same events to their own clusters) are not named. Only
// existing slots count.
func PrefixSharers(ctx context.Context, conn *pgx.Conn, table, slot, prefix, publication string) ([]PrefixSharer, error) {
	if prefix == "" {
		return nil, nil
	}
	q, err := qualifiedIdent(table)
	if err != nil {
		return nil, err
	}
	rows, err := conn.Query(ctx, `SELECT t.slot_name, coalesce(t.publication_name, '') FROM `+q+` t
		JOIN pg_replication_slots s ON s.slot_name = t.slot_name AND s.database = current_database()
		WHERE t.slot_name <> $1 AND t.messages_prefix = $2 AND coalesce(t.publication_name, '') <> $3
		ORDER BY 1`, slot, prefix, publication)
	if err != nil {
		return nil, fmt.Errorf("replication: read the state table %s: %w", table, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (PrefixSharer, error) {
		var p PrefixSharer
		return p, r.Scan(&p.Slot, &p.Publication)
	})
	if err != nil {
		return nil, fmt.Errorf("replication: read the state table %s: %w", table, err)
	}
	return out, nil
}

// Unconfigured names the outbox tables the last session relayed (its
// record) that c, the configured ones, lacks: a table left out of
// postgres.table.include.list (a configuration drifted in a blue/green
// deployment, a list overridden by a Helm value). In a publication that
// still carries it (FOR ALL TABLES, FOR TABLES IN SCHEMA) its events would
// be skipped as another table's, with the slot confirmed past them.
func (s *State) Unconfigured(c *Catalog) []string {
	if s.PublicationOID == 0 || s.PublicationOID != c.Publication {
		return nil // nothing recorded, or ChangesSince's business
	}
	configured := make(map[string]bool, len(c.Tables))
	for _, t := range c.Tables {
		configured[t.Name] = true
	}
	var out []string
	for _, name := range slices.Sorted(maps.Keys(s.TableOIDs)) {
		if !configured[name] {
			out = append(out, fmt.Sprintf("outbox table %s, which the last pgoutbox session on this slot relayed, is not configured now (postgres.table.include.list, routes): from here on its events would be skipped as another table's. If that is a mistake (a configuration that drifted), configure it again; if it is no longer an outbox table, run `pgoutbox migrate --accept-catalog` with this configuration once its events up to now are relayed",
				name))
		}
	}
	return out
}

// ChangesSince describes how c differs from the OIDs the last session
// recorded (none when nothing was recorded).
func (s *State) ChangesSince(c *Catalog, cfg Config) []string {
	if s.PublicationOID == 0 {
		return nil
	}
	var out []string
	if s.PublicationOID != c.Publication {
		out = append(out, fmt.Sprintf("publication %q was dropped and created again since pgoutbox last streamed (OID %d, now %d): PostgreSQL may have skipped the changes committed in between",
			cfg.Publication, s.PublicationOID, c.Publication))
	}
	const since = "pgoutbox last streamed"
	for _, t := range c.Tables {
		was, ok := s.TableOIDs[t.Name]
		switch {
		case ok && was != t.OID:
			out = append(out, fmt.Sprintf("outbox table %s was dropped and created again since %s (OID %d, now %d): rows written before it was in the publication were not in the stream", t.Name, since, was, t.OID))
		case ok && s.PublicationOID == c.Publication:
			out = append(out, c.leftPublication(t.Name, s.Membership[t.Name], t.Membership, since, cfg)...)
		}
	}
	return out
}

// JoinedWithOlderRows names the outbox tables new to the relay (configured
// now, not in the last session's record, which names others) that hold
// rows it may never have relayed, which pgoutbox cleanup, deleting by the
// slot's position, would delete as relayed:
//   - in a publication that names the table, rows committed before it
//     joined the publication (its row of pg_publication_rel): they were
//     never decoded. (Rows committed after it are in the slot's stream.)
//     Compared as 32-bit ages, a row older than 2^31 transactions (a
//     negative age) counting as older;
//   - in a FOR ALL TABLES or FOR TABLES IN SCHEMA publication, any row:
//     the relay skipped the table's changes while it was not configured.
//
// A role that may not read a table cannot tell: unknown names those
// (their caller holds cleanup).
func JoinedWithOlderRows(ctx context.Context, conn *pgx.Conn, cfg Config, s *State, c *Catalog) (problems, unknown []string, err error) {
	if s.PublicationOID == 0 || len(s.TableOIDs) == 0 || s.PublicationOID != c.Publication {
		return nil, nil, nil
	}
	for _, t := range c.Tables {
		if _, ok := s.TableOIDs[t.Name]; ok || t.OID == 0 {
			continue
		}
		// Rows from before the join; and rows a rewrite after it wrote
		// (ddlXmins). One scan finds either; a second, only then, tells
		// which.
		scan := func(where string) (named, found bool, err error) {
			err = conn.QueryRow(ctx, `WITH m AS (SELECT pr.xmin AS x FROM pg_publication_rel pr WHERE pr.prpubid = $1::oid AND pr.prrelid = $2::oid)
				SELECT EXISTS (SELECT 1 FROM m), EXISTS (SELECT 1 FROM `+quoteTable(t.Name)+` r WHERE `+where+`)`,
				c.Publication, t.OID).Scan(&named, &found)
			return named, found, err
		}
		const before = `NOT EXISTS (SELECT 1 FROM m) OR age(r.xmin) < 0 OR age(r.xmin) > (SELECT age(x) FROM m)`
		named, suspect, err := scan(before + ` OR r.xmin IN (SELECT d.x FROM m, (` + ddlXmins("$2") + `) d WHERE age(d.x) < age(m.x))`)
		older := false
		if err == nil && suspect {
			_, older, err = scan(before)
		}
		rewritten := suspect && !older
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "42501" { // insufficient_privilege
			unknown = append(unknown, fmt.Sprintf("outbox table %s is new to pgoutbox and its role may not read it to look for rows it may never have relayed (%s): if it holds rows written before it joined publication %s (or, in a FOR ALL TABLES publication, while it was not configured), they were never relayed",
				t.Name, pe.Message, cfg.Publication))
			continue
		}
		if err != nil {
			return nil, nil, fmt.Errorf("replication: look for rows of %s from before pgoutbox relayed it: %w", t.Name, err)
		}
		if rewritten {
			unknown = append(unknown, fmt.Sprintf("outbox table %s is new to pgoutbox and was rewritten after it joined publication %s (%s), so rows written before it joined cannot be told from later ones by their transaction: if it holds some, they were never relayed",
				t.Name, cfg.Publication, rewriteWhat))
			continue
		}
		if !older {
			continue
		}
		when := fmt.Sprintf("committed before it joined publication %q: they were never in the stream", cfg.Publication)
		if !named {
			when = fmt.Sprintf("while publication %q carried it but pgoutbox was not configured for it, its changes were skipped", cfg.Publication)
		}
		problems = append(problems, fmt.Sprintf("outbox table %s is new to pgoutbox (the last session relayed %s) and holds rows it never relayed (%s); pgoutbox relays what is written from now on, as Debezium's snapshot.mode no_data does: relay them yourself if they are events (a poll relay, or the rows' ids), or delete them",
			t.Name, strings.Join(slices.Sorted(maps.Keys(s.TableOIDs)), ", "), when))
	}
	return problems, unknown, nil
}

// AttachedWithOlderRows names the partitions of outbox tables that hold
// rows written before they became part of them: a table written into, then
// attached (ATTACH PARTITION), even in one transaction. PostgreSQL decoded
// those rows as the table's own, which the publication did not carry as the
// outbox's, so they were never relayed, and pgoutbox cleanup, deleting by
// the slot's position, would delete them as relayed. A row counts as
// written before when its transaction is older than the attaching one (or
// too old to compare as a 32-bit age), or it is that one's and an earlier
// command wrote it. (A partition detached and attached again holds rows
// that may have been relayed while it was attached before: it is named
// too, and accepted with migrate --accept-catalog. Rows written by a
// subtransaction before an attach in its parent transaction are newer than
// the attach and are not told apart: migrate --guard refuses that attach.)
//
// Only partitions not in known (by OID, with the same attaching
// transaction) are looked at, each scanned until a row from before is
// found, for at most scanTimeout: checked returns those that passed.
// unknown names those that could not be looked at (this role may not read
// them, or the scan took too long): their caller holds cleanup. With known
// nil (nothing recorded), partitions created by the transaction that
// attached them are passed over.
func AttachedWithOlderRows(ctx context.Context, conn *pgx.Conn, c *Catalog, known map[uint32]uint32, scanTimeout time.Duration) (problems []string, unknown []Unlooked, checked map[uint32]uint32, err error) {
	checked = map[uint32]uint32{}
	for _, t := range c.Tables {
		for _, p := range t.Partitions {
			if p.Kind != 'r' || p.Joined == 0 {
				continue
			}
			if x, ok := known[p.OID]; ok && x == p.Joined || known == nil && p.CreatedJoining() {
				// Looked at before; or, with nothing recorded (a record
				// from before partitions were), created as a partition,
				// whose rows are taken as they are.
				continue
			}
			older, rewritten, err := partitionHoldsOlderRows(ctx, conn, p, scanTimeout)
			var pe *pgconn.PgError
			switch {
			case errors.Is(err, errPartitionGone):
				continue
			case errors.As(err, &pe) && (pe.Code == "42501" || pe.Code == "57014"): // insufficient_privilege, query_canceled (the timeout)
				unknown = append(unknown, Unlooked{OID: p.OID, Joined: p.Joined, Why: fmt.Sprintf("partition %s of outbox table %s could not be looked at for rows written before it became part of it (%s): if it holds some, they were never relayed",
					p.Name, t.Name, pe.Message)})
				continue
			case err != nil:
				return nil, nil, nil, fmt.Errorf("replication: look for rows of partition %s from before it became part of %s: %w", p.Name, t.Name, err)
			}
			if rewritten {
				unknown = append(unknown, Unlooked{OID: p.OID, Joined: p.Joined, Why: fmt.Sprintf("partition %s of outbox table %s was rewritten after it became part of it (%s), so rows written before its attach cannot be told from later ones by their transaction: if it holds some, they were never relayed",
					p.Name, t.Name, rewriteWhat)})
				continue
			}
			if older {
				problems = append(problems, fmt.Sprintf("partition %s (OID %d) of outbox table %s holds rows written before it became part of it (transaction %d attached it): PostgreSQL decoded them as %s's own rows, not as %s's, so they were never relayed; relay them yourself if they are events (a poll relay, or the rows' ids), or delete them (if the partition was detached and attached again, they may have been relayed while it was attached before)",
					p.Name, p.OID, t.Name, p.Joined, p.Name, t.Name))
				continue
			}
			checked[p.OID] = p.Joined
		}
	}
	return problems, unknown, checked, nil
}

// Unlooked is a partition AttachedWithOlderRows could not look at.
type Unlooked struct {
	OID, Joined uint32
	Why         string
}

var errPartitionGone = errors.New("replication: partition dropped")

// ddlXmins is a query of the transactions that last wrote the catalog
// rows, of the table whose OID is the query parameter oid (say "$2"), that
// a rewrite writes: its pg_class row and its columns' pg_attribute rows. A
// rewrite (a column's type changed, a column added with a volatile
// default) gives every row of the table its own transaction, and a
// column's row keeps it through later DDL of other kinds (a GRANT, a
// column added without a default, options), which writes the pg_class row
// again. Rows with one of these transactions were written by DDL, perhaps
// rewritten from before.
func ddlXmins(oid string) string {
	return `SELECT xmin AS x FROM pg_class WHERE oid = ` + oid + `::oid
		UNION SELECT xmin FROM pg_attribute WHERE attrelid = ` + oid + `::oid AND attnum > 0`
}

// rewriteWhat says what a rewrite is, for the messages naming one.
const rewriteWhat = "an ALTER TABLE that rewrites every row with its own transaction: a column's type changed, a column added with a volatile default"

// partitionHoldsOlderRows scans partition p for a row written before its
// attach, in a transaction of its own whose statement_timeout is timeout
// (the server stops a scan the client gave up on only so).
func partitionHoldsOlderRows(ctx context.Context, conn *pgx.Conn, p PartitionInfo, timeout time.Duration) (older, rewritten bool, err error) {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return false, false, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // read only
	if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL statement_timeout = %d", max(timeout.Milliseconds(), 1))); err != nil {
		return false, false, err
	}
	// By OID: a partition's name need not be one the include list could
	// spell.
	var q string
	err = tx.QueryRow(ctx, `SELECT format('%I.%I', n.nspname, k.relname) FROM pg_class k JOIN pg_namespace n ON n.oid = k.relnamespace
		WHERE k.oid = $1::oid`, p.OID).Scan(&q)
	if errors.Is(err, pgx.ErrNoRows) { // detached and dropped meanwhile
		return false, false, errPartitionGone
	}
	if err != nil {
		return false, false, err
	}
	// Rows of the attaching transaction's earlier commands; and, for a
	// table that existed before, rows of older transactions. (A table
	// created by the attaching transaction may hold rows of an older one
	// written after the attach: no other could see it before.)
	cond := `(r.xmin = $1::text::xid AND r.cmin::text::bigint < $2)`
	if !p.CreatedJoining() {
		cond += ` OR age(r.xmin) < 0 OR age(r.xmin) > age($1::text::xid)`
	}
	// A rewrite after the attach (ALTER TABLE changing a column's type,
	// adding one with a volatile default) writes every row again with its
	// own transaction: rows from before look newer than the attach (see
	// ddlXmins). One scan finds either; a second, only then, tells which.
	scan := func(where string) (found bool, err error) {
		err = tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM ONLY `+q+` r WHERE `+where+`) FROM pg_class k WHERE k.oid = $3::oid`,
			strconv.FormatUint(uint64(p.Joined), 10), int64(p.JoinedCmd), p.OID).Scan(&found)
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "42P01" || errors.Is(err, pgx.ErrNoRows) { // dropped meanwhile
			return false, errPartitionGone
		}
		return found, err
	}
	suspect, err := scan(cond + ` OR r.xmin IN (SELECT d.x FROM (` + ddlXmins("$3") + `) d WHERE age(d.x) < age($1::text::xid))`)
	if err != nil || !suspect {
		return false, false, err
	}
	if older, err = scan(cond); err != nil {
		return false, false, err
	}
	return older, !older, nil
}

// NeverStreamed names what the relay's next start would find since its
// last session (st) that holds rows never in the stream, which whatever
// takes the slot's position for what was relayed (pgoutbox cleanup, the
// poll relay's handover, migrate --accept-catalog) must not: the outbox
// table or publication changed, a table new to the relay with older rows,
// a partition with rows from before it was attached, and what could not
// be looked at. cat is the catalog it read. Nothing when st recorded no
// catalog.
func NeverStreamed(ctx context.Context, conn *pgx.Conn, cfg Config, st State) (problems []string, cat Catalog, err error) {
	if cat, err = ReadCatalog(ctx, conn, cfg); err != nil || st.PublicationOID == 0 {
		return nil, cat, err
	}
	problems = st.ChangesSince(&cat, cfg)
	joined, unknown, err := JoinedWithOlderRows(ctx, conn, cfg, &st, &cat)
	if err != nil {
		return nil, cat, err
	}
	problems = append(append(problems, joined...), unknown...)
	attached, unlooked, _, err := AttachedWithOlderRows(ctx, conn, &cat, st.Attached, partitionScanTimeout)
	if err != nil {
		return nil, cat, err
	}
	problems = append(problems, attached...)
	for _, u := range unlooked {
		problems = append(problems, u.Why)
	}
	return problems, cat, nil
}

// partitionScanTimeout bounds each scan of a partition for rows from before
// its attach at start and in pgoutbox cleanup (the running relay's checks
// have a budget of their own).
const partitionScanTimeout = time.Minute

// GuardSQL returns the statements of migrate --guard: an event trigger
// that refuses to drop a publication pgoutbox streams from, or to take an
// outbox table out of it (DROP TABLE, ALTER PUBLICATION ... DROP TABLE,
// DROP PUBLICATION), as recorded in the state tables; and one that refuses
// the changes that keep inserts from the stream for a while and leave no
// trace once undone: an outbox table or a partition of it made unlogged
// (SET UNLOGGED, an unlogged partition created or attached), a table made
// to inherit from an outbox table, and the publication made to publish no
// inserts. A session that means it sets pgoutbox.allow_outbox_ddl = on
// first.
//
// The event triggers have one name per database, so one pair protects
// what every state table given records (each deployment on the database
// that installed the guard: InstallGuard keeps the list); the functions
// live in the first one's schema. A state table that does not exist (yet,
// or any more) protects nothing.
func GuardSQL(stateTables ...string) ([]string, error) {
	if len(stateTables) == 0 {
		return nil, errors.New("replication: the guard reads what to protect from state tables, and none is given")
	}
	lits := make([]string, 0, len(stateTables))
	for _, t := range stateTables {
		q, err := qualifiedIdent(t)
		if err != nil {
			return nil, err
		}
		if strings.Contains(t, "$") {
			// The functions' bodies are dollar-quoted.
			return nil, fmt.Errorf("replication: state.table %q: the guard cannot name a table with a $ in its name", t)
		}
		lits = append(lits, quoteLiteral(q))
	}
	schema, _, _ := splitTable(stateTables[0])
	fn, fnDDL, fnOurs := quoteIdent(schema)+".pgoutbox_guard", quoteIdent(schema)+".pgoutbox_guard_ddl", quoteIdent(schema)+".pgoutbox_guard_ours"
	// The rows of every state table that exists, read once per command
	// into state_rows (by dynamic SQL: a static reference to a missing table
	// fails), then read as rows of publication_name and table_oids.
	const rows = `jsonb_to_recordset(state_rows) AS s(publication_name text, table_oids jsonb)`
	readState := `	FOREACH state_table IN ARRAY ARRAY[` + strings.Join(lits, ", ") + `]::text[] LOOP
		IF to_regclass(state_table) IS NOT NULL THEN
			EXECUTE format('SELECT coalesce(jsonb_agg(jsonb_build_object(''publication_name'', coalesce(r.publication_name, ''''), ''table_oids'', coalesce(r.table_oids, ''{}''))), ''[]'') FROM %s r', to_regclass(state_table))
				INTO state_part;
			state_rows := state_rows || state_part;
		END IF;
	END LOOP;
	IF jsonb_array_length(state_rows) = 0 THEN
		RETURN;
	END IF;`
	return []string{
		// Whether transaction x (a row's xmin, 32 bits) is this one or one
		// of its subtransactions: in progress, and its row visible. Widened
		// to 64 bits by the epoch of the next transaction ID.
		`CREATE OR REPLACE FUNCTION ` + fnOurs + `(x xid) RETURNS boolean LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $pgoutbox_guard$
	SELECT coalesce(pg_xact_status((CASE WHEN g.f >= s.u AND g.f >= 4294967296 THEN g.f - 4294967296 ELSE g.f END)::text::xid8), '') = 'in progress'
	FROM (SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS u) s,
		LATERAL (SELECT ((s.u >> 32) << 32) | x::text::bigint AS f) g
$pgoutbox_guard$`,
		// SECURITY DEFINER: it runs on every DROP of the database, by roles
		// that may not read the state tables; and it lets every DROP pass
		// once every state table itself is gone.
		`CREATE OR REPLACE FUNCTION ` + fn + `() RETURNS event_trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $pgoutbox_guard$
DECLARE
	o record;
	state_table text;
	state_part jsonb;
	state_rows jsonb := '[]';
BEGIN
	IF coalesce(current_setting('pgoutbox.allow_outbox_ddl', true), '') = 'on' THEN
		RETURN;
	END IF;
` + readState + `
	FOR o IN SELECT * FROM pg_event_trigger_dropped_objects() LOOP
		-- By the object's address, whose names are not quoted, as the
		-- state row keeps them (schema.table, no dot in either):
		-- object_identity quotes some names and not others.
		IF (o.object_type = 'publication' AND EXISTS (SELECT 1 FROM ` + rows + ` WHERE o.address_names = ARRAY[s.publication_name]))
			OR (o.object_type = 'publication relation' AND EXISTS (SELECT 1 FROM ` + rows + `, jsonb_object_keys(s.table_oids) k
				WHERE o.address_names = ARRAY[split_part(k, '.', 1), split_part(k, '.', 2)] AND o.address_args = ARRAY[s.publication_name]))
		THEN
			RAISE EXCEPTION 'pgoutbox: % % is streamed by pgoutbox: dropping it would keep events from Kafka without a word', o.object_type, o.object_identity
				USING HINT = 'stop pgoutbox once it has caught up, then SET pgoutbox.allow_outbox_ddl = on in this session to do it anyway, and run pgoutbox migrate afterwards';
		END IF;
	END LOOP;
END
$pgoutbox_guard$`,
		`DROP EVENT TRIGGER IF EXISTS pgoutbox_guard`,
		`CREATE EVENT TRIGGER pgoutbox_guard ON sql_drop EXECUTE FUNCTION ` + fn + `()`,
		// The changes that keep inserts out of the WAL or the stream for a
		// while and leave no trace a catalog check could find afterwards.
		// SECURITY DEFINER: it runs on every CREATE and ALTER TABLE of the
		// database, by roles that may not read the state table.
		`CREATE OR REPLACE FUNCTION ` + fnDDL + `() RETURNS event_trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $pgoutbox_guard$
DECLARE
	c record;
	leaf record;
	outbox oid[];
	root oid;
	held boolean;
	state_table text;
	state_part jsonb;
	state_rows jsonb := '[]';
BEGIN
	IF coalesce(current_setting('pgoutbox.allow_outbox_ddl', true), '') = 'on' THEN
		RETURN;
	END IF;
` + readState + `
	SELECT coalesce(array_agg(DISTINCT v.value::oid), '{}') INTO outbox FROM ` + rows + `, jsonb_each_text(s.table_oids) v;
	FOR c IN SELECT * FROM pg_event_trigger_ddl_commands() LOOP
		IF c.classid = 'pg_class'::regclass THEN
			-- The outbox table it is part of (itself a partition, maybe).
			root := coalesce((SELECT a.relid FROM pg_partition_ancestors(c.objid) a WHERE a.relid = ANY (outbox) LIMIT 1),
				pg_partition_root(c.objid), c.objid);
			IF root = ANY (outbox) AND EXISTS (SELECT 1 FROM pg_class r
				WHERE r.oid IN (SELECT t.relid FROM pg_partition_tree(root) t UNION SELECT root) AND r.relpersistence <> 'p')
			THEN
				RAISE EXCEPTION 'pgoutbox: % leaves part of outbox table % unlogged, which pgoutbox streams: the rows written to it would never reach the WAL, and no later check could tell', c.command_tag, root::regclass
					USING HINT = 'keep outbox tables and their partitions logged; SET pgoutbox.allow_outbox_ddl = on in this session to do it anyway';
			END IF;
			IF root = ANY (outbox) AND EXISTS (SELECT 1 FROM pg_class r
				WHERE r.oid IN (SELECT t.relid FROM pg_partition_tree(root) t) AND r.relkind = 'f')
			THEN
				RAISE EXCEPTION 'pgoutbox: % makes a foreign table part of outbox table %, which pgoutbox streams: the rows written to it are stored by another server and never reach this database''s WAL', c.command_tag, root::regclass
					USING HINT = 'keep the partitions of outbox tables local tables; SET pgoutbox.allow_outbox_ddl = on in this session to do it anyway';
			END IF;
			-- A table attached by this transaction (or a subtransaction of
			-- it) that holds rows written before (by another transaction,
			-- or by an earlier command of this one): they were decoded as
			-- its own, never as the outbox's. Rows written after the attach in this transaction
			-- (a partition created and written into) are the outbox's.
			IF root = ANY (outbox) THEN
				FOR leaf IN SELECT l.relid, i.cmin::text::bigint AS at FROM pg_partition_tree(root) t
					JOIN pg_inherits i ON i.inhrelid = t.relid, pg_partition_tree(t.relid) l
					WHERE ` + fnOurs + `(i.xmin) AND l.isleaf
				LOOP
					EXECUTE format('SELECT EXISTS (SELECT 1 FROM ONLY %s r WHERE NOT ` + strings.ReplaceAll(fnOurs, "'", "''") + `(r.xmin) OR r.cmin::text::bigint < $1)', leaf.relid::regclass)
						INTO held USING leaf.at;
					IF held THEN
						RAISE EXCEPTION 'pgoutbox: % makes %, which holds rows, part of outbox table %, which pgoutbox streams: PostgreSQL decoded those rows as %''s own, so they never reach the stream, and pgoutbox cleanup would take them for relayed', c.command_tag, leaf.relid::regclass, root::regclass, leaf.relid::regclass
							USING HINT = 'attach empty tables (or create partitions with PARTITION OF) and write events into them afterwards; if the rows were relayed before (a partition detached and attached again), SET pgoutbox.allow_outbox_ddl = on in this session to do it anyway, and run pgoutbox migrate --accept-catalog afterwards';
					END IF;
				END LOOP;
			END IF;
			-- An outbox table its publication carries only as part of its
			-- schema, moved to another schema (to come back later): the
			-- rows written meanwhile are never decoded.
			IF c.objid = ANY (outbox) AND EXISTS (SELECT 1 FROM ` + rows + ` JOIN pg_publication p ON p.pubname = s.publication_name
				WHERE c.objid::text IN (SELECT v.value FROM jsonb_each_text(s.table_oids) v) AND NOT p.puballtables
					AND NOT EXISTS (SELECT 1 FROM pg_publication_rel r WHERE r.prpubid = p.oid AND r.prrelid = c.objid)
					AND NOT EXISTS (SELECT 1 FROM pg_publication_namespace n JOIN pg_class k ON k.relnamespace = n.pnnspid
						WHERE n.pnpubid = p.oid AND k.oid = c.objid))
			THEN
				RAISE EXCEPTION 'pgoutbox: % takes outbox table % out of the publication pgoutbox streams from, which carries it only as part of its schema: the rows written to it elsewhere would never reach the stream', c.command_tag, c.objid::regclass
					USING HINT = 'add the table to the publication by name first (ALTER PUBLICATION ... ADD TABLE), which follows it; SET pgoutbox.allow_outbox_ddl = on in this session to do it anyway';
			END IF;
			IF EXISTS (SELECT 1 FROM pg_inherits i JOIN pg_class k ON k.oid = i.inhrelid
				WHERE i.inhrelid = c.objid AND i.inhparent = ANY (outbox) AND NOT k.relispartition)
			THEN
				RAISE EXCEPTION 'pgoutbox: % makes % inherit from an outbox table pgoutbox streams: the rows written to it are not in the publication', c.command_tag, c.object_identity
					USING HINT = 'write events into the outbox table itself or into a partition of it; SET pgoutbox.allow_outbox_ddl = on in this session to do it anyway';
			END IF;
		ELSIF c.classid = 'pg_publication'::regclass AND EXISTS (SELECT 1 FROM pg_publication p, ` + rows + `
			WHERE p.oid = c.objid AND p.pubname = s.publication_name AND NOT p.pubinsert)
		THEN
			RAISE EXCEPTION 'pgoutbox: % stops publication %, which pgoutbox streams, from publishing inserts: the events written meanwhile would never reach the stream, and no later check could tell', c.command_tag, c.object_identity
				USING HINT = 'keep publish = ''insert'' in the publication; SET pgoutbox.allow_outbox_ddl = on in this session to do it anyway';
		END IF;
	END LOOP;
END
$pgoutbox_guard$`,
		`DROP EVENT TRIGGER IF EXISTS pgoutbox_guard_ddl`,
		`CREATE EVENT TRIGGER pgoutbox_guard_ddl ON ddl_command_end WHEN TAG IN ('CREATE TABLE', 'CREATE SCHEMA', 'ALTER TABLE', 'CREATE FOREIGN TABLE', 'ALTER FOREIGN TABLE', 'ALTER PUBLICATION') EXECUTE FUNCTION ` + fnDDL + `()`,
	}, nil
}
