package poll

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/migrations"
)

// Cleanup deletes old rows in small batches, each its own short
// transaction that skips rows another transaction holds, with a pause
// between batches: it never holds a lock for longer than one batch takes,
// and writers, which only insert, never wait for it.
type Cleanup struct {
	// BatchSize bounds the rows one transaction deletes.
	BatchSize int
	// Pause is the wait between two batches.
	Pause time.Duration
	// MaxBatches bounds one run; the next run goes on where it stopped.
	MaxBatches int
}

// DefaultCleanup is what the running relay and pgoutbox cleanup use.
func DefaultCleanup(batch int) Cleanup {
	return Cleanup{BatchSize: batch, Pause: 10 * time.Millisecond, MaxBatches: 10_000}
}

// Published deletes the rows of t published more than olderThan ago
// (published_at < now() - olderThan): rows Kafka acknowledged. Unpublished
// rows are never touched. It returns how many rows it deleted.
func (c Cleanup) Published(ctx context.Context, conn *pgx.Conn, t *Table, olderThan time.Duration) (int64, error) {
	var total int64
	for i := 0; i < c.MaxBatches; i++ {
		n, err := c.publishedBatch(ctx, conn, t, olderThan)
		total += n
		if err != nil {
			return total, fmt.Errorf("poll: delete published rows of %s: %w", t.Name, err)
		}
		if n < int64(c.BatchSize) {
			return total, nil
		}
		if err := c.pause(ctx); err != nil {
			return total, err
		}
	}
	return total, nil
}

// publishedBatch deletes one batch in one transaction: it locks the
// oldest published rows (skipping any another transaction holds) and
// deletes them where they lie, relation by relation (a partitioned
// table's partitions can hold rows at the same position).
func (c Cleanup) publishedBatch(ctx context.Context, conn *pgx.Conn, t *Table, olderThan time.Duration) (int64, error) {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
	rows, err := tx.Query(ctx, "SELECT tableoid::regclass::text, ctid::text FROM "+t.quoted+
		" WHERE "+ColumnPublishedAt+" < now() - $1::bigint * interval '1 microsecond' ORDER BY "+ColumnPublishedAt+
		" LIMIT $2 FOR UPDATE SKIP LOCKED", olderThan.Microseconds(), c.BatchSize)
	if err != nil {
		return 0, err
	}
	byRel := map[string][]string{}
	var rel, ctid string
	_, err = pgx.ForEachRow(rows, []any{&rel, &ctid}, func() error {
		byRel[rel] = append(byRel[rel], ctid)
		return nil
	})
	if err != nil {
		return 0, err
	}
	var n int64
	for rel, ctids := range byRel {
		tag, err := tx.Exec(ctx, "DELETE FROM "+rel+" WHERE ctid = ANY($1::text[]::tid[])", ctids)
		if err != nil {
			return 0, err
		}
		n += tag.RowsAffected()
	}
	return n, tx.Commit(ctx)
}

