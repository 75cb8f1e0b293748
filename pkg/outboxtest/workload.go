package outboxtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	mrand "math/rand/v2"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/checkpoint"
)

// Event is one committed (or rolled back) outbox row as the writer wrote it.
type Event struct {
	ID            string
	AggregateType string
	AggregateID   string
	Type          string
	Payload       string // JSON text as inserted
	Seq           int    // position in commit order, from 0
	// TxnLow < the transaction's commit end LSN <= TxnHigh.
	TxnLow, TxnHigh checkpoint.LSN
}

// Topic is the topic the default router options give the event.
func (e Event) Topic() string { return "outbox.event." + e.AggregateType }

// Shape chooses what transactions the writer produces. Percentages are of
// all transactions; what is left writes outbox rows and commits.
type Shape struct {
	MinRows, MaxRows int      // outbox rows per transaction
	Aggregates       int      // distinct aggregate ids
	AggregateTypes   []string // routing values
	RollbackPct      int      // transactions that roll back
	DeletePct        int      // transactions that delete their outbox rows again before commit
	OtherTablePct    int      // transactions that touch only the other table
	PayloadBytes     int      // padding added to each payload
}

// DefaultShape is the mix the delivery and fault tests use.
func DefaultShape() Shape {
	return Shape{MinRows: 1, MaxRows: 50, Aggregates: 100, AggregateTypes: []string{"Order", "Customer", "Payment"},
		RollbackPct: 10, DeletePct: 10, OtherTablePct: 10, PayloadBytes: 32}
}

// Writer writes transactions to an outbox table and remembers what it did.
// It is not safe for concurrent use.
type Writer struct {
	conn       *pgx.Conn
	table      string
	shape      Shape
	rng        *mrand.Rand
	Committed  []Event          // in commit order
	RolledBack map[string]Event // by id
	// Uncertain holds events whose COMMIT failed (the server went away
	// during it): they may or may not have committed.
	Uncertain map[string]Event
	Txns      int // transactions attempted
	// BatchRows caps the rows of one INSERT statement (default 1000), so
	// large transactions stay under PostgreSQL's bind parameter limit.
	BatchRows int
	seq       int
}

// Setup creates the outbox table (Debezium's shape) and a business table
// named <table>_other that is not in any publication.
func Setup(ctx context.Context, conn *pgx.Conn, table string) error {
	_, err := conn.Exec(ctx, fmt.Sprintf(`
		CREATE TABLE IF NOT EXISTS %[1]s (
			id uuid PRIMARY KEY, aggregatetype varchar(255) NOT NULL, aggregateid varchar(255) NOT NULL,
			type varchar(255) NOT NULL, payload jsonb, created_at timestamptz NOT NULL DEFAULT now());
		CREATE TABLE IF NOT EXISTS %[1]s_other (id bigserial PRIMARY KEY, note text NOT NULL);`, table))
	if err != nil {
		return fmt.Errorf("outboxtest: create tables: %w", err)
	}
	return nil
}

