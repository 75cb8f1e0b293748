package replication_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/pgoutbox/pgoutbox/pkg/testenv"
	"github.com/pgoutbox/pgoutbox/replication"
)

// withUser returns dsn with its user (and database, when db != "")
// replaced.
func withUser(t *testing.T, dsn, user, db string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(user)
	if db != "" {
		u.Path = "/" + db
	}
	return u.String()
}

// TestConnectErrorsSayWhatToCheck produces each connection failure the
// real server can produce on loopback and checks that the error is one
// line naming the target, is classified, and says what to check.
func TestConnectErrorsSayWhatToCheck(t *testing.T) {
	env := testenv.Require(t)
	dsn := env.NewDatabase(t)
	conn := connectStats(t, dsn)
	role := strings.ToLower(testenv.UniqueName(t, "norepl"))
	if _, err := conn.Exec(context.Background(), "CREATE ROLE "+role+" LOGIN"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c := connectStats(t, env.PGDSN)
		_, _ = c.Exec(context.Background(), "DROP ROLE IF EXISTS "+role)
	})
	sqlConnect := func(dsn string) error {
		c, err := replication.ConnectSQL(t.Context(), replication.Config{DSN: dsn}, "pgoutbox-test", 10*time.Second)
		if err == nil {
			c.Close(context.Background())
		}
		return err
	}
	replConnect := func(dsn string) error {
		cfg := replication.DefaultConfig()
		cfg.DSN = dsn
		st, err := replication.Open(t.Context(), cfg, 0, zaptest.NewLogger(t))
		if err == nil {
			st.Close(context.Background())
		}
		return err
	}
	cases := []struct {
		name    string
		err     error
		kind    replication.ConnectKind
		refused bool
		words   []string
	}{
		{"refused", sqlConnect("postgres://postgres@127.0.0.1:1/postgres?sslmode=disable"), replication.ConnectRefused, false,
			[]string{"127.0.0.1:1/postgres as postgres", "connection refused", "runs and listens on 127.0.0.1:1"}},
		{"no role", sqlConnect(withUser(t, dsn, "no_such_role", "")), replication.ConnectDenied, true,
			[]string{"as no_such_role", `role "no_such_role" does not exist`, "pg_hba.conf"}},
		{"no database", sqlConnect(withUser(t, dsn, "postgres", "no_such_db")), replication.ConnectNoDatabase, true,
			[]string{"/no_such_db as postgres", "does not exist", "create the database"}},
		{"no replication attribute", replConnect(withUser(t, dsn, role, "")), replication.ConnectNoPrivilege, true,
			[]string{"for replication", "as " + role, "ALTER ROLE \"" + role + "\" REPLICATION"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var ce *replication.ConnectError
			if !errors.As(c.err, &ce) {
				t.Fatalf("want a *replication.ConnectError, got %T %v", c.err, c.err)
			}
			msg := c.err.Error()
			t.Log(msg)
			if ce.Kind != c.kind || ce.Refused() != c.refused {
				t.Errorf("kind %v refused %v, want %v %v", ce.Kind, ce.Refused(), c.kind, c.refused)
			}
			if strings.Contains(msg, "\n") {
				t.Errorf("message is not one line: %q", msg)
			}
			if strings.Contains(msg, "server refused TLS") {
				t.Errorf("message keeps the preferred-TLS attempt: %q", msg)
			}
			for _, w := range c.words {
				if !strings.Contains(msg, w) {
					t.Errorf("message %q lacks %q", msg, w)
				}
			}
		})
	}
}
