package poll

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgoutbox/pgoutbox/migrations"
)

// Row is one claimed outbox row. Names, Types and Values are parallel, as
// a router.Row's: Values in PostgreSQL's text format (nil is NULL), Types
// the columns' type OIDs. Names is the same slice for every row of a
// claimer's table, so the router reuses its column lookup.
type Row struct {
	// Rel and CTID are where the row lies while it is locked: its table
	// (a partition's, for a partitioned table) and its position there.
	Rel      string
	CTID     string
	Seq      int64
	Attempts int
	// Written is the row's created_at in Unix microseconds (0 without the
	// column).
	Written int64
	// Key is the key column's text (nil for NULL or no key column).
	Key    []byte
	Names  []string
	Types  []uint32
	Mods   []int32 // type modifiers, as a router.Row's
	Values [][]byte
}

// Failure is a claimed row that could not be published.
type Failure struct {
	Index int    // into Batch.Rows
	Err   string // the reason, stored in last_error
	// DeadLettered: its dead-letter record was acknowledged; the row is
	// marked published (or deleted) as well as counted.
	DeadLettered bool
}

// Claimer runs the claim transactions of one table on one connection.
//
// Concurrency: a Claimer and its Batches belong to the goroutine that owns
// the connection; pgx connections are not safe for concurrent use.
type Claimer struct {
	conn      *pgx.Conn
	t         *Table
	buckets   int
	onPublish string
	names     []string
	types     []uint32
	mods      []int32
	arena     arena
	rels      map[string]string
}

// NewClaimer returns a claimer of t on conn (t checked with Check).
func NewClaimer(conn *pgx.Conn, t *Table, cfg Config) *Claimer {
	return &Claimer{conn: conn, t: t, buckets: cfg.Buckets, onPublish: cfg.OnPublish}
}

// Batch is an open claim transaction and the rows it locked, in sequence
// order. It ends with Finish or Abort.
type Batch struct {
	Rows []Row
	// Bytes is what the rows' values take.
	Bytes int
	// Held counts the rows locked but left out of Rows, behind an earlier
	// row of their key that the claim did not take (see
	// holdBehindSkipped); HeldKeys are the keys (the key column's output
	// text) whose earlier row another transaction locks; LateRows says
	// some were held behind rows committed late, which the next claim can
	// take at once.
	Held     int
	HeldKeys []string
	LateRows bool
	// Cut says the claim locked more rows than it kept: the next row
	// would have taken Bytes past the claim's maxBytes. They stay
	// unpublished, for the next claim.
	Cut bool
	c   *Claimer
	tx  pgx.Tx
}

// Claim begins a transaction and locks up to limit unpublished rows in
// sequence order, skipping rows another transaction holds: rows of the
// given buckets (nil: all), and none whose key is in blocked. It keeps
// (in Rows) the first of them whose values take no more than maxBytes,
// and at least one: a batch of large rows read whole could take more
// memory than the process has (the rest are read and let go of, one at a
// time; Cut says so). There is no
// position to resume from: every claim starts at the lowest unpublished
// sequence, so a row whose transaction committed after rows with higher
// sequences is claimed as soon as it is visible.
//
// An empty batch is still an open transaction: Finish or Abort it.
func (c *Claimer) Claim(ctx context.Context, owned []int, blocked []string, limit int, maxBytes int64) (*Batch, error) {
	tx, err := c.conn.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("poll: begin claim on %s: %w", c.t.Name, err)
	}
	b := &Batch{c: c, tx: tx}
	var where []string
	var args []any
	if owned != nil {
		args = append(args, owned)
		where = append(where, c.t.bucketExpr("t", c.buckets)+" = ANY($"+strconv.Itoa(len(args))+"::int[])")
	}
	if len(blocked) > 0 {
		args = append(args, blocked)
		where = append(where, c.t.keyOutput("t")+" <> ALL($"+strconv.Itoa(len(args))+"::text[])")
	}
	written := "0"
	if c.t.created {
		written = "(extract(epoch FROM t." + ColumnCreatedAt + ") * 1000000)::bigint"
	}
	sql := "SELECT t.tableoid::regclass::text, t.ctid::text, " + written + ", t.* FROM " + c.t.quoted + " t WHERE t." + ColumnPublishedAt + " IS NULL"
	for _, w := range where {
		sql += " AND " + w
	}
	// NO KEY UPDATE is all that marking a row needs, and a foreign key
	// check's KEY SHARE does not stop it; deleting a row needs UPDATE.
	lock := " FOR NO KEY UPDATE OF t SKIP LOCKED"
	if c.onPublish == OnPublishDelete {
		lock = " FOR UPDATE OF t SKIP LOCKED"
	}
	sql += " ORDER BY t." + ColumnSeq + " LIMIT " + strconv.Itoa(limit) + lock
	rows, err := tx.Query(ctx, sql, append([]any{pgx.QueryResultFormats{pgx.TextFormatCode}}, args...)...)
	if err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("poll: claim rows of %s: %w", c.t.Name, err)
	}
	err = b.read(rows, maxBytes)
	rows.Close()
	if err == nil {
		err = rows.Err()
	}
	if tl := (*pgproto3.ExceededMaxBodyLenErr)(nil); errors.As(err, &tl) {
		e := &RowTooLargeError{Table: c.t.Name, Size: tl.ActualBodyLen, Limit: tl.MaxExpectedBodyLen}
		if len(b.Rows) > 0 {
			e.AfterSeq = b.Rows[len(b.Rows)-1].Seq
		}
		err = e
	}
	if err == nil {
		if betweenClaimStatements != nil {
			betweenClaimStatements()
		}
		err = b.holdBehindSkipped(ctx, where, args)
	}
	if err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("poll: claim rows of %s: %w", c.t.Name, err)
	}
	return b, nil
}

