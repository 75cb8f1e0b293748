package replication

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
)

// ConnectKind classifies why a connection to PostgreSQL failed, so that the
// message can say what to check.
type ConnectKind int

const (
	ConnectOther        ConnectKind = iota
	ConnectDNS                      // the host name does not resolve
	ConnectRefused                  // nothing listens on host:port
	ConnectTimeout                  // no answer within the connect timeout
	ConnectTLS                      // TLS negotiation or certificate verification failed
	ConnectAuth                     // the password was wrong
	ConnectDenied                   // pg_hba.conf or a missing role turned us away
	ConnectNoDatabase               // the database does not exist
	ConnectNoPrivilege              // the role may not connect this way (REPLICATION missing)
	ConnectTooManyConns             // max_connections or max_wal_senders reached
	ConnectNotPostgres              // something that is not PostgreSQL answered on the port
)

func (k ConnectKind) String() string {
	switch k {
	case ConnectDNS:
		return "dns"
	case ConnectRefused:
		return "refused"
	case ConnectTimeout:
		return "timeout"
	case ConnectTLS:
		return "tls"
	case ConnectAuth:
		return "authentication"
	case ConnectDenied:
		return "denied"
	case ConnectNoDatabase:
		return "no-database"
	case ConnectNoPrivilege:
		return "privilege"
	case ConnectTooManyConns:
		return "too-many-connections"
	case ConnectNotPostgres:
		return "not-postgres"
	}
	return "other"
}

// ConnectError is a failed connection to PostgreSQL. Its text is one line:
// the target (host:port/database as user, never the DSN, which may hold a
// password), pgconn's reason without repeats, and what to check.
type ConnectError struct {
	Target      string // host:port/database as user
	User        string
	Replication bool // a replication connection
	Kind        ConnectKind
	Err         error
}

// newConnectError classifies err, a failure of pgconn.ConnectConfig with c.
func newConnectError(c *pgconn.Config, replication bool, err error) *ConnectError {
	return &ConnectError{Target: target(c), User: c.User, Replication: replication, Kind: classifyConnect(err), Err: err}
}

func (e *ConnectError) Error() string {
	what := "connect to PostgreSQL at " + e.Target
	if e.Replication {
		what += " for replication"
	}
	return fmt.Sprintf("replication: %s: %s; %s", what, e.Reason(), e.Hint())
}

func (e *ConnectError) Unwrap() error { return e.Err }

// Refused tells whether the server answered and turned us away, as
// opposed to not answering at all.
func (e *ConnectError) Refused() bool {
	switch e.Kind {
	case ConnectAuth, ConnectDenied, ConnectNoDatabase, ConnectNoPrivilege, ConnectTooManyConns:
		return true
	}
	return false
}

// Reason is pgconn's error on one line, without its "failed to connect to
// `user=... database=...`:" prefix (the target is named already) and
// without repeats: with sslmode=prefer pgconn tries TLS and then plain
// text and lists both attempts.
func (e *ConnectError) Reason() string {
	s := e.Err.Error()
	if strings.HasPrefix(s, "failed to connect to `") {
		if i := strings.Index(s, "`:"); i >= 0 {
			s = s[i+2:]
		}
	}
	var parts []string
	for _, p := range strings.Split(s, "\n") {
		p = strings.TrimSpace(p)
		if p == "" || slices.Contains(parts, p) {
			continue
		}
		parts = append(parts, p)
	}
	// "server refused TLS connection" is only the first half of a
	// preferred-TLS attempt; the next line says what happened in plain text.
	if len(parts) > 1 {
		parts = slices.DeleteFunc(parts, func(p string) bool { return strings.HasSuffix(p, "tls error: server refused TLS connection") })
	}
	// pgconn names the host it tried ahead of each line ("127.0.0.1:5432
	// (127.0.0.1): "); a name lookup failure repeats itself below it.
	if e.Kind == ConnectDNS && len(parts) > 1 {
		parts = parts[:1]
	}
	return strings.Join(parts, "; ")
}

