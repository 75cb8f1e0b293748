package poll

import (
	"context"
	"math"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/migrations"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// TestClaimHoldsBackTheRowsBehindOneItDidNotTake: the claim skips rows
// another transaction locks, and cannot see rows committed after its
// statement began; the later rows of their keys must not go first. A row
// locked by another transaction holds its key back (HeldKeys: the relay
// blocks it a moment); a row committed between the claim's two statements
// (made to land there by betweenClaimStatements, which a real server
// cannot do on demand) holds the later rows of its key back too, but only
// until the next claim (LateRows), which takes it first. Other keys go on.
func TestClaimHoldsBackTheRowsBehindOneItDidNotTake(t *testing.T) {
	env := testenv.Require(t)
	ctx := context.Background()
	dsn := env.NewDatabase(t)
	connect := func() *pgx.Conn { return testenv.ConnectPG(t, dsn) }
	conn, other := connect(), connect()
	exec := func(c *pgx.Conn, sql string, args ...any) {
		t.Helper()
		if _, err := c.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec(conn, `CREATE TABLE outbox (id text PRIMARY KEY, aggregateid text, payload jsonb,
		seq bigint GENERATED ALWAYS AS IDENTITY, published_at timestamptz, attempts integer NOT NULL DEFAULT 0, last_error text)`)
	if err := migrations.ApplyPoll(ctx, conn, migrations.PollParams{Table: "public.outbox"}); err != nil { // the keep triggers
		t.Fatal(err)
	}
	exec(conn, "SELECT set_config($1, 'on', false)", migrations.DeleteUnpublished) // the test's TRUNCATEs
	tb, err := NewTable("public.outbox", "aggregateid", "id")
	if err != nil {
		t.Fatal(err)
	}
	if err := tb.Check(ctx, conn); err != nil {
		t.Fatal(err)
	}
	claim := func() *Batch {
		t.Helper()
		b, err := NewClaimer(conn, tb, DefaultConfig()).Claim(ctx, nil, nil, 100, math.MaxInt64)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	ids := func(b *Batch) []string {
		var out []string
		for _, r := range b.Rows {
			out = append(out, string(r.Values[0]))
		}
		return out
	}

	t.Run("locked", func(t *testing.T) {
		exec(conn, "TRUNCATE outbox")
		exec(conn, "INSERT INTO outbox (id, aggregateid) VALUES ('k1', 'k'), ('o1', 'o'), ('k2', 'k'), ('o2', 'o')")
		tx, err := other.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck // the lock goes with it
		if _, err := tx.Exec(ctx, "SELECT 1 FROM outbox WHERE id = 'k1' FOR UPDATE"); err != nil {
			t.Fatal(err)
		}
		b := claim()
		defer b.Abort(ctx) //nolint:errcheck // a test's claim
		if got := ids(b); !slices.Equal(got, []string{"o1", "o2"}) || b.Held != 1 || !slices.Equal(b.HeldKeys, []string{"k"}) || b.LateRows {
			t.Fatalf("claim with k1 locked: rows %v, held %d, keys %v, late %v; want [o1 o2], 1, [k], false", got, b.Held, b.HeldKeys, b.LateRows)
		}
	})

	t.Run("committed-late", func(t *testing.T) {
		exec(conn, "TRUNCATE outbox")
		tx, err := other.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
		// k1 takes the lowest sequence, and commits last.
		if _, err := tx.Exec(ctx, "INSERT INTO outbox (id, aggregateid) VALUES ('k1', 'k')"); err != nil {
			t.Fatal(err)
		}
		exec(conn, "INSERT INTO outbox (id, aggregateid) VALUES ('o1', 'o'), ('k2', 'k'), ('o2', 'o')")
		betweenClaimStatements = func() {
			if err := tx.Commit(ctx); err != nil {
				t.Error(err)
			}
		}
		defer func() { betweenClaimStatements = nil }()
		b := claim()
		betweenClaimStatements = nil
		if got := ids(b); !slices.Equal(got, []string{"o1", "o2"}) || b.Held != 1 || len(b.HeldKeys) != 0 || !b.LateRows {
			t.Fatalf("claim with k1 committed between its statements: rows %v, held %d, keys %v, late %v; want [o1 o2], 1, [], true", got, b.Held, b.HeldKeys, b.LateRows)
		}
		if err := b.Abort(ctx); err != nil {
			t.Fatal(err)
		}
		// The next claim takes k1 first.
		b = claim()
		defer b.Abort(ctx) //nolint:errcheck // a test's claim
		if got := ids(b); !slices.Equal(got, []string{"k1", "o1", "k2", "o2"}) || b.Held != 0 {
			t.Fatalf("the next claim: rows %v, held %d; want [k1 o1 k2 o2], 0", got, b.Held)
		}
	})
}