// RowTooLargeError is a claimed row longer than the claim's connection
// reads in one message (pgconn's Frontend.SetMaxBodyLen): its values were
// not read, and the connection is closed. Every claim would meet it again.
type RowTooLargeError struct {
	Table    string
	Size     int   // the row's message body, in bytes
	Limit    int   // what the connection reads
	AfterSeq int64 // the last row the claim kept before it (0: none)
}

// Its text follows the claim's own "poll: claim rows of <table>: ".
func (e *RowTooLargeError) Error() string {
	where := "among the first unpublished rows of this instance's buckets"
	if e.AfterSeq > 0 {
		where = fmt.Sprintf("among the unpublished rows of this instance's buckets after seq %d (the claim's window: poll.batch.size rows, by sequence)", e.AfterSeq)
	}
	return fmt.Sprintf("a row %s is %d bytes, more than the %d bytes read in one row", where, e.Size, e.Limit)
}

// betweenClaimStatements, when set (by a test only), runs between the
// claim's statement and holdBehindSkipped's: a commit there is one a real
// server cannot be made to land in that window on demand.
var betweenClaimStatements func()

// holdScanMax bounds the rows holdBehindSkipped reads.
const holdScanMax = 10000

// holdBehindSkipped keeps per-key order past rows the claim did not take:
// the unpublished rows with a key before the batch's last sequence that
// the batch does not hold, found with the claim's own where clauses and
// arguments. Either another transaction locks them (an application's
// SELECT ... FOR UPDATE, an UPDATE of the row), and the claim skipped
// them, or they were committed since the claim's statement began. Either
// way the batch's later rows of their keys must not go first: they are
// dropped from it, still locked and unpublished (Held counts them). The
// keys of locked rows are HeldKeys, which the relay blocks for a moment;
// rows committed late are locked here (so the statement tells them from
// locked ones) and LateRows says the next claim takes them at once. Rows
// without a key have no order to keep.
func (b *Batch) holdBehindSkipped(ctx context.Context, where []string, args []any) error {
	c := b.c
	if len(b.Rows) == 0 || !c.t.hasKey {
		return nil
	}
	seqs := make([]int64, len(b.Rows))
	for i, r := range b.Rows {
		seqs[i] = r.Seq
	}
	col := pgx.Identifier{c.t.KeyColumn}.Sanitize()
	args = append(args, b.Rows[len(b.Rows)-1].Seq, seqs)
	cond := " FROM " + c.t.quoted + " t WHERE t." + ColumnPublishedAt + " IS NULL AND t." + col + " IS NOT NULL" +
		" AND t." + ColumnSeq + " < $" + strconv.Itoa(len(args)-1) + " AND NOT (t." + ColumnSeq + " = ANY($" + strconv.Itoa(len(args)) + "::bigint[]))"
	for _, w := range where {
		cond += " AND " + w
	}
	// One statement, one snapshot: free are the rows it could lock. In
	// sequence order with a limit, as the claim, so that the plan is the
	// partial index's short range whatever the statistics say (a fresh
	// table's may suggest a scan of the whole table, on every claim).
	limit := " ORDER BY t." + ColumnSeq + " LIMIT " + strconv.Itoa(holdScanMax)
	sql := "WITH free AS (SELECT t." + ColumnSeq + cond + limit + " FOR NO KEY UPDATE OF t SKIP LOCKED) SELECT format('%s', t." + col + "), t." + ColumnSeq +
		", t." + ColumnSeq + " IN (SELECT " + ColumnSeq + " FROM free)" + cond + limit
	rows, err := b.tx.Query(ctx, sql, args...)
	if err != nil {
		return fmt.Errorf("find skipped rows: %w", err)
	}
	first := map[string]int64{}
	locked := map[string]bool{}
	found := 0
	var last int64
	for rows.Next() {
		var k string
		var seq int64
		var free bool
		if err := rows.Scan(&k, &seq, &free); err != nil {
			rows.Close()
			return fmt.Errorf("find skipped rows: %w", err)
		}
		if f, ok := first[k]; !ok || seq < f {
			first[k] = seq
		}
		if !free {
			locked[k] = true
		}
		found, last = found+1, seq
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("find skipped rows: %w", err)
	}
	if len(first) == 0 {
		return nil
	}
	kept := b.Rows[:0]
	for _, r := range b.Rows {
		f, ok := first[string(r.Key)]
		// Past holdScanMax rows not taken, the rest is not known: every
		// later row waits.
		if (ok && r.Key != nil && r.Seq > f) || (found == holdScanMax && r.Seq > last) {
			b.Held++
			if !locked[string(r.Key)] {
				b.LateRows = true
			}
			for _, v := range r.Values {
				b.Bytes -= len(v)
			}
			continue
		}
		kept = append(kept, r)
	}
	b.Rows = kept
	for k := range locked {
		b.HeldKeys = append(b.HeldKeys, k)
	}
	return nil
}