// Hint says what to check for this kind of failure.
func (e *ConnectError) Hint() string {
	host, _, _ := strings.Cut(e.Target, "/")
	switch e.Kind {
	case ConnectDNS:
		return "check the host name in postgres.dsn and this machine's DNS (resolv.conf)"
	case ConnectRefused:
		return fmt.Sprintf("check that PostgreSQL runs and listens on %s (listen_addresses, port) and the host and port in postgres.dsn", host)
	case ConnectTimeout:
		return fmt.Sprintf("check that %s is reachable from here (network, firewall, security groups); raise postgres.connect.timeout if the server is merely slow", host)
	case ConnectTLS:
		return "check sslmode, sslrootcert, sslcert and sslkey in postgres.dsn against the server's certificate and ssl setting"
	case ConnectAuth:
		return "check the user and its password: postgres.password, postgres.password.file, the DSN's password, PGPASSWORD or ~/.pgpass"
	case ConnectDenied:
		kind := "all"
		if e.Replication {
			kind = "replication"
		}
		return fmt.Sprintf("check that the role exists and that pg_hba.conf has a line for it (database %s or the database name) from this host, then SELECT pg_reload_conf(); if the server only allows hostssl, set sslmode in postgres.dsn", kind)
	case ConnectNoDatabase:
		return "create the database or correct the database name in postgres.dsn"
	case ConnectNoPrivilege:
		return fmt.Sprintf("give the role the REPLICATION attribute (ALTER ROLE %s REPLICATION) or use a role that has it", quoteIdent(e.User))
	case ConnectTooManyConns:
		return "the server has no free connection or WAL sender slot: raise max_connections or max_wal_senders, or find what holds them (pg_stat_activity)"
	case ConnectNotPostgres:
		return fmt.Sprintf("what answers on %s does not speak PostgreSQL's protocol: check the host and port in postgres.dsn", host)
	}
	return "check postgres.dsn and the server's log"
}

func classifyConnect(err error) ConnectKind {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code {
		case "28P01":
			return ConnectAuth
		case "28000":
			return ConnectDenied
		case "3D000":
			return ConnectNoDatabase
		case "42501":
			return ConnectNoPrivilege
		case "53300":
			return ConnectTooManyConns
		}
		return ConnectOther
	}
	var dns *net.DNSError
	if errors.As(err, &dns) {
		return ConnectDNS
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		return ConnectRefused
	}
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		return ConnectTimeout
	}
	if notPostgres(err) {
		return ConnectNotPostgres
	}
	var (
		unknownAuthority x509.UnknownAuthorityError
		hostname         x509.HostnameError
		invalid          x509.CertificateInvalidError
		recordHeader     tls.RecordHeaderError
		verify           *tls.CertificateVerificationError
	)
	if errors.As(err, &unknownAuthority) || errors.As(err, &hostname) || errors.As(err, &invalid) ||
		errors.As(err, &recordHeader) || errors.As(err, &verify) {
		return ConnectTLS
	}
	if s := err.Error(); strings.Contains(s, "tls error") && !strings.Contains(s, "server error") {
		return ConnectTLS
	}
	return ConnectOther
}

// target names where c points without the password: host:port/database as
// user, or the socket path for a unix socket.
func target(c *pgconn.Config) string {
	addr := fmt.Sprintf("%s:%d", c.Host, c.Port)
	if strings.HasPrefix(c.Host, "/") {
		addr = fmt.Sprintf("%s/.s.PGSQL.%d", c.Host, c.Port)
	}
	return fmt.Sprintf("%s/%s as %s", addr, c.Database, c.User)
}

// IsShuttingDown reports whether err says the server is shutting down: a
// new connection refused because a shutdown is under way (57P03). A
// connection ended by 57P01 is not enough: pg_terminate_backend ends one the
// same way on a server that goes on.
func IsShuttingDown(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "57P03" // cannot_connect_now
}

// IsConnError reports whether err ended the replication connection, so that
// nothing more can be sent on it (a final status update included).
func IsConnError(err error) bool {
	if err == nil {
		return false
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return true
	}
	return errors.Is(err, ErrStreamEnded) || errors.Is(err, ErrReceive)
}

// notPostgres recognises an answer that is not PostgreSQL's: a first byte
// that is neither yes nor no to the TLS request, or a reply to the startup
// message that is no PostgreSQL message at all.
func notPostgres(err error) bool {
	s := err.Error()
	for _, sign := range []string{"invalid body length", "unexpected message type", "received unexpected message", "invalid message", "bad message", "unknown message type", "expected AuthenticationRequest", "unexpected EOF"} {
		if strings.Contains(s, sign) {
			return !strings.Contains(s, "SQLSTATE") && (sign != "unexpected EOF" || strings.Contains(s, "server refused TLS connection"))
		}
	}
	return false
}