func (c Cleanup) pause(ctx context.Context) error {
	t := time.NewTimer(c.Pause)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// The WAL source's table has no published_at: the relay never writes to
// it. A row there has been relayed once the slot's confirmed position is
// past its transaction's commit, and a row does not say where its commit
// lies. A mark does: a transaction id X that every running transaction's
// id is at least (pg_snapshot_xmin of the current snapshot), and the WAL
// insert position L read after it. Every transaction with an id below X
// had ended by then, so its commit record lies before L; once the slot is
// confirmed at or past L, every row whose xmin is below X has been relayed
// (or belonged to a transaction that rolled back and is invisible). Each
// cleanup run takes a new mark, and deletes with the newest mark that is
// at least the retention old and that the slot has passed: so a row goes
// at the earliest one retention after it was relayed, and never before.

// DefaultMarksTable keeps the marks of the WAL source's cleanup.
const DefaultMarksTable = "public.pgoutbox_cleanup_marks"

// MarksTableDDL creates the marks table.
func MarksTableDDL(marks string) (string, error) {
	q, err := quoteName(marks)
	if err != nil {
		return "", err
	}
	return "CREATE TABLE IF NOT EXISTS " + q + ` (
    table_name    text        NOT NULL,
    slot_name     text        NOT NULL,
    taken_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    snapshot_xmin xid8        NOT NULL,
    wal_lsn       pg_lsn      NOT NULL,
    PRIMARY KEY (table_name, slot_name, taken_at)
)`, nil
}

func quoteName(name string) (string, error) {
	t, err := NewTable(name, "", "")
	if err != nil {
		return "", err
	}
	return t.quoted, nil
}

// Mark is a point before which every committed transaction of a WAL-source
// table was relayed once the slot passes WALLSN.
type Mark struct {
	TakenAt      time.Time
	SnapshotXmin uint64
	WALLSN       string
}

// TakeMark records a new mark of table for slot in marks.
func TakeMark(ctx context.Context, conn *pgx.Conn, marks, table, slot string) (Mark, error) {
	q, err := quoteName(marks)
	if err != nil {
		return Mark{}, err
	}
	var m Mark
	// Two statements, in this order: the LSN must be read after the
	// snapshot whose xmin it covers.
	if err := conn.QueryRow(ctx, "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint").Scan(&m.SnapshotXmin); err != nil {
		return m, fmt.Errorf("poll: read the oldest running transaction: %w", err)
	}
	err = conn.QueryRow(ctx, "INSERT INTO "+q+" (table_name, slot_name, snapshot_xmin, wal_lsn) VALUES ($1, $2, $3::text::xid8, pg_current_wal_insert_lsn()) RETURNING taken_at, wal_lsn::text",
		table, slot, fmt.Sprint(m.SnapshotXmin)).Scan(&m.TakenAt, &m.WALLSN)
	if err != nil {
		return m, fmt.Errorf("poll: record a cleanup mark in %s: %w", marks, err)
	}
	return m, nil
}

// UsableMark returns the newest mark of table and slot taken at least
// olderThan ago whose WAL position the slot's confirmed position
// (confirmed, as PostgreSQL prints an LSN) has reached; ok is false when
// there is none yet. Older marks are deleted: they are not needed again.
func UsableMark(ctx context.Context, conn *pgx.Conn, marks, table, slot, confirmed string, olderThan time.Duration) (m Mark, ok bool, err error) {
	q, err := quoteName(marks)
	if err != nil {
		return m, false, err
	}
	err = conn.QueryRow(ctx, "SELECT taken_at, snapshot_xmin::text::bigint, wal_lsn::text FROM "+q+
		" WHERE table_name = $1 AND slot_name = $2 AND taken_at <= now() - $3::bigint * interval '1 microsecond' AND wal_lsn <= $4::pg_lsn"+
		" ORDER BY taken_at DESC LIMIT 1", table, slot, olderThan.Microseconds(), confirmed).Scan(&m.TakenAt, &m.SnapshotXmin, &m.WALLSN)
	if err == pgx.ErrNoRows {
		return m, false, nil
	}
	if err != nil {
		return m, false, fmt.Errorf("poll: read the cleanup marks in %s: %w", marks, err)
	}
	if _, err := conn.Exec(ctx, "DELETE FROM "+q+" WHERE table_name = $1 AND slot_name = $2 AND taken_at < $3", table, slot, m.TakenAt); err != nil {
		return m, true, fmt.Errorf("poll: delete old cleanup marks in %s: %w", marks, err)
	}
	return m, true, nil
}

// xid64 is SQL for the 64-bit transaction id of a 32-bit one (xid32, as
// bigint), given the next id to be assigned (next, 64-bit): the latest id
// with those low 32 bits at or below next. A row that is not frozen is
// younger than 2^31 transactions, so that is its own id; an older one may
// come out younger than it is, which keeps it, never the reverse.
func xid64(next, xid32 string) string {
	return "(" + next + " - ((" + next + " % 4294967296) - " + xid32 + " + 4294967296) % 4294967296)"
}

// walBlocks is how many heap pages one batch of Relayed reads.
const walBlocks = 32

// Relayed deletes the rows of table whose transaction ended before mark
// (a mark UsableMark returned): it walks each of the table's leaf
// relations by ranges of pages, so that every batch reads a few pages
// only, deleting in each range the rows whose xmin precedes the mark's,
// compared as 64-bit transaction ids (32-bit ages compare wrongly once the
// mark is 2^31 transactions old: every row then looked older than it).
func (c Cleanup) Relayed(ctx context.Context, conn *pgx.Conn, table string, mark Mark) (int64, error) {
	q, err := quoteName(table)
	if err != nil {
		return 0, err
	}
	// The leaf partitions of a partitioned table, or the table itself.
	rows, err := conn.Query(ctx, `SELECT r::regclass::text, pg_relation_size(r) / current_setting('block_size')::bigint FROM (
		SELECT relid AS r FROM pg_partition_tree($1::regclass) WHERE isleaf
		UNION SELECT $1::regclass WHERE (SELECT relkind FROM pg_class WHERE oid = $1::regclass) <> 'p') leaves`, q)
	if err != nil {
		return 0, fmt.Errorf("poll: list the relations of %s: %w", table, err)
	}
	type leaf struct {
		name   string
		blocks int64
	}
	leaves, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (leaf, error) {
		var l leaf
		return l, r.Scan(&l.name, &l.blocks)
	})
	if err != nil {
		return 0, fmt.Errorf("poll: list the relations of %s: %w", table, err)
	}
	// Every row's id is below the next one to be assigned; a mark that is
	// not was taken on another cluster (its marks table copied here), and
	// would take every row for relayed.
	var next uint64
	if err := conn.QueryRow(ctx, "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint").Scan(&next); err != nil {
		return 0, fmt.Errorf("poll: read the next transaction id: %w", err)
	}
	if mark.SnapshotXmin > next {
		return 0, fmt.Errorf("poll: the cleanup mark's transaction id %d is after %d, the next one this server assigns: the mark was taken on another cluster (its table copied or restored here); delete the marks of slot and table and let cleanup take new ones", mark.SnapshotXmin, next)
	}
	var total int64
	batches := 0
	for _, l := range leaves {
		sql := "DELETE FROM " + l.name + " WHERE ctid = ANY(ARRAY(SELECT t.ctid FROM " + l.name +
			" t, (SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS x) n" +
			" WHERE t.ctid >= format('(%s,0)', $1::bigint)::tid AND t.ctid < format('(%s,0)', $2::bigint)::tid" +
			" AND " + xid64("n.x", "t.xmin::text::bigint") + " < $3::bigint FOR UPDATE OF t SKIP LOCKED))"
		for from := int64(0); from < l.blocks && batches < c.MaxBatches; from += walBlocks {
			n, err := relayedBatch(ctx, conn, sql, from, from+walBlocks, mark)
			if err != nil {
				return total, fmt.Errorf("poll: delete relayed rows of %s: %w", l.name, err)
			}
			total += n
			batches++
			if n == 0 {
				continue // only read: nothing held
			}
			if err := c.pause(ctx); err != nil {
				return total, err
			}
		}
	}
	return total, nil
}

// relayedBatch runs one batch of Relayed, the pages [from, to), in a
// transaction of its own. The rows were relayed from the WAL, so the
// delete goes past the poll source's trigger that keeps unpublished rows
// (a table on its way to the poll source has it), but only in this
// transaction (set_config's is_local): set for the session, the setting
// outlived cleanup, and through a pooler in transaction mode the server
// session went on to an application, whose deletes of rows not yet
// published then went through and lost their events.
func relayedBatch(ctx context.Context, conn *pgx.Conn, sql string, from, to int64, mark Mark) (int64, error) {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
	if _, err := tx.Exec(ctx, "SELECT set_config($1, 'on', true)", migrations.DeleteUnpublished); err != nil {
		return 0, err
	}
	tag, err := tx.Exec(ctx, sql, from, to, int64(mark.SnapshotXmin))
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), tx.Commit(ctx)
}
