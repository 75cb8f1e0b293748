package poll

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// MarkRelayed marks as published, in tx, every unpublished row of t that
// tx sees, except those whose id column's text is in notRelayed (its
// output function's text, as pgoutput sends it: a char(n) keeps its
// padding, an inet has no /32, where a cast to text would differ), and
// those without an id (which stay unpublished, as before): the
// handover from a WAL-source relay, whose slot relayed every row committed
// before its confirmed position, and whose pending changes name the rows it
// did not (replication.PeekPending, read up to a position past every
// commit tx sees). Run it in a repeatable-read transaction that read that
// position first: rows committed later are invisible to it and stay
// unpublished.
func MarkRelayed(ctx context.Context, tx pgx.Tx, t *Table, notRelayed []string) (int64, error) {
	if notRelayed == nil {
		notRelayed = []string{}
	}
	id := pgx.Identifier{t.IDColumn}.Sanitize()
	tag, err := tx.Exec(ctx, "UPDATE "+t.quoted+" SET "+ColumnPublishedAt+" = now() WHERE "+ColumnPublishedAt+" IS NULL AND "+
		id+" IS NOT NULL AND NOT (format('%s', "+id+") = ANY($1::text[]))", notRelayed)
	if err != nil {
		return 0, fmt.Errorf("poll: mark the rows the slot relayed in %s: %w", t.Name, err)
	}
	return tag.RowsAffected(), nil
}

// LockHandover takes the table's handover lock on conn (waiting for it, as
// long as ctx allows), so that of several instances starting at once one
// does the handover and the others find it done. Release it with
// UnlockHandover (or by closing conn).
func LockHandover(ctx context.Context, conn *pgx.Conn, table string) error {
	ns := lockKey("handover", table)
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1::int, 0)", ns); err != nil {
		return fmt.Errorf("poll: lock the handover of %s: %w", table, err)
	}
	return nil
}

// UnlockHandover releases LockHandover's lock.
func UnlockHandover(ctx context.Context, conn *pgx.Conn, table string) error {
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_unlock($1::int, 0)", lockKey("handover", table)); err != nil {
		return fmt.Errorf("poll: unlock the handover of %s: %w", table, err)
	}
	return nil
}

// TryLockCleanup takes the table's cleanup lock on conn if it is free: one
// instance cleans up at a time. Release it with UnlockCleanup.
func TryLockCleanup(ctx context.Context, conn *pgx.Conn, table string) (bool, error) {
	var ok bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1::int, 0)", lockKey("cleanup", table)).Scan(&ok); err != nil {
		return false, fmt.Errorf("poll: lock the cleanup of %s: %w", table, err)
	}
	return ok, nil
}

// UnlockCleanup releases TryLockCleanup's lock.
func UnlockCleanup(ctx context.Context, conn *pgx.Conn, table string) error {
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_unlock($1::int, 0)", lockKey("cleanup", table)); err != nil {
		return fmt.Errorf("poll: unlock the cleanup of %s: %w", table, err)
	}
	return nil
}

// Unrelayable returns those of ids (an id column's output text) that name
// no unpublished row of t now (a statement of its own, not a snapshot's):
// inserts a slot has not relayed whose rows are gone (deleted in the same
// transaction, as writers that insert and delete do), which a poll relay
// can never relay.
func Unrelayable(ctx context.Context, conn *pgx.Conn, t *Table, ids []string) ([]string, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	id := pgx.Identifier{t.IDColumn}.Sanitize()
	rows, err := conn.Query(ctx, "SELECT format('%s', "+id+") FROM "+t.quoted+" WHERE "+ColumnPublishedAt+" IS NULL AND format('%s', "+id+") = ANY($1::text[])", ids)
	if err != nil {
		return nil, fmt.Errorf("poll: find the rows of %s the slot has not relayed: %w", t.Name, err)
	}
	found, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("poll: find the rows of %s the slot has not relayed: %w", t.Name, err)
	}
	have := make(map[string]bool, len(found))
	for _, f := range found {
		have[f] = true
	}
	var gone []string
	for _, i := range ids {
		if !have[i] {
			gone = append(gone, i)
		}
	}
	return gone, nil
}
