package replication

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
)

// PeekInserted reads the slot's pending changes up to upto without
// consuming them (pg_logical_slot_peek_binary_changes, pgoutput protocol
// v1 with the publication) and returns the text of column for every row
// inserted into table (schema.table), or into any of its partitions (a
// publication without publish_via_partition_root reports them under their
// own names), by a transaction committed after the slot's confirmed
// position and at or before upto: the inserts the slot has not relayed. q
// runs the query: a connection, or a transaction whose snapshot the caller
// wants it in.
//
// The slot must not be in use: a walsender holding it makes the peek fail.
func PeekInserted(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, slot, publication, table, column string, upto LSN) ([]string, error) {
	if err := ValidateSlotName(slot); err != nil {
		return nil, err
	}
	// The table and its partitions at every level, by OID: the WAL names
	// each row's own relation.
	// (pg_partition_tree has no rows for a table that is not partitioned.)
	tr, err := q.Query(ctx, `SELECT to_regclass($1)::oid WHERE to_regclass($1) IS NOT NULL
		UNION SELECT relid::oid FROM pg_partition_tree(to_regclass($1))`, quoteTable(table))
	if err != nil {
		return nil, fmt.Errorf("replication: partitions of %s: %w", table, err)
	}
	ids, err := pgx.CollectRows(tr, pgx.RowTo[uint32])
	if err != nil {
		return nil, fmt.Errorf("replication: partitions of %s: %w", table, err)
	}
	if len(ids) == 0 {
		return nil, fmt.Errorf("replication: peek at slot %q: table %s does not exist", slot, table)
	}
	rows, err := q.Query(ctx, "SELECT data FROM pg_logical_slot_peek_binary_changes($1, $2::pg_lsn, NULL, 'proto_version', '1', 'publication_names', $3)",
		slot, upto.String(), quoteIdent(publication))
	if err != nil {
		return nil, fmt.Errorf("replication: peek at slot %q: %w", slot, err)
	}
	defer rows.Close()
	dec := NewDecoder()
	var out []string
	at := -1
	var rel *Relation
	for rows.Next() {
		var data []byte
		if err := rows.Scan(&data); err != nil {
			return nil, fmt.Errorf("replication: peek at slot %q: %w", slot, err)
		}
		v, err := dec.Decode(data)
		if err != nil {
			return nil, fmt.Errorf("replication: peek at slot %q: %w", slot, err)
		}
		c, ok := v.(*Change)
		if !ok || c.Op != OpInsert || !slices.Contains(ids, c.Rel.ID) {
			continue
		}
		if c.Rel != rel {
			rel, at = c.Rel, -1
			for i, n := range rel.Columns {
				if n == column {
					at = i
				}
			}
			if at < 0 {
				return nil, fmt.Errorf("replication: peek at slot %q: table %s has no column %q", slot, c.Rel.Table, column)
			}
		}
		if at < len(c.Values) && c.Values[at] != nil {
			out = append(out, string(c.Values[at]))
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("replication: peek at slot %q: %w", slot, err)
	}
	return out, nil
}
