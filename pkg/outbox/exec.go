package outbox

import (
	"context"
	"database/sql"

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

// execer runs one statement and returns the number of rows it affected;
// it hides the difference between pgx and database/sql from the writers.
type execer interface {
	exec(ctx context.Context, query string, args []any) (int64, error)
}

type pgxExec struct{ db PgxExecer }

func (e pgxExec) exec(ctx context.Context, query string, args []any) (int64, error) {
	tag, err := e.db.Exec(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

type sqlExec struct{ db SQLExecer }

func (e sqlExec) exec(ctx context.Context, query string, args []any) (int64, error) {
	res, err := e.db.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}
