package replication

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Pending is what a slot has not relayed (PeekPending).
type Pending struct {
	// Inserts holds the text of the id column of every row inserted into
	// the table or any of its partitions.
	Inserts []string
	// Messages counts the logical decoding messages with the prefix asked
	// for (transactional or not); FirstMessage is the LSN of the first.
	Messages     int
	FirstMessage LSN
	// OtherMessages counts the messages with any other prefix, by prefix:
	// a relay with another messages.prefix relayed those.
	OtherMessages map[string]int
	// Others counts, by relation OID, the inserts into other tables the
	// publication carries (a partition's own, when the publication reports
	// partitions under their names).
	Others map[uint32]OtherInserts
}

// OtherInserts are the pending inserts into one other relation.
type OtherInserts struct {
	Table   string
	Inserts int
}

// OtherPrefixes lists messages (Pending.OtherMessages) as "prefix (n)", by
// prefix.
func OtherPrefixes(messages map[string]int) string {
	var names []string
	for p, n := range messages {
		names = append(names, fmt.Sprintf("%q (%d)", p, n))
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

// OtherTables lists others as "name (n inserts)", by name.
func OtherTables(others map[uint32]OtherInserts) string {
	var names []string
	for _, o := range others {
		names = append(names, fmt.Sprintf("%s (%d inserts)", o.Table, o.Inserts))
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

// PeekPending reads the slot's pending changes up to upto without
// consuming them (pg_logical_slot_peek_binary_changes, pgoutput protocol
// v1 with the publication, messages on): every row inserted into table
// (schema.table), or into any of its partitions (a publication without
// publish_via_partition_root reports them under their own names), the
// messages with prefix (none when it is empty) and those with others, and the inserts
// into other tables, each by a transaction committed after the slot's
// confirmed position and at or before upto: what the slot has not
// relayed. q runs the query: a connection, or a transaction whose snapshot
// the caller wants it in.
//
// The peek decodes only WAL that is flushed: a transaction committed with
// synchronous_commit=off is visible before its commit record is, so wait
// for the flush position to reach upto first (WaitFlushed).
//
// The slot must not be in use: a walsender holding it makes the peek fail.
func PeekPending(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, slot, publication, table, column, prefix string, upto LSN) (Pending, error) {
	var p Pending
	if err := ValidateSlotName(slot); err != nil {
		return p, err
	}
	// The table and its partitions at every level, by OID: the WAL names
	// each row's own relation.
	ids, err := TableTree(ctx, q, table)
	if err != nil {
		return p, err
	}
	if len(ids) == 0 {
		return p, fmt.Errorf("replication: peek at slot %q: table %s does not exist", slot, table)
	}
	rows, err := q.Query(ctx, "SELECT data FROM pg_logical_slot_peek_binary_changes($1, $2::pg_lsn, NULL, 'proto_version', '1', 'publication_names', $3, 'messages', 'true')",
		slot, upto.String(), quoteIdent(publication))
	if err != nil {
		return p, fmt.Errorf("replication: peek at slot %q: %w", slot, err)
	}
	defer rows.Close()
	dec := NewDecoder()
	at := -1
	var rel *Relation
	for rows.Next() {
		var data []byte
		if err := rows.Scan(&data); err != nil {
			return p, fmt.Errorf("replication: peek at slot %q: %w", slot, err)
		}
		v, err := dec.Decode(data)
		if err != nil {
			return p, fmt.Errorf("replication: peek at slot %q: %w", slot, err)
		}
		switch m := v.(type) {
		case *Message:
			if prefix == "" || m.Prefix != prefix {
				if p.OtherMessages == nil {
					p.OtherMessages = map[string]int{}
				}
				p.OtherMessages[m.Prefix]++
				continue
			}
			if p.Messages == 0 {
				p.FirstMessage = m.LSN
			}
			p.Messages++
			continue
		case *Change:
			if m.Op != OpInsert {
				continue
			}
			if !slices.Contains(ids, m.Rel.ID) {
				if p.Others == nil {
					p.Others = map[uint32]OtherInserts{}
				}
				o := p.Others[m.Rel.ID]
				o.Table = m.Rel.Table
				o.Inserts++
				p.Others[m.Rel.ID] = o
				continue
			}
			if m.Rel != rel {
				rel, at = m.Rel, -1
				for i, n := range rel.Columns {
					if n == column {
						at = i
					}
				}
				if at < 0 {
					return p, fmt.Errorf("replication: peek at slot %q: table %s has no column %q", slot, m.Rel.Table, column)
				}
			}
			if at < len(m.Values) && m.Values[at] != nil {
				p.Inserts = append(p.Inserts, string(m.Values[at]))
			}
		}
	}
	if err := rows.Err(); err != nil {
		return p, fmt.Errorf("replication: peek at slot %q: %w", slot, err)
	}
	return p, nil
}

// TableTree returns the OIDs of table (schema.table) and of its partitions
// at every level; none when it does not exist. q runs the query.
func TableTree(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, table string) ([]uint32, error) {
	// (pg_partition_tree has no rows for a table that is not partitioned.)
	rows, err := q.Query(ctx, `SELECT to_regclass($1)::oid WHERE to_regclass($1) IS NOT NULL
		UNION SELECT relid::oid FROM pg_partition_tree(to_regclass($1))`, quoteTable(table))
	if err != nil {
		return nil, fmt.Errorf("replication: partitions of %s: %w", table, err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[uint32])
	if err != nil {
		return nil, fmt.Errorf("replication: partitions of %s: %w", table, err)
	}
	return ids, nil
}

// WaitFlushed waits, up to wait, until the server has flushed its WAL up
// to lsn (pg_current_wal_flush_lsn), calling waiting (when not nil) once
// if it has to wait. q may be a transaction: the function reads the
// server's state, not the snapshot's.
func WaitFlushed(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, lsn LSN, wait time.Duration, waiting func(flushed LSN)) error {
	deadline := time.Now().Add(wait)
	pause := 2 * time.Millisecond
	for {
		var flushed int64
		if err := q.QueryRow(ctx, "SELECT (pg_current_wal_flush_lsn() - '0/0'::pg_lsn)::bigint").Scan(&flushed); err != nil {
			return fmt.Errorf("replication: read the WAL flush position: %w", err)
		}
		if LSN(flushed) >= lsn {
			return nil
		}
		if waiting != nil {
			waiting(LSN(flushed))
			waiting = nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("replication: the server's WAL is flushed up to %s only, %s after it was written up to %s (commits with synchronous_commit=off wait for the WAL writer, every wal_writer_delay)", LSN(flushed), wait, lsn)
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		pause = min(2*pause, 100*time.Millisecond)
	}
}

// CarriedAllAlong says whether publication has carried table (its own
// row, its schema's, or FOR ALL TABLES), with its present options, since
// before anything slot may still decode: the rows of pg_publication and of
// its membership were written by transactions that ended before the
// slot's catalog_xmin, so every catalog snapshot its pending changes are
// decoded with sees them. A publication that gained the table later shows
// none of the inserts written before that (decoding judges each change by
// the publication as it was then), though the catalog says it carries
// the table now. why names what is younger when it has not.
func CarriedAllAlong(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, slot, publication, table string) (ok bool, why string, err error) {
	var hasXmin, pubOld, allTables bool
	var relOld, nsOld *bool
	// A negative age is a transaction more than 2^31 old (a frozen row).
	err = q.QueryRow(ctx, `SELECT s.catalog_xmin IS NOT NULL, coalesce(age(p.xmin) > age(s.catalog_xmin) OR age(p.xmin) < 0, false), p.puballtables,
			(SELECT age(r.xmin) > age(s.catalog_xmin) OR age(r.xmin) < 0 FROM pg_publication_rel r WHERE r.prpubid = p.oid AND r.prrelid = c.oid),
			(SELECT age(n.xmin) > age(s.catalog_xmin) OR age(n.xmin) < 0 FROM pg_publication_namespace n WHERE n.pnpubid = p.oid AND n.pnnspid = c.relnamespace)
		FROM pg_replication_slots s, pg_publication p, pg_class c
		WHERE s.slot_name = $1 AND p.pubname = $2 AND c.oid = to_regclass($3)`,
		slot, publication, quoteTable(table)).Scan(&hasXmin, &pubOld, &allTables, &relOld, &nsOld)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, fmt.Sprintf("slot %q, publication %q or table %s not found", slot, publication, table), nil
	}
	if err == nil && !hasXmin {
		return false, fmt.Sprintf("slot %q has no catalog_xmin (it was never used for decoding)", slot), nil
	}
	if err != nil {
		return false, "", fmt.Errorf("replication: when publication %q took in %s: %w", publication, table, err)
	}
	switch {
	case !pubOld:
		return false, fmt.Sprintf("publication %q was created or altered after the oldest change slot %q may still decode", publication, slot), nil
	case allTables, relOld != nil && *relOld, nsOld != nil && *nsOld:
		return true, "", nil
	}
	return false, fmt.Sprintf("publication %q took in %s after the oldest change slot %q may still decode", publication, table, slot), nil
}
