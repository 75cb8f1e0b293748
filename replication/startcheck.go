package replication

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// StateChanges lists what the state row's history says changed in the
// publication and the outbox tables since pgoutbox last recorded them
// (a membership change, a table dropped and made again, a partition joined
// with older rows), as Prepare judges them; unknown lists what could not be
// looked at (Prepare holds cleanup for each). It reads only.
func StateChanges(ctx context.Context, conn *pgx.Conn, cfg Config, st *Start) (changes, unknown []string, err error) {
	changes = st.State.ChangesSince(&st.Catalog, cfg)
	if cfg.RecreateVanishedSlot {
		return changes, nil, nil
	}
	joined, unknown, err := JoinedWithOlderRows(ctx, conn, cfg, &st.State, &st.Catalog)
	if err != nil {
		return nil, nil, err
	}
	changes = append(changes, joined...)
	if st.State.PublicationOID != 0 {
		// Partitions attached since the last session started (its start,
		// or the session, looked at those before); with no record of them
		// (an earlier version's), those that were tables before they were
		// attached.
		attached, more, _, err := AttachedWithOlderRows(ctx, conn, &st.Catalog, st.State.Attached, partitionScanTimeout)
		if err != nil {
			return nil, nil, err
		}
		changes = append(changes, attached...)
		for _, u := range more {
			unknown = append(unknown, u.Why)
		}
	}
	return changes, unknown, nil
}

// StateRefusal is Prepare's refusal of a start for the state row's
// history: an outbox table recorded but no longer configured
// (ErrCatalogUnusable), or changes (StateChanges) that may have kept events
// out of the stream (ErrCatalogChanged). Nil when there is none.
func StateRefusal(st *Start, cfg Config, changes []string) error {
	if cfg.RecreateVanishedSlot {
		return nil
	}
	if gone := st.State.Unconfigured(&st.Catalog); len(gone) > 0 {
		return &CatalogError{Publication: cfg.Publication, Problems: gone, Err: ErrCatalogUnusable}
	}
	if len(changes) > 0 {
		changes = append(changes[:len(changes):len(changes)], "find and relay what is missing (rows still in the outbox table can be read from it), then run `pgoutbox migrate --accept-catalog` to record the new one")
		return &CatalogError{Publication: cfg.Publication, Problems: changes, Err: ErrCatalogChanged}
	}
	return nil
}

// CheckStart reads what Prepare reads before a session (the catalog, the
// server's identity, the state row, the slot) and returns the refusals
// Prepare would return for the state row's history (StateRefusal, a
// vanished slot), without creating or recording anything: what pgoutbox
// validate judges. unknown lists what could not be looked at. A missing
// state table or slot is no refusal here (run creates them).
func CheckStart(ctx context.Context, conn *pgx.Conn, cfg Config) (st Start, unknown []string, err error) {
	if st.Catalog, err = ReadCatalog(ctx, conn, cfg); err != nil {
		return st, nil, err
	}
	if st.Identity, err = ReadServerIdentity(ctx, conn); err != nil {
		return st, nil, err
	}
	if cfg.StateTable != "" {
		exists, err := StateTableExists(ctx, conn, cfg.StateTable)
		if err != nil {
			return st, nil, err
		}
		if exists {
			if st.State, st.HadState, err = ReadState(ctx, conn, cfg.StateTable, cfg.Slot); err != nil {
				return st, nil, err
			}
		}
		if st.HadState {
			changes, more, err := StateChanges(ctx, conn, cfg, &st)
			if err != nil {
				return st, nil, err
			}
			unknown = more
			if err := StateRefusal(&st, cfg, changes); err != nil {
				return st, unknown, err
			}
			if st.TimelineChanged() {
				if st.Fork, st.ForkKnown, err = TimelineFork(ctx, cfg, st.State.Timeline, st.Identity.Timeline); err != nil {
					st.Fork, st.ForkKnown = 0, false
				}
			}
		}
	}
	st.Slot, err = ReadSlot(ctx, conn, cfg.Slot)
	switch {
	case errors.Is(err, ErrSlotMissing) && st.HadState && !cfg.RecreateVanishedSlot:
		return st, unknown, &VanishedError{Slot: cfg.Slot, State: st.State}
	case errors.Is(err, ErrSlotMissing):
		// Made at the start, at the end of WAL (Start.StartedAt).
		st.Slot = SlotState{}
	case err != nil:
		return st, unknown, err
	}
	if st.Identity.WALEnd, err = ReadWALEnd(ctx, conn); err != nil {
		return st, unknown, err
	}
	if err := readOtherSlots(ctx, conn, cfg, &st); err != nil {
		return st, unknown, err
	}
	return st, unknown, nil
}

// StateTablePrivileges lists the privileges the current role lacks for
// pgoutbox run to keep the slot's history in table: SELECT, INSERT and
// UPDATE on it (it reads the row, writes it at the first start, and
// updates it at every session), or, when the table does not exist yet,
// USAGE and CREATE on its schema (run creates it). exists says whether the
// table exists.
func StateTablePrivileges(ctx context.Context, conn *pgx.Conn, table string) (missing []string, exists bool, err error) {
	schema, _, _ := splitTable(table)
	var sel, ins, upd, usage, create bool
	err = conn.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL,
		coalesce(has_table_privilege(to_regclass($1), 'SELECT'), false),
		coalesce(has_table_privilege(to_regclass($1), 'INSERT'), false),
		coalesce(has_table_privilege(to_regclass($1), 'UPDATE'), false),
		coalesce((SELECT has_schema_privilege(n.oid, 'USAGE') FROM pg_namespace n WHERE n.nspname = $2), false),
		coalesce((SELECT has_schema_privilege(n.oid, 'CREATE') FROM pg_namespace n WHERE n.nspname = $2), false)`,
		quoteTable(table), schema).Scan(&exists, &sel, &ins, &upd, &usage, &create)
	if err != nil {
		return nil, false, fmt.Errorf("replication: privileges on state table %s: %w", table, err)
	}
	add := func(ok bool, priv string) {
		if !ok {
			missing = append(missing, priv)
		}
	}
	if !exists {
		add(usage, "USAGE on schema "+quoteIdent(schema))
		add(create, "CREATE on schema "+quoteIdent(schema))
		return missing, false, nil
	}
	add(usage, "USAGE on schema "+quoteIdent(schema))
	add(sel, "SELECT")
	add(ins, "INSERT")
	add(upd, "UPDATE")
	return missing, true, nil
}

// StateTablePublished says whether publication carries table (by name, as
// pg_publication_tables lists it, which a FOR TABLES IN SCHEMA publication
// does for every table of the schema), and table's OID.
func StateTablePublished(ctx context.Context, conn *pgx.Conn, publication, table string) (published bool, oid uint32, err error) {
	schema, name, _ := splitTable(table)
	err = conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication_tables WHERE pubname = $1 AND schemaname = $2 AND tablename = $3),
		coalesce(to_regclass($4)::oid, 0::oid)`, publication, schema, name, quoteTable(table)).Scan(&published, &oid)
	if err != nil {
		return false, 0, fmt.Errorf("replication: is state table %s in publication %q: %w", table, publication, err)
	}
	return published, oid, nil
}
