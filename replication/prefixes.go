package replication

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// RelayedPrefixes reads, from the state table, the messages.prefix each
// other existing slot of this database relays with, and by prefix the
// slots' names. Every slot decodes every logical decoding message, so a
// relay sees the messages of the others: those are another relay's, and
// one with a prefix no relay records may be an event no one relays.
func RelayedPrefixes(ctx context.Context, conn *pgx.Conn, table, slot string) (map[string]string, error) {
	q, err := qualifiedIdent(table)
	if err != nil {
		return nil, err
	}
	rows, err := conn.Query(ctx, `SELECT t.messages_prefix, string_agg(t.slot_name, ', ' ORDER BY t.slot_name) FROM `+q+` t
		JOIN pg_replication_slots s ON s.slot_name = t.slot_name AND s.database = current_database()
		WHERE t.slot_name <> $1 AND coalesce(t.messages_prefix, '') <> ''
		GROUP BY 1`, slot)
	if err != nil {
		return nil, fmt.Errorf("replication: read the state table %s: %w", table, err)
	}
	out := map[string]string{}
	var prefix, slots string
	if _, err := pgx.ForEachRow(rows, []any{&prefix, &slots}, func() error {
		out[prefix] = slots
		return nil
	}); err != nil {
		return nil, fmt.Errorf("replication: read the state table %s: %w", table, err)
	}
	return out, nil
}
