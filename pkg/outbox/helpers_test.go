package outbox

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// testTimeout bounds each integration test's database work.
const testTimeout = 2 * time.Minute

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// testTx is a transaction of either driver, for tests that run the same
// steps through pgx and database/sql.
type testTx interface {
	exec(ctx context.Context, query string, args ...any) error
	write(ctx context.Context, w *Writer, events ...Event) ([]string, error)
	process(ctx context.Context, d *Dedup, id string) (bool, error)
	commit(ctx context.Context) error
	rollback(ctx context.Context) error
}

// testConn is one connection of either driver.
type testConn interface {
	begin(ctx context.Context) (testTx, error)
}

type dbDriver struct {
	name string
	// open returns a new connection to dsn, closed at the end of the test.
	open func(t *testing.T, dsn string) testConn
}

var drivers = []dbDriver{
	{name: "pgx", open: openPgx},
	{name: "database_sql", open: openSQL},
}

type pgxConn struct{ c *pgx.Conn }

func openPgx(t *testing.T, dsn string) testConn {
	t.Helper()
	return pgxConn{connect(t, dsn)}
}

func (c pgxConn) begin(ctx context.Context) (testTx, error) {
	tx, err := c.c.Begin(ctx)
	return pgxTx{tx}, err
}

type pgxTx struct{ tx pgx.Tx }

func (t pgxTx) exec(ctx context.Context, query string, args ...any) error {
	_, err := t.tx.Exec(ctx, query, args...)
	return err
}

func (t pgxTx) write(ctx context.Context, w *Writer, events ...Event) ([]string, error) {
	return w.Write(ctx, t.tx, events...)
}

func (t pgxTx) process(ctx context.Context, d *Dedup, id string) (bool, error) {
	return d.Process(ctx, t.tx, id)
}

func (t pgxTx) commit(ctx context.Context) error   { return t.tx.Commit(ctx) }
func (t pgxTx) rollback(ctx context.Context) error { return t.tx.Rollback(ctx) }

type sqlConn struct{ c *sql.Conn }

// openSQL opens a database/sql pool (see sqlDriverName) and takes
// one dedicated connection from it, so that two testConns are two sessions.
func openSQL(t *testing.T, dsn string) testConn {
	t.Helper()
	db, err := sql.Open(sqlDriverName, dsn)
	if err != nil {
		t.Fatalf("sql.Open: %v", err)
	}
	t.Cleanup(func() { _ = db.Close() })
	c, err := db.Conn(testContext(t))
	if err != nil {
		t.Fatalf("database/sql connect: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return sqlConn{c}
}

func (c sqlConn) begin(ctx context.Context) (testTx, error) {
	tx, err := c.c.BeginTx(ctx, nil)
	return sqlTx{tx}, err
}

type sqlTx struct{ tx *sql.Tx }

func (t sqlTx) exec(ctx context.Context, query string, args ...any) error {
	_, err := t.tx.ExecContext(ctx, query, args...)
	return err
}

func (t sqlTx) write(ctx context.Context, w *Writer, events ...Event) ([]string, error) {
	return w.WriteSQL(ctx, t.tx, events...)
}

func (t sqlTx) process(ctx context.Context, d *Dedup, id string) (bool, error) {
	return d.ProcessSQL(ctx, t.tx, id)
}

func (t sqlTx) commit(context.Context) error   { return t.tx.Commit() }
func (t sqlTx) rollback(context.Context) error { return t.tx.Rollback() }

// connect opens a pgx connection closed at the end of the test.
func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(testContext(t), dsn)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// newDatabase returns the DSN of a fresh database and an admin connection
// to it.
func newDatabase(t *testing.T) (string, *pgx.Conn) {
	t.Helper()
	env := testenv.Require(t)
	dsn := env.NewDatabase(t)
	return dsn, connect(t, dsn)
}

func mustExec(t *testing.T, conn *pgx.Conn, query string, args ...any) {
	t.Helper()
	if _, err := conn.Exec(testContext(t), query, args...); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}

// createOutboxTable creates a table in Debezium's shape.
func createOutboxTable(t *testing.T, conn *pgx.Conn, table string) {
	t.Helper()
	mustExec(t, conn, `CREATE TABLE `+table+` (
		id            uuid         PRIMARY KEY,
		aggregatetype varchar(255) NOT NULL,
		aggregateid   varchar(255) NOT NULL,
		type          varchar(255) NOT NULL,
		payload       jsonb,
		created_at    timestamptz  NOT NULL DEFAULT now()
	)`)
}

// createSlot publishes the table's inserts and creates a logical slot that
// sees every change committed from now on.
func createSlot(t *testing.T, conn *pgx.Conn, table, publication, slot string) {
	t.Helper()
	mustExec(t, conn, `CREATE PUBLICATION `+publication+` FOR TABLE `+table+` WITH (publish = 'insert')`)
	mustExec(t, conn, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot)
}

func count(t *testing.T, conn *pgx.Conn, table string) int {
	t.Helper()
	var n int
	if err := conn.QueryRow(testContext(t), `SELECT count(*) FROM `+table).Scan(&n); err != nil {
		t.Fatalf("count %s: %v", table, err)
	}
	return n
}
