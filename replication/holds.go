package replication

import (
	"context"
	"fmt"
	"sort"

	"github.com/jackc/pgx/v5"
)

// SharedHold is a cleanup hold on another slot's state row that covers a
// table a cleanup would delete from: that slot's gap is rows of the table
// it still has to relay from the table, so whoever deletes them (another
// slot's cleanup, the poll source's) loses them.
type SharedHold struct {
	Slot string
	Hold string
	// Why says how the row covers the table: it records the table, or
	// records no tables and its publication publishes the table, or it
	// cannot be told.
	Why string
}

// ID is the hold's ID for --release-hold.
func (h SharedHold) ID() string { return HoldID(h.Hold) }

// SharedCleanupHolds returns the cleanup holds of the rows of the state
// table other than slot's ("": every row) that cover one of tables
// (schema.table): a row covers a table it records (by name or by the
// table's OID now, or as a table it retired), and a row that records no
// tables (a placeholder of migrate --recreate-slot, or one awaiting a
// snapshot) covers the tables its publication publishes, or every table
// when that cannot be told (no publication recorded, or it is gone).
// Holds are kept per slot, and the slots of one table (regions, a poll
// source beside a slot) share its rows: a slot's position says nothing of
// another slot's gap. A row that records tables counts only while its
// slot exists: the row of a slot dropped for good (a region taken down)
// relays nothing any more, and would hold those tables' cleanup for ever.
// A row that records none (a placeholder of migrate --recreate-slot, one
// awaiting a snapshot) counts without its slot, which is being made. None
// when the state table does not exist. A role that may not read it gets a
// *pgconn.PgError 42501.
func SharedCleanupHolds(ctx context.Context, conn *pgx.Conn, stateTable, slot string, tables []string) ([]SharedHold, error) {
	q, err := qualifiedIdent(stateTable)
	if err != nil {
		return nil, err
	}
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", quoteTable(stateTable)).Scan(&exists); err != nil {
		return nil, fmt.Errorf("replication: look up state table %s: %w", stateTable, err)
	}
	if !exists {
		return nil, nil
	}
	// The outbox tables by schema.table, with their OIDs now (0: none).
	var ours []outboxTable
	for _, t := range tables {
		schema, rel, err := splitTable(t)
		if err != nil {
			return nil, err
		}
		o := outboxTable{name: schema + "." + rel}
		var oid *uint32
		if err := conn.QueryRow(ctx, "SELECT to_regclass($1)::oid", quoteTable(o.name)).Scan(&oid); err != nil {
			return nil, fmt.Errorf("replication: look up outbox table %s: %w", o.name, err)
		}
		if oid != nil {
			o.oid = *oid
		}
		ours = append(ours, o)
	}
	// Through to_jsonb: a state table of an earlier version may lack the
	// hold's column (and then holds nothing).
	type held struct {
		slot, hold, publication string
		tables                  map[string]uint32
		retired                 map[uint32]string
	}
	var all []held
	rows, err := conn.Query(ctx, `SELECT slot_name, to_jsonb(st) ->> 'cleanup_hold', table_oids, retired_oids, coalesce(publication_name, '')
		FROM `+q+` AS st WHERE slot_name <> $1 AND coalesce(to_jsonb(st) ->> 'cleanup_hold', '') <> ''
			AND (EXISTS (SELECT FROM pg_replication_slots s WHERE s.slot_name = st.slot_name AND s.database = current_database())
				OR coalesce(st.table_oids, '{}'::jsonb) = '{}'::jsonb)
		ORDER BY slot_name`, slot)
	if err != nil {
		return nil, fmt.Errorf("replication: read the cleanup holds of other slots from %s: %w", stateTable, err)
	}
	var h held
	if _, err := pgx.ForEachRow(rows, []any{&h.slot, &h.hold, &h.tables, &h.retired, &h.publication}, func() error {
		all = append(all, h)
		h = held{}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("replication: read the cleanup holds of other slots from %s: %w", stateTable, err)
	}
	var out []SharedHold
	for _, h := range all {
		why, err := covers(ctx, conn, h.publication, h.tables, h.retired, ours)
		if err != nil {
			return nil, err
		}
		if why != "" {
			out = append(out, SharedHold{Slot: h.slot, Hold: h.hold, Why: why})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Slot < out[j].Slot })
	return out, nil
}

// outboxTable is a table a cleanup deletes from, by schema.table, with its
// OID now (0 when it does not exist).
type outboxTable struct {
	name string
	oid  uint32
}

// covers says how a state row that records publication, tables and
// retired covers one of ours ("" when it covers none).
func covers(ctx context.Context, conn *pgx.Conn, publication string, tables map[string]uint32, retired map[uint32]string, ours []outboxTable) (string, error) {
	for _, o := range ours {
		for name, oid := range tables {
			if name == o.name || (o.oid != 0 && oid == o.oid) {
				return "its state row records table " + o.name, nil
			}
		}
		for _, name := range retired {
			if name == o.name {
				return "its state row records table " + o.name + " (an earlier table of that name)", nil
			}
		}
	}
	if len(tables) > 0 {
		return "", nil
	}
	// A row that records no tables yet: what its slot streams is what its
	// publication publishes.
	if publication == "" {
		return "its state row records no tables and no publication, so which tables its gap is of cannot be told", nil
	}
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)", publication).Scan(&exists); err != nil {
		return "", fmt.Errorf("replication: look up publication %s: %w", publication, err)
	}
	if !exists {
		return "its state row records no tables, and its publication " + publication + " is gone, so which tables its gap is of cannot be told", nil
	}
	for _, o := range ours {
		if o.oid == 0 {
			continue
		}
		// pg_publication_tables lists a partitioned table's partitions
		// unless the publication publishes through the root;
		// pg_partition_tree lists nothing for a table that is not
		// partitioned.
		var published bool
		if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication_tables pt
			WHERE pt.pubname = $1 AND to_regclass(format('%I.%I', pt.schemaname, pt.tablename))::oid IN (SELECT $2::oid UNION ALL SELECT relid::oid FROM pg_partition_tree($2::oid::regclass)))`,
			publication, o.oid).Scan(&published); err != nil {
			return "", fmt.Errorf("replication: look up whether publication %s publishes %s: %w", publication, o.name, err)
		}
		if published {
			return "its state row records no tables yet, and its publication " + publication + " publishes " + o.name, nil
		}
	}
	return "", nil
}