// read copies the rows' text values out of pgx's buffer.
func (b *Batch) read(rows pgx.Rows, maxBytes int64) error {
	c := b.c
	fds := rows.FieldDescriptions()
	if len(fds) < 4 {
		// The query failed before it described its result (a statement
		// prepared before the table changed, say): say why.
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		return errors.New("no columns")
	}
	cols := fds[3:] // after the relation, the ctid and created_at
	// A column may change type and keep its name (ALTER COLUMN ... TYPE):
	// the rows are routed by the types of this result.
	if len(c.names) != len(cols) || !sameColumns(c.names, c.types, c.mods, cols) {
		c.names, c.types, c.mods = make([]string, len(cols)), make([]uint32, len(cols)), make([]int32, len(cols))
		for i, f := range cols {
			c.names[i], c.types[i], c.mods[i] = f.Name, f.DataTypeOID, f.TypeModifier
		}
	}
	seqAt, attAt, keyAt := -1, -1, -1
	for i, n := range c.names {
		switch {
		case n == ColumnSeq:
			seqAt = i
		case n == ColumnAttempts:
			attAt = i
		case c.t.hasKey && n == c.t.KeyColumn:
			keyAt = i
		}
	}
	if seqAt < 0 || attAt < 0 {
		return fmt.Errorf("%w: %s has no %s or %s column", ErrLayout, c.t.Name, ColumnSeq, ColumnAttempts)
	}
	c.arena.reset()
	for rows.Next() {
		raw := rows.RawValues()
		size := 0
		for _, v := range raw[3:] {
			size += len(v)
		}
		if len(b.Rows) > 0 && int64(b.Bytes+size) > maxBytes {
			// The rows after it are in sequence order too: every key
			// keeps its order.
			b.Cut = true
			return nil
		}
		r := Row{Rel: c.relName(raw[0]), CTID: string(raw[1]), Names: c.names, Types: c.types, Mods: c.mods, Values: make([][]byte, len(cols))}
		if w, err := strconv.ParseInt(string(raw[2]), 10, 64); err == nil {
			r.Written = w
		}
		for i, v := range raw[3:] {
			if v != nil {
				r.Values[i] = c.arena.copy(v)
				b.Bytes += len(v)
			}
		}
		var err error
		if r.Seq, err = strconv.ParseInt(string(r.Values[seqAt]), 10, 64); err != nil {
			return fmt.Errorf("column %s: %w", ColumnSeq, err)
		}
		// A column made by hand may hold NULL: no attempt yet.
		if v := r.Values[attAt]; v != nil {
			if r.Attempts, err = strconv.Atoi(string(v)); err != nil {
				return fmt.Errorf("column %s: %w", ColumnAttempts, err)
			}
		}
		if keyAt >= 0 {
			r.Key = r.Values[keyAt]
		}
		b.Rows = append(b.Rows, r)
	}
	return nil
}

