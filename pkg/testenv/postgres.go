package testenv

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// pgTimeout bounds creating or dropping a test database.
const pgTimeout = time.Minute

// NewDatabase creates an empty database for the test and returns its
// superuser DSN. At the end of the test it drops the database, after
// terminating its connections (walsenders included) and dropping its
// replication slots, which would otherwise keep it alive.
func (e *Env) NewDatabase(t testing.TB) (dsn string) {
	t.Helper()
	return e.newDatabase(t, "")
}

// NewDatabaseEncoded is NewDatabase with the database in encoding (a
// server encoding such as LATIN1), in the C locale, which every encoding
// accepts.
func (e *Env) NewDatabaseEncoded(t testing.TB, encoding string) (dsn string) {
	t.Helper()
	return e.newDatabase(t, " ENCODING "+quoteLiteral(encoding)+" LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0")
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// newDatabase creates the test's database with the CREATE DATABASE
// options given.
func (e *Env) newDatabase(t testing.TB, options string) (dsn string) {
	t.Helper()
	name := UniqueName(t, "db")
	dsn, err := withDatabase(e.PGDSN, name)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), pgTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, e.PGDSN)
	if err != nil {
		t.Fatalf("testenv: connect to PostgreSQL: %v", err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	e.checkServerVersion(t, ctx, conn)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+options); err != nil {
		t.Fatalf("testenv: create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		if err := e.ensureUp(); err != nil {
			t.Errorf("testenv: %v", err)
			return
		}
		if err := e.dropDatabase(name); err != nil {
			t.Errorf("testenv: drop database %s: %v", name, err)
		}
	})
	return dsn
}

// serverVersion is the server's version as first read by this test process.
var serverVersion struct {
	sync.Mutex
	version string // server_version, e.g. "18.4"
	num     int    // server_version_num, e.g. 180004
}

// ServerVersion returns the server's major version (15, 18, ...) and its
// server_version text.
func (e *Env) ServerVersion(t testing.TB) (major int, version string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), pgTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, e.PGDSN)
	if err != nil {
		t.Fatalf("testenv: connect to PostgreSQL: %v", err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	return e.checkServerVersion(t, ctx, conn)
}

// checkServerVersion reads the server's version once per process and fails
// the test when it is not the major version the environment was made with,
// so that a misconfigured run cannot test one version in the name of
// another.
func (e *Env) checkServerVersion(t testing.TB, ctx context.Context, conn *pgx.Conn) (major int, version string) {
	t.Helper()
	serverVersion.Lock()
	defer serverVersion.Unlock()
	if serverVersion.num == 0 {
		err := conn.QueryRow(ctx, "SELECT current_setting('server_version'), current_setting('server_version_num')::int").
			Scan(&serverVersion.version, &serverVersion.num)
		if err != nil {
			t.Fatalf("testenv: read the server's version: %v", err)
		}
	}
	major = serverVersion.num / 10000
	if e.PGMajor != 0 && major != e.PGMajor {
		t.Fatalf("testenv: the server is PostgreSQL %s, but the environment was made for PostgreSQL %d (%s)", serverVersion.version, e.PGMajor, envPGMajor)
	}
	return major, serverVersion.version
}

// dropDatabase drops the database with everything that holds it: slots are
// per database and a database with slots cannot be dropped, an active slot
// cannot be dropped until its walsender is gone, and DROP DATABASE ... WITH
// (FORCE) terminates ordinary backends but not walsenders of active slots.
func (e *Env) dropDatabase(name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), pgTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, e.PGDSN)
	if err != nil {
		return fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer func() { _ = conn.Close(context.Background()) }()

	for {
		_, err := conn.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE datname = $1 AND pid <> pg_backend_pid()`, name)
		if err != nil {
			return fmt.Errorf("terminate connections: %w", err)
		}
		rows, err := conn.Query(ctx, `SELECT slot_name, active_pid FROM pg_replication_slots WHERE database = $1`, name)
		if err != nil {
			return fmt.Errorf("list replication slots: %w", err)
		}
		type slot struct {
			name string
			pid  *int32
		}
		slots, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (slot, error) {
			var s slot
			err := r.Scan(&s.name, &s.pid)
			return s, err
		})
		if err != nil {
			return fmt.Errorf("list replication slots: %w", err)
		}
		if len(slots) == 0 {
			break
		}
		for _, s := range slots {
			if s.pid != nil {
				_, err = conn.Exec(ctx, `SELECT pg_terminate_backend($1)`, *s.pid)
			} else {
				// It may turn active again (a client reconnecting) or vanish
				// (a temporary slot): the loop looks again either way.
				_, err = conn.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name)
					FROM pg_replication_slots WHERE slot_name = $1 AND NOT active`, s.name)
			}
			if err != nil && !isObjectInUse(err) && !isUndefinedObject(err) {
				return fmt.Errorf("drop replication slot %s: %w", s.name, err)
			}
		}
		select {
		case <-ctx.Done():
			names := make([]string, len(slots))
			for i, s := range slots {
				names[i] = s.name
			}
			return fmt.Errorf("replication slots still there after %s: %v", pgTimeout, names)
		case <-time.After(50 * time.Millisecond):
		}
	}
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return err
	}
	return nil
}

func isObjectInUse(err error) bool { return sqlState(err) == "55006" }

func isUndefinedObject(err error) bool { return sqlState(err) == "42704" }

func sqlState(err error) string {
	var pgErr interface{ SQLState() string }
	if errors.As(err, &pgErr) {
		return pgErr.SQLState()
	}
	return ""
}

// withDatabase returns dsn with its database replaced.
func withDatabase(dsn, name string) (string, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", fmt.Errorf("parse %s: %w", envPGDSN, err)
		}
		u.Path = "/" + name
		u.RawPath = ""
		return u.String(), nil
	}
	// keyword=value form: a later keyword wins.
	return dsn + " dbname=" + name, nil
}

// ConnectPG opens a connection to dsn, closed when the test ends.
func ConnectPG(t testing.TB, dsn string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}