// NewWriter returns a writer with a seeded random source (so a failing run
// can be repeated with the same seed).
func NewWriter(conn *pgx.Conn, table string, shape Shape, seed uint64) *Writer {
	return &Writer{conn: conn, table: table, shape: shape, rng: mrand.New(mrand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		RolledBack: map[string]Event{}, Uncertain: map[string]Event{}}
}

// SetConn replaces the writer's connection, after the old one broke.
func (w *Writer) SetConn(conn *pgx.Conn) { w.conn = conn }

// fail records evs as never committed (an error before COMMIT aborts the
// transaction) and returns err.
func (w *Writer) fail(evs []Event, err error) error {
	for _, e := range evs {
		w.RolledBack[e.ID] = e
	}
	return err
}

// NewID returns a random (version 4) UUID in canonical text form.
func NewID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// Events returns how many committed events the writer has produced.
func (w *Writer) Events() int { return len(w.Committed) }

// Txn runs one transaction of the configured shape.
func (w *Writer) Txn(ctx context.Context) error {
	w.Txns++
	roll := w.rng.IntN(100)
	s := w.shape
	tx, err := w.conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("outboxtest: begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after commit
	if roll < s.OtherTablePct {
		if _, err := tx.Exec(ctx, "INSERT INTO "+w.table+"_other (note) VALUES ('business change only')"); err != nil {
			return fmt.Errorf("outboxtest: other table: %w", err)
		}
		return tx.Commit(ctx)
	}
	n := s.MinRows
	if s.MaxRows > s.MinRows {
		n += w.rng.IntN(s.MaxRows - s.MinRows + 1)
	}
	evs := make([]Event, n)
	pad := strings.Repeat("x", s.PayloadBytes)
	for i := range evs {
		agg := w.rng.IntN(s.Aggregates)
		e := Event{
			ID:            NewID(),
			AggregateType: s.AggregateTypes[agg%len(s.AggregateTypes)],
			AggregateID:   fmt.Sprintf("agg-%d", agg),
			Type:          "Created",
		}
		e.Payload = fmt.Sprintf(`{"agg": %q, "pad": %q, "seq": %d}`, e.AggregateID, pad, w.seq+i)
		evs[i] = e
	}
	batch := w.BatchRows
	if batch <= 0 {
		batch = 1000
	}
	for from := 0; from < n; from += batch {
		part := evs[from:min(n, from+batch)]
		var sql strings.Builder
		sql.WriteString("INSERT INTO " + w.table + " (id, aggregatetype, aggregateid, type, payload) VALUES ")
		args := make([]any, 0, 5*len(part))
		for i, e := range part {
			if i > 0 {
				sql.WriteString(", ")
			}
			fmt.Fprintf(&sql, "($%d, $%d, $%d, $%d, $%d)", 5*i+1, 5*i+2, 5*i+3, 5*i+4, 5*i+5)
			args = append(args, e.ID, e.AggregateType, e.AggregateID, e.Type, e.Payload)
		}
		if _, err := tx.Exec(ctx, sql.String(), args...); err != nil {
			return w.fail(evs, fmt.Errorf("outboxtest: insert %d rows: %w", len(part), err))
		}
	}
	if _, err := tx.Exec(ctx, "INSERT INTO "+w.table+"_other (note) VALUES ('with events')"); err != nil {
		return w.fail(evs, fmt.Errorf("outboxtest: other table: %w", err))
	}
	roll -= s.OtherTablePct
	if roll < s.RollbackPct {
		for _, e := range evs {
			w.RolledBack[e.ID] = e
		}
		return tx.Rollback(ctx)
	}
	roll -= s.RollbackPct
	if roll < s.DeletePct {
		ids := make([]string, n)
		for i, e := range evs {
			ids[i] = e.ID
		}
		if _, err := tx.Exec(ctx, "DELETE FROM "+w.table+" WHERE id = ANY($1::uuid[])", ids); err != nil {
			return w.fail(evs, fmt.Errorf("outboxtest: delete: %w", err))
		}
	}
	var lo, hi checkpoint.LSN
	if err := tx.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan((*lsnText)(&lo)); err != nil {
		return w.fail(evs, fmt.Errorf("outboxtest: read LSN: %w", err))
	}
	if err := tx.Commit(ctx); err != nil {
		// The outcome of a failed COMMIT is unknown: the events may or may
		// not arrive. They keep their place in the commit order.
		for i := range evs {
			evs[i].Seq = w.seq
			evs[i].TxnLow, evs[i].TxnHigh = lo, ^checkpoint.LSN(0)
			w.Uncertain[evs[i].ID] = evs[i]
			w.seq++
		}
		return fmt.Errorf("outboxtest: commit (outcome unknown): %w", err)
	}
	if err := w.conn.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan((*lsnText)(&hi)); err != nil {
		// Committed; the upper bound is unknown.
		hi = ^checkpoint.LSN(0)
	}
	for i := range evs {
		evs[i].Seq = w.seq
		evs[i].TxnLow, evs[i].TxnHigh = lo, hi
		w.seq++
	}
	w.Committed = append(w.Committed, evs...)
	if hi == ^checkpoint.LSN(0) {
		return fmt.Errorf("outboxtest: committed, but the connection failed after the commit")
	}
	return nil
}

// Check verifies delivered against what the writer did. Uncertain events
// that were delivered count as committed (in their place in commit order);
// those that were not are neither missing nor unexpected.
func (w *Writer) Check(delivered []Delivered, restarts []Restart) Report {
	committed := w.Committed
	if len(w.Uncertain) > 0 {
		got := map[string]bool{}
		for _, d := range delivered {
			got[d.ID] = true
		}
		committed = append([]Event(nil), w.Committed...)
		for id, e := range w.Uncertain {
			if got[id] {
				committed = append(committed, e)
			}
		}
		sort.Slice(committed, func(i, j int) bool { return committed[i].Seq < committed[j].Seq })
	}
	return Check(committed, w.RolledBack, delivered, restarts)
}

// lsnText scans PostgreSQL's text form of an LSN.
type lsnText checkpoint.LSN

func (l *lsnText) Scan(src any) error {
	s, ok := src.(string)
	if !ok {
		return fmt.Errorf("LSN: want text, got %T", src)
	}
	v, err := ParseLSN(s)
	*l = lsnText(v)
	return err
}

// ParseLSN parses PostgreSQL's "16/B374D848" form.
func ParseLSN(s string) (checkpoint.LSN, error) {
	var hi, lo uint32
	if _, err := fmt.Sscanf(s, "%X/%X", &hi, &lo); err != nil {
		return 0, fmt.Errorf("parse LSN %q: %w", s, err)
	}
	return checkpoint.LSN(uint64(hi)<<32 | uint64(lo)), nil
}