func sameColumns(names []string, types []uint32, mods []int32, fds []pgconn.FieldDescription) bool {
	for i, f := range fds {
		if names[i] != f.Name || types[i] != f.DataTypeOID || mods[i] != f.TypeModifier {
			return false
		}
	}
	return true
}

// maxErrorText bounds what last_error keeps of a reason, in bytes.
const maxErrorText = 2000

// errorText is reason as last_error can hold it: valid UTF-8 without NUL
// (which no text value holds), at most maxErrorText bytes and, when chars
// is not 0 (a varchar(n) column), at most chars characters. A reason the
// column refused would fail the statement that records the attempts, and
// with it the whole batch, for ever.
func errorText(reason string, chars int) string {
	reason = strings.ToValidUTF8(strings.ReplaceAll(reason, "\x00", "?"), "?")
	n := 0
	for i, r := range reason {
		if (chars > 0 && n == chars) || i+utf8.RuneLen(r) > maxErrorText {
			return reason[:i]
		}
		n++
	}
	return reason
}

// Finish marks the rows at published as published (poll.on.publish: sets
// published_at, or deletes them), counts the failures' attempts and
// records their reasons (a dead-lettered failure is marked as well), and
// commits. Rows in neither list stay as they were, unpublished. After an
// error the transaction is gone: its rows are claimed again later.
//
// Rows are found by their position (a TID scan of the relation each lies
// in: the table, or its partition), which cannot change while they are
// locked. The planner is held to that (markSetting).
func (b *Batch) Finish(ctx context.Context, published []int, failed []Failure) error {
	defer b.release()
	c, tx := b.c, b.tx
	done := map[string][]string{}
	for _, i := range published {
		r := &b.Rows[i]
		done[r.Rel] = append(done[r.Rel], r.CTID)
	}
	type attempts struct {
		ctids, reasons []string
		dead           []bool
	}
	tried := map[string]*attempts{}
	for _, f := range failed {
		r := &b.Rows[f.Index]
		if f.DeadLettered && c.onPublish == OnPublishDelete {
			done[r.Rel] = append(done[r.Rel], r.CTID)
			continue
		}
		reason := errorText(f.Err, c.t.errorChars)
		a := tried[r.Rel]
		if a == nil {
			a = &attempts{}
			tried[r.Rel] = a
		}
		a.ctids = append(a.ctids, r.CTID)
		a.reasons = append(a.reasons, reason)
		a.dead = append(a.dead, f.DeadLettered)
	}
	// The setting, the attempts and the marks go as one batch: one round
	// trip before the commit. what[i] names statement i in an error.
	if len(done)+len(tried) > 0 {
		var q pgx.Batch
		what := []string{fmt.Sprintf("mark the claim of %d rows of %s", len(b.Rows), c.t.Name)}
		q.Queue(markSetting)
		if c.onPublish == OnPublishDelete {
			// Past the trigger that keeps unpublished rows: these are.
			q.Queue(deleteSetting)
			what = append(what, "allow the delete of published rows")
		}
		// A reason cut to n characters here may still be too long for a
		// varchar(n) in a database that counts bytes (SQL_ASCII): the
		// server cuts it again by its own count.
		reason := "v.err"
		if n := c.t.errorChars; n > 0 {
			reason = "left(v.err, " + strconv.Itoa(n) + ")"
		}
		for rel, a := range tried {
			q.Queue("UPDATE "+rel+" t SET "+ColumnAttempts+" = coalesce(t."+ColumnAttempts+", 0) + 1, "+ColumnLastError+" = "+reason+", "+
				ColumnPublishedAt+" = CASE WHEN v.dead THEN now() ELSE t."+ColumnPublishedAt+" END"+
				" FROM unnest($1::text[]::tid[], $2::text[], $3::bool[]) AS v(c, err, dead) WHERE t.ctid = v.c", a.ctids, a.reasons, a.dead)
			what = append(what, "record failed attempts in "+c.t.Name)
		}
		for rel, ctids := range done {
			q.Queue(markSQL(rel, c.onPublish), ctids)
			what = append(what, fmt.Sprintf("mark %d rows of %s published", len(ctids), c.t.Name))
		}
		if err := sendAll(ctx, tx, &q, what); err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
			return err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("poll: commit the claim of %d rows of %s: %w", len(b.Rows), c.t.Name, err)
	}
	return nil
}

