package replication

import (
	"context"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/pgoutbox/pkg/secret"
)

// ErrInvalidDSN is wrapped by the error of a DSN that does not parse.
var ErrInvalidDSN = errors.New("replication: postgres.dsn is not a valid connection string (its text is not shown because it may hold a password)")

// SQLConfig parses the DSN for an ordinary (non-replication) connection and
// applies password or password.file. TLS comes from the DSN as libpq has it
// (sslmode, sslrootcert, sslcert, sslkey, or PGSSLMODE and friends in the
// environment). Its errors quote neither the DSN nor the password.
func (c *Config) SQLConfig() (*pgx.ConnConfig, error) {
	pcfg, err := pgx.ParseConfig(c.DSN)
	if err != nil {
		return nil, invalidDSN(err)
	}
	if err := c.applyPassword(&pcfg.Config); err != nil {
		return nil, err
	}
	return pcfg, nil
}

// valueFormat are the settings by which PostgreSQL writes a value as text
// the way the router reads it, and as Debezium's JDBC connection asks for
// it: UTF-8, ISO dates, PostgreSQL's intervals, hex bytea and floats that
// round-trip. The walsender writes every column with its session's
// settings, which come from the database, the role and postgresql.conf:
// with DateStyle 'SQL, DMY' a timestamp the router reads made every row
// poison, extra_float_digits=0 rounded floats, and a LATIN1 database's
// text reached Kafka as LATIN1 bytes. Set after connecting, not as startup
// parameters, which connection poolers (PgBouncer) refuse in part.
const valueFormat = "SET client_encoding = 'UTF8'; SET DateStyle = 'ISO, MDY'; SET IntervalStyle = 'postgres'; SET extra_float_digits = 3; SET bytea_output = 'hex'"

// setValueFormat is an AfterConnect that sets valueFormat after after.
// The session's time zone is left as the server's users have it: it gives
// timestamp columns without a zone (a poll table's created_at or
// published_at, compared with now()) their meaning, and instants are read
// with their offset whatever it is.
func setValueFormat(after func(context.Context, *pgconn.PgConn) error) func(context.Context, *pgconn.PgConn) error {
	return func(ctx context.Context, c *pgconn.PgConn) error {
		if after != nil {
			if err := after(ctx, c); err != nil {
				return err
			}
		}
		if err := c.Exec(ctx, valueFormat).Close(); err != nil {
			return fmt.Errorf("replication: set how values are written (%s): %w", valueFormat, err)
		}
		return nil
	}
}

// replicationConfig is SQLConfig for the replication connection. It keeps
// every TLS setting of the DSN: only replication=database and the
// application name are added.
func (c *Config) replicationConfig() (*pgconn.Config, error) {
	pcfg, err := pgconn.ParseConfig(c.DSN)
	if err != nil {
		return nil, invalidDSN(err)
	}
	if err := c.applyPassword(pcfg); err != nil {
		return nil, err
	}
	if pcfg.RuntimeParams == nil {
		pcfg.RuntimeParams = map[string]string{}
	}
	pcfg.RuntimeParams["replication"] = "database"
	pcfg.RuntimeParams["application_name"] = "pgoutbox"
	pcfg.AfterConnect = setValueFormat(pcfg.AfterConnect)
	// A server that stops acknowledging what is sent ends the connection
	// within replicationUserTimeout; TCP keepalives find an idle one gone.
	d := net.Dialer{KeepAlive: 15 * time.Second, Control: func(network, _ string, rc syscall.RawConn) error {
		if !strings.HasPrefix(network, "tcp") {
			return nil // a unix socket
		}
		var serr error
		if err := rc.Control(func(fd uintptr) { serr = setUserTimeout(fd, replicationUserTimeout) }); err != nil {
			return err
		}
		return serr
	}}
	pcfg.DialFunc = d.DialContext
	if c.ReceiveBatchWait > 0 {
		wait := c.ReceiveBatchWait
		pcfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			nc, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return newPacedConn(nc, wait), nil
		}
	}
	return pcfg, nil
}

// connectReplication opens a replication connection for cfg, bounded by
// cfg.ConnectTimeout. A failure to connect is a *ConnectError, so every
// caller reports it the same way (and never quotes the DSN).
func connectReplication(ctx context.Context, cfg Config) (*pgconn.PgConn, error) {
	pcfg, err := cfg.replicationConfig()
	if err != nil {
		return nil, err
	}
	pcfg.ConnectTimeout = cfg.ConnectTimeout
	conn, err := pgconn.ConnectConfig(ctx, pcfg)
	if err != nil {
		return nil, newConnectError(pcfg, true, err)
	}
	return conn, nil
}

// replicationUserTimeout bounds how long data sent on the replication
// connection may stay unacknowledged by the server's host.
const replicationUserTimeout = time.Minute

// invalidDSN wraps a DSN parse error in ErrInvalidDSN. It says what pgconn
// found wrong, but never quotes the DSN: pgconn's own message quotes it,
// and its detail may quote parts of it (which may be a password), so
// quoted parts are blanked.
func invalidDSN(err error) error {
	var pe *pgconn.ParseConfigError
	if !errors.As(err, &pe) {
		return fmt.Errorf("%w: %w", ErrInvalidDSN, err)
	}
	text := pe.Error()
	if i := strings.LastIndex(text, "`: "); i >= 0 {
		text = text[i+3:]
	} else {
		text = "it does not parse"
	}
	text = quotedRE.ReplaceAllString(text, `"…"`)
	return fmt.Errorf("%w: %s", ErrInvalidDSN, text)
}

var quotedRE = regexp.MustCompile(`"[^"]*"|'[^']*'|` + "`[^`]*`")

// ValidateDSN parses the DSN as the connections will, to report a DSN that
// cannot work as a configuration error before anything connects.
func (c *Config) ValidateDSN() error {
	if _, err := pgconn.ParseConfig(c.DSN); err != nil {
		return invalidDSN(err)
	}
	return nil
}

// applyPassword sets the password from password or password.file, which
// take precedence over a password in the DSN, PGPASSWORD and a passfile.
// The file is read at every connection, so a rotated secret is used by the
// next session.
func (c *Config) applyPassword(pcfg *pgconn.Config) error {
	switch {
	case c.PasswordFile != "":
		pw, err := secret.ReadFile("postgres: password.file", c.PasswordFile)
		if err != nil {
			return err
		}
		pcfg.Password = pw
	case c.Password != "":
		pcfg.Password = c.Password
	}
	return nil
}
