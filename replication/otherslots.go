package replication

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrSlotLeftBehind: another slot that relayed the same outbox tables to
// the same place is idle behind where this relay's slot started, and
// holds events this one never sees (see OtherSlot.Behind).
var ErrSlotLeftBehind = errors.New("replication: another slot of the same outbox tables was left behind")

// OtherSlot is another logical slot of this database, still there, whose
// state row says its last pgoutbox session relayed one of this relay's
// outbox tables: a relay the configuration was moved away from (slot.name
// changed, a Helm stream renamed, the poll source set up) or one relaying
// beside it (a region's, a blue/green side).
type OtherSlot struct {
	Slot string
	// Tables are the outbox tables of this relay's that it relayed;
	// Prefix is the messages prefix it relayed ("" for none).
	Tables []string
	Prefix string
	// Active: a walsender streams from it. Confirmed is its
	// confirmed_flush_lsn.
	Active    bool
	Confirmed LSN
	// Destination as its state row records it ("" when none was).
	Destination string
	// Lost: PostgreSQL invalidated it (wal_status lost, or an
	// invalidation_reason from PostgreSQL 17 on): what it held is gone.
	Lost bool
}

// Shares says whether o relayed one of this relay's outbox tables
// (Tables holds only those; OtherSlots reads no others).
func (o OtherSlot) Shares() bool { return len(o.Tables) > 0 }

// Behind says whether o still holds changes from before at, the position
// a slot of this relay starts from: an idle slot confirmed below it may
// hold events committed in between, which that new slot never sees.
func (o OtherSlot) Behind(at LSN) bool { return !o.Active && o.Confirmed < at }

// What names what o relayed of a relay's of messages prefix: the tables
// it shares, and its messages when it has that prefix.
func (o OtherSlot) What(prefix string) string {
	s := strings.Join(o.Tables, ", ")
	if prefix != "" && o.Prefix == prefix {
		if s != "" {
			s += " and "
		}
		s += fmt.Sprintf("messages with prefix %q", o.Prefix)
	}
	return s
}

// OtherSlots reads, from the state table, the slots other than slot that
// still exist in this database and whose last pgoutbox session relayed
// one of tables (schema-qualified, as the state rows name them). A
// messages prefix alone does not count: relays of other tables share the
// default one (a review found every stopped one refusing every new slot).
// A state table that does not exist yet holds none. It reads only.
func OtherSlots(ctx context.Context, conn *pgx.Conn, table, slot string, tables []string) ([]OtherSlot, error) {
	q, err := qualifiedIdent(table)
	if err != nil {
		return nil, err
	}
	if tables == nil {
		tables = []string{}
	}
	// to_jsonb reads the columns a state table of an earlier version may
	// not have yet (validate reads without bringing it up to date).
	rows, err := conn.Query(ctx, `SELECT t.slot_name,
			ARRAY(SELECT k FROM jsonb_object_keys(coalesce(t.table_oids, '{}'::jsonb)) k WHERE k = ANY($2::text[]) ORDER BY k),
			coalesce(to_jsonb(t) ->> 'messages_prefix', ''),
			s.active, s.confirmed_flush_lsn::text, coalesce(to_jsonb(t) ->> 'destination', ''),
			s.wal_status = 'lost' OR coalesce(to_jsonb(s) ->> 'invalidation_reason', '') <> ''
		FROM `+q+` t JOIN pg_catalog.pg_replication_slots s ON s.slot_name = t.slot_name AND s.database = pg_catalog.current_database()
		WHERE t.slot_name <> $1 AND s.slot_type = 'logical' AND s.confirmed_flush_lsn IS NOT NULL
			AND coalesce(t.table_oids, '{}'::jsonb) ?| $2::text[]
		ORDER BY 1`, slot, tables)
	var out []OtherSlot
	if err == nil {
		var o OtherSlot
		var confirmed string
		_, err = pgx.ForEachRow(rows, []any{&o.Slot, &o.Tables, &o.Prefix, &o.Active, &confirmed, &o.Destination, &o.Lost}, func() error {
			var err error
			if o.Confirmed, err = parseLSN(confirmed); err != nil {
				return err
			}
			out = append(out, o)
			o = OtherSlot{}
			return nil
		})
	}
	// (Reported by Query or, in pgx's exec and simple protocol modes, only
	// as the rows are read.)
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42P01" { // undefined_table
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("replication: read the other slots of the state table %s: %w", table, err)
	}
	return out, nil
}

// readOtherSlots sets st.OtherSlots from cfg's state table.
func readOtherSlots(ctx context.Context, conn *pgx.Conn, cfg Config, st *Start) (err error) {
	if cfg.StateTable == "" {
		return nil
	}
	tables := make([]string, 0, len(st.Catalog.Tables))
	for _, t := range st.Catalog.Tables {
		tables = append(tables, t.Name)
	}
	st.OtherSlots, err = OtherSlots(ctx, conn, cfg.StateTable, cfg.Slot, tables)
	return err
}

// StartedAt is the position this relay's slot started from, as far as
// st tells: where pgoutbox created it (this start, or as its state row
// records), else where it was first seen without a state row; 0 when
// nothing tells (a slot found already there, by an earlier start whose
// session streamed). A slot found already there whose state row records
// no session yet has not moved since pgoutbox first saw it (or the fence
// says so): its position. For a slot not made yet (CheckStart), the end
// of WAL, where it would start.
func (st *Start) StartedAt() LSN {
	switch {
	case st.Slot.Name == "":
		return st.Identity.WALEnd
	case st.Created:
		return st.Slot.ConfirmedFlushLSN
	case st.HadState && st.State.SlotCreatedLSN != 0:
		return st.State.SlotCreatedLSN
	case !st.HadState || st.State.Instance == "":
		// (A start refused for it wrote the row, with no session: a
		// review found the refusal gone at the next start.)
		return st.Slot.ConfirmedFlushLSN
	}
	return 0
}

// unknownIdleSlots names the other logical slots of this database that no
// row of the state table records (a Debezium connector's, another tool's),
// idle and confirmed below at: if one was a relay's of these outbox
// tables, the events it holds from its position on are not in a slot
// made at at. (The ones the state table records are judged by their
// rows: OtherSlots. Left out: PostgreSQL's own, pg_*, and initial
// snapshots' anchors, <slot>_snapshot_<hash>.)
func unknownIdleSlots(ctx context.Context, conn *pgx.Conn, table, slot string, at LSN) ([]string, error) {
	q, err := qualifiedIdent(table)
	if err != nil {
		return nil, err
	}
	rows, err := conn.Query(ctx, `SELECT s.slot_name || ' (plugin ' || s.plugin || ', idle at ' || s.confirmed_flush_lsn::text || ')'
		FROM pg_catalog.pg_replication_slots s
		WHERE s.database = pg_catalog.current_database() AND s.slot_type = 'logical' AND s.slot_name <> $1 AND NOT s.temporary AND NOT s.active
			AND s.confirmed_flush_lsn < $2::pg_lsn AND s.slot_name NOT LIKE 'pg\_%' AND s.slot_name !~ '_snapshot_[0-9a-f]{8}$'
			AND NOT EXISTS (SELECT FROM `+q+` t WHERE t.slot_name = s.slot_name)
		ORDER BY s.slot_name`, slot, at.String())
	if err != nil {
		return nil, fmt.Errorf("replication: read the other slots of the database: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}
