package poll

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/pgoutbox/pgoutbox/migrations"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// TestHandWrittenAttemptsAndLastErrorColumnsRecordAFailure: an outbox
// table written by hand often has its own attempts (a nullable integer)
// and last_error (a varchar(n)), which migrate keeps. A batch with a row
// that failed, whose reason is longer than the column and holds a NUL, and
// a row Kafka acknowledged, is recorded: the failure counted, its reason
// cut to the column, the other row published; a row whose attempts is
// NULL is claimed, as one without an attempt. Once the reason made the
// statement that counts attempts fail, the whole batch rolled back (the
// acknowledged row was sent again and again, the failure never counted),
// and a NULL attempts failed every claim that reached the row. Columns
// that cannot work (not an integer, not a string, generated) are refused
// at the start, with the fix.
func TestHandWrittenAttemptsAndLastErrorColumnsRecordAFailure(t *testing.T) {
	env := testenv.Require(t)
	ctx := context.Background()
	dsn := env.NewDatabase(t)
	conn := testenv.ConnectPG(t, dsn)
	exec(t, conn, `CREATE TABLE outbox (id text PRIMARY KEY, aggregateid text, payload jsonb,
		seq bigint GENERATED ALWAYS AS IDENTITY, published_at timestamptz, attempts integer DEFAULT 0, last_error varchar(40))`)
	// Adds the keep triggers (and indexes): the columns stay as written.
	if err := migrations.ApplyPoll(ctx, conn, migrations.PollParams{Table: "public.outbox"}); err != nil {
		t.Fatal(err)
	}
	exec(t, conn, "INSERT INTO outbox (id, aggregateid, attempts) VALUES ('a', 'k', 0), ('b', 'o', 0), ('c', 'n', NULL)")
	tb, err := NewTable("public.outbox", "aggregateid", "id")
	if err != nil {
		t.Fatal(err)
	}
	if err := tb.Check(ctx, conn); err != nil {
		t.Fatalf("Check of a nullable attempts and a varchar(40) last_error: %v", err)
	}
	b, err := NewClaimer(conn, tb, DefaultConfig()).Claim(ctx, nil, nil, 100, math.MaxInt64)
	if err != nil {
		t.Fatalf("claim with a row whose attempts is NULL: %v", err)
	}
	if len(b.Rows) != 3 || b.Rows[2].Attempts != 0 {
		_ = b.Abort(ctx)
		t.Fatalf("claimed %d rows (want 3), the last with attempts %v (want 0)", len(b.Rows), b.Rows)
	}
	reason := "row seq 1 of public.outbox: router: \x00 a reason of more than forty characters, ünïcödé"
	if err := b.Finish(ctx, []int{1}, []Failure{{Index: 0, Err: reason}, {Index: 2, Err: "short"}}); err != nil {
		t.Fatalf("Finish with a reason longer than last_error: %v", err)
	}
	rows, err := conn.Query(ctx, "SELECT id, attempts, coalesce(last_error, ''), published_at IS NOT NULL FROM outbox ORDER BY seq")
	if err != nil {
		t.Fatal(err)
	}
	type state struct {
		id        string
		attempts  int
		lastError string
		published bool
	}
	var got []state
	for rows.Next() {
		var s state
		if err := rows.Scan(&s.id, &s.attempts, &s.lastError, &s.published); err != nil {
			t.Fatal(err)
		}
		got = append(got, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0].attempts != 1 || utf8.RuneCountInString(got[0].lastError) != 40 || !strings.HasPrefix(got[0].lastError, "row seq 1") ||
		got[0].published || !got[1].published || got[2].attempts != 1 || got[2].lastError != "short" {
		t.Fatalf("after Finish: %+v; want a counted once with the first 40 characters of its reason, b published, c counted once", got)
	}

	for _, c := range []struct{ ddl, want string }{
		{"ALTER TABLE outbox ALTER COLUMN attempts TYPE text", "ALTER COLUMN attempts TYPE integer"},
		{"ALTER TABLE outbox ALTER COLUMN last_error TYPE jsonb USING to_jsonb(last_error)", "ALTER COLUMN last_error TYPE text"},
		{"ALTER TABLE outbox DROP COLUMN last_error, ADD COLUMN last_error text GENERATED ALWAYS AS ('x') STORED", "last_error is a generated column"},
	} {
		exec(t, conn, "DROP TABLE outbox")
		exec(t, conn, `CREATE TABLE outbox (id text PRIMARY KEY, aggregateid text, payload jsonb,
			seq bigint GENERATED ALWAYS AS IDENTITY, published_at timestamptz, attempts integer NOT NULL DEFAULT 0, last_error text)`)
		exec(t, conn, c.ddl)
		if err := tb.Check(ctx, conn); !errors.Is(err, ErrLayout) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Check after %s: %v; want ErrLayout saying %q", c.ddl, err, c.want)
		}
	}
}

// TestLastErrorOfLimitedLengthTakesANonASCIIReasonInASQLASCIIDatabase: a
// last_error varchar(10) in a SQL_ASCII database, which counts bytes, and
// a reason of ten characters of two bytes each. The failure is recorded,
// the reason cut to ten bytes. Cut to ten characters only, the reason
// overflowed the column: the statement that counts attempts failed, and
// with it the whole batch, sent again for ever.
func TestLastErrorOfLimitedLengthTakesANonASCIIReasonInASQLASCIIDatabase(t *testing.T) {
	env := testenv.Require(t)
	ctx := context.Background()
	conn := testenv.ConnectPG(t, env.NewDatabaseEncoded(t, "SQL_ASCII"))
	exec(t, conn, `CREATE TABLE outbox (id text PRIMARY KEY, aggregateid text, payload jsonb,
		seq bigint GENERATED ALWAYS AS IDENTITY, published_at timestamptz, attempts integer NOT NULL DEFAULT 0, last_error varchar(10))`)
	if err := migrations.ApplyPoll(ctx, conn, migrations.PollParams{Table: "public.outbox"}); err != nil {
		t.Fatal(err)
	}
	exec(t, conn, "INSERT INTO outbox (id, aggregateid) VALUES ('a', 'k')")
	tb, err := NewTable("public.outbox", "aggregateid", "id")
	if err != nil {
		t.Fatal(err)
	}
	if err := tb.Check(ctx, conn); err != nil {
		t.Fatal(err)
	}
	b, err := NewClaimer(conn, tb, DefaultConfig()).Claim(ctx, nil, nil, 100, math.MaxInt64)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Rows) != 1 {
		_ = b.Abort(ctx)
		t.Fatalf("claimed %d rows, want 1", len(b.Rows))
	}
	if err := b.Finish(ctx, nil, []Failure{{Index: 0, Err: strings.Repeat("ü", 10)}}); err != nil {
		t.Fatalf("Finish with a reason of 10 characters, 20 bytes, into a varchar(10) of a SQL_ASCII database: %v", err)
	}
	var attempts, size int
	if err := conn.QueryRow(ctx, "SELECT attempts, octet_length(last_error) FROM outbox").Scan(&attempts, &size); err != nil {
		t.Fatal(err)
	}
	if attempts != 1 || size != 10 {
		t.Fatalf("after Finish: attempts %d, last_error of %d bytes; want 1 attempt and the reason cut to 10 bytes", attempts, size)
	}
}
