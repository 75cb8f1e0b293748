package replication

import (
	"context"
	"net"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// These cases cannot be produced on demand with the real server on
// loopback: a name that does not resolve (the test may not ask a DNS
// server; pgconn's LookupFunc stands in for the resolver), a server that
// accepts and never answers (a silent loopback listener), and a password
// failure (the test server trusts loopback; the error pgconn wraps is
// built by hand). The cases the real server can produce are in
// connerr_test.go.
func TestConnectErrorKindsWithoutAServer(t *testing.T) {
	t.Parallel()
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { silent.Close() })
	held := make(chan net.Conn, 4)
	go func() { // owned by the listener: Accept fails once it is closed
		for {
			c, err := silent.Accept()
			if err != nil {
				close(held)
				return
			}
			held <- c
		}
	}()
	t.Cleanup(func() {
		silent.Close()
		for c := range held {
			c.Close()
		}
	})

	// A server that speaks something else: it answers any connection with
	// an HTTP error and hangs up.
	web, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	webDone := make(chan struct{})
	go func() { // owned by the test: ends when the listener is closed
		defer close(webDone)
		for {
			c, err := web.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"))
			c.Close()
		}
	}()
	t.Cleanup(func() { web.Close(); <-webDone })

	connect := func(dsn string, edit func(*pgconn.Config)) *ConnectError {
		t.Helper()
		c, err := pgconn.ParseConfig(dsn)
		if err != nil {
			t.Fatal(err)
		}
		if edit != nil {
			edit(c)
		}
		conn, err := pgconn.ConnectConfig(context.Background(), c)
		if err == nil {
			conn.Close(context.Background())
			t.Fatalf("%s: connected", dsn)
		}
		return newConnectError(c, false, err)
	}
	cases := []struct {
		name  string
		err   *ConnectError
		kind  ConnectKind
		words []string
	}{
		{"dns", connect("postgres://app:hunter22@db.example.test:5432/shop?sslmode=disable", func(c *pgconn.Config) {
			c.LookupFunc = func(ctx context.Context, host string) ([]string, error) {
				return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
			}
		}), ConnectDNS, []string{"db.example.test:5432/shop as app", "no such host", "host name in postgres.dsn", "DNS"}},
		{"timeout", connect("postgres://app:hunter22@"+silent.Addr().String()+"/shop?sslmode=disable&connect_timeout=1", nil),
			ConnectTimeout, []string{silent.Addr().String(), "reachable", "postgres.connect.timeout"}},
		{"not PostgreSQL, TLS preferred", connect("postgres://app:hunter22@"+web.Addr().String()+"/shop?connect_timeout=5", nil),
			ConnectNotPostgres, []string{web.Addr().String(), "does not speak PostgreSQL", "port"}},
		{"not PostgreSQL, no TLS", connect("postgres://app:hunter22@"+web.Addr().String()+"/shop?sslmode=disable&connect_timeout=5", nil),
			ConnectNotPostgres, []string{web.Addr().String(), "does not speak PostgreSQL"}},
		{"password", newConnectError(&pgconn.Config{Host: "db", Port: 5432, Database: "shop", User: "app"}, true,
			&pgconn.PgError{Severity: "FATAL", Code: "28P01", Message: `password authentication failed for user "app"`}),
			ConnectAuth, []string{"for replication", "password authentication failed", "check the user and its password", "postgres.password.file"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			msg := c.err.Error()
			t.Log(msg)
			if c.err.Kind != c.kind {
				t.Errorf("kind %v, want %v", c.err.Kind, c.kind)
			}
			if strings.Contains(msg, "\n") {
				t.Errorf("message is not one line: %q", msg)
			}
			if strings.Contains(msg, "hunter22") {
				t.Errorf("message shows the password: %q", msg)
			}
			for _, w := range c.words {
				if !strings.Contains(msg, w) {
					t.Errorf("message %q lacks %q", msg, w)
				}
			}
		})
	}
}