// sendAll sends q in one round trip and reads every statement's result,
// naming the first that failed by what.
func sendAll(ctx context.Context, tx pgx.Tx, q *pgx.Batch, what []string) error {
	br := tx.SendBatch(ctx, q)
	for i := range q.Len() {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return fmt.Errorf("poll: %s: %w", what[i], err)
		}
	}
	if err := br.Close(); err != nil {
		return fmt.Errorf("poll: %s: %w", what[0], err)
	}
	return nil
}

// markSetting keeps the mark from scanning the table: the planner charges
// a random page read per ctid, so for a batch of 1,000 rows of a table of
// a few thousand pages a scan looks cheaper, and it compares every row
// with the batch's ctids (one by one in a cached generic plan). Seen at
// 1,000 events/s with notifications: the mark grew to 3.5 s per batch and
// the relay fell behind for good. Rows are fetched by ctid instead, in this
// transaction only.
const markSetting = "SET LOCAL enable_seqscan = off"

// deleteSetting lets the relay delete the rows it published, which the
// trigger of migrations' KeepTrigger takes for unpublished ones.
const deleteSetting = "SET LOCAL " + migrations.DeleteUnpublished + " = on"

// markSQL marks the rows of rel at the ctids of $1 (text) published.
func markSQL(rel, onPublish string) string {
	if onPublish == OnPublishDelete {
		return "DELETE FROM " + rel + " WHERE ctid = ANY($1::text[]::tid[])"
	}
	return "UPDATE " + rel + " SET " + ColumnPublishedAt + " = now() WHERE ctid = ANY($1::text[]::tid[])"
}

// relName interns the relation names the claims return (one per table or
// partition), so that every row of a relation shares one string.
func (c *Claimer) relName(raw []byte) string {
	if c.rels == nil {
		c.rels = map[string]string{}
	}
	if s, ok := c.rels[string(raw)]; ok {
		return s
	}
	s := string(raw)
	c.rels[s] = s
	return s
}

// Abort rolls the claim back: every row stays unpublished and unlocked.
func (b *Batch) Abort(ctx context.Context) error {
	defer b.release()
	if err := b.tx.Rollback(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		return fmt.Errorf("poll: roll back the claim on %s: %w", b.c.t.Name, err)
	}
	return nil
}

func (b *Batch) release() { b.Rows = nil }

// arena copies values into shared chunks, so that a batch's rows need one
// allocation per chunk rather than one per value. A chunk lives as long as
// a value cut from it (records point into them until Kafka acknowledged
// them); reset starts a new chunk for the next batch.
type arena struct{ cur []byte }

const arenaChunk = 64 << 10

func (a *arena) copy(v []byte) []byte {
	if len(v) == 0 {
		// Not a slice of a chunk not made yet, which is nil: NULL.
		return []byte{}
	}
	if len(v) > arenaChunk/8 {
		return append([]byte(nil), v...)
	}
	if cap(a.cur)-len(a.cur) < len(v) {
		a.cur = make([]byte, 0, arenaChunk)
	}
	start := len(a.cur)
	a.cur = append(a.cur, v...)
	return a.cur[start:len(a.cur):len(a.cur)]
}

func (a *arena) reset() { a.cur = nil }
