package replication_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap/zaptest"

	"github.com/pgoutbox/pgoutbox/pkg/testenv"
	"github.com/pgoutbox/pgoutbox/replication"
)

// TestValuesAreReadTheSameWhateverTheDatabasesSettings: the walsender
// writes each value as text with the session's settings, and a session
// takes them from the database, the role and postgresql.conf. The router
// reads ISO dates, PostgreSQL-style intervals, hex bytea, floats that
// round-trip and UTF-8 text, as Debezium's JDBC connection asks for them:
// with DateStyle 'SQL, DMY' a timestamp column used for the record's
// timestamp made every row poison, extra_float_digits=0 rounded floats
// silently, and in a LATIN1 database text and keys came as LATIN1 bytes
// (another partition than Debezium's). Every connection of pgoutbox sets
// them itself now; the SQL connections too (the poll source and the
// snapshot read rows with them).
func TestValuesAreReadTheSameWhateverTheDatabasesSettings(t *testing.T) {
	env := testenv.Require(t)
	for _, encoding := range []string{"UTF8", "LATIN1"} {
		t.Run(encoding, func(t *testing.T) {
			ctx := context.Background()
			dsn := env.NewDatabaseEncoded(t, encoding)
			admin := testenv.ConnectPG(t, dsn)
			db := admin.Config().Database
			// Slot names are the cluster's, not the database's.
			slot := strings.ToLower(testenv.UniqueName(t, "s"))
			for _, sql := range []string{
				fmt.Sprintf("ALTER DATABASE %s SET DateStyle = 'SQL, DMY'", pgx.Identifier{db}.Sanitize()),
				fmt.Sprintf("ALTER DATABASE %s SET IntervalStyle = 'iso_8601'", pgx.Identifier{db}.Sanitize()),
				fmt.Sprintf("ALTER DATABASE %s SET extra_float_digits = 0", pgx.Identifier{db}.Sanitize()),
				fmt.Sprintf("ALTER DATABASE %s SET bytea_output = 'escape'", pgx.Identifier{db}.Sanitize()),
				fmt.Sprintf("ALTER DATABASE %s SET client_encoding = '%s'", pgx.Identifier{db}.Sanitize(), encoding),
				"SET client_encoding = 'UTF8'", // this connection's
				"CREATE TABLE t (ts timestamp, f float8, iv interval, b bytea, s text, j jsonb)",
				"CREATE PUBLICATION p FOR TABLE t",
				"SELECT pg_create_logical_replication_slot('" + slot + "', 'pgoutput')",
				`INSERT INTO t VALUES ('2024-01-02 03:04:05.123456', 0.1::float8 + 0.2::float8, '1 day 02:03:04', '\x0a0b', 'café', '{"name": "café"}')`,
			} {
				if _, err := admin.Exec(ctx, sql); err != nil {
					t.Fatalf("%s: %v", sql, err)
				}
			}
			want := []string{"2024-01-02 03:04:05.123456", "0.30000000000000004", "1 day 02:03:04", `\x0a0b`, "café", `{"name": "café"}`}

			cfg := replication.DefaultConfig()
			cfg.DSN, cfg.Slot, cfg.Publication = dsn, slot, "p"
			st, err := replication.Open(ctx, cfg, 0, zaptest.NewLogger(t))
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close(context.WithoutCancel(ctx))
			var got []string
			deadline := time.Now().Add(30 * time.Second)
			for got == nil && time.Now().Before(deadline) {
				ev, err := st.Receive(ctx, time.Now().Add(time.Second))
				if err != nil {
					t.Fatal(err)
				}
				if ev.Change != nil {
					for _, v := range ev.Change.Values {
						got = append(got, string(v))
					}
				}
			}
			if strings.Join(got, "|") != strings.Join(want, "|") {
				t.Errorf("the stream's values:\n got %q\nwant %q", got, want)
			}

			conn, err := replication.ConnectSQL(ctx, cfg, "pgoutbox-test", 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(context.WithoutCancel(ctx))
			got = make([]string, 6)
			if err := conn.QueryRow(ctx, "SELECT ts::text, f::text, iv::text, b::text, s, j::text FROM t").Scan(&got[0], &got[1], &got[2], &got[3], &got[4], &got[5]); err != nil {
				t.Fatal(err)
			}
			if strings.Join(got, "|") != strings.Join(want, "|") {
				t.Errorf("a query's values:\n got %q\nwant %q", got, want)
			}
		})
	}
}
