package outbox

import (
	"context"
	"database/sql"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// PgxExecer is the part of *pgx.Conn, pgx.Tx and *pgxpool.Pool that the
// schema and maintenance helpers use.
type PgxExecer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// SQLExecer is the part of *sql.DB, *sql.Conn and *sql.Tx that the schema
// and maintenance helpers use.
type SQLExecer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// execer runs one statement and returns the number of rows it affected
// (for a SELECT, the rows it returned); it hides the difference between pgx
// and database/sql from the writers. queryRow scans the one row of a query
// into dest; only the writers' failure path uses it, with a transaction of
// either driver, which has it.
type execer interface {
	exec(ctx context.Context, query string, args []any) (int64, error)
	queryRow(ctx context.Context, query string, dest ...any) error
}

// errNoQueryRow is queryRow's error for a PgxExecer or SQLExecer that
// cannot query rows (never a transaction: pgx.Tx and *sql.Tx can).
var errNoQueryRow = errors.New("outbox: cannot query rows through this connection")

type pgxExec struct{ db PgxExecer }

func (e pgxExec) exec(ctx context.Context, query string, args []any) (int64, error) {
	tag, err := e.db.Exec(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

func (e pgxExec) queryRow(ctx context.Context, query string, dest ...any) error {
	q, ok := e.db.(interface {
		QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	})
	if !ok {
		return errNoQueryRow
	}
	return q.QueryRow(ctx, query).Scan(dest...)
}

type sqlExec struct{ db SQLExecer }

func (e sqlExec) exec(ctx context.Context, query string, args []any) (int64, error) {
	res, err := e.db.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (e sqlExec) queryRow(ctx context.Context, query string, dest ...any) error {
	q, ok := e.db.(interface {
		QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	})
	if !ok {
		return errNoQueryRow
	}
	return q.QueryRowContext(ctx, query).Scan(dest...)
}
