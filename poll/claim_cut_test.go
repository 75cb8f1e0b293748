package poll

import (
	"context"
	"slices"
	"testing"

	"github.com/pgoutbox/pgoutbox/migrations"
	"github.com/pgoutbox/pgoutbox/pkg/testenv"
)

// TestClaimKeepsNoMoreThanItsBytes: a claim keeps the rows, in sequence
// order, whose values fit its byte budget, and always the first one even
// when it alone is larger; it says it cut the batch, and the next claim
// takes the rest, in order. The sizes are the rows' text as the test wrote
// it (real PostgreSQL).
func TestClaimKeepsNoMoreThanItsBytes(t *testing.T) {
	env := testenv.Require(t)
	ctx := context.Background()
	conn := testenv.ConnectPG(t, env.NewDatabase(t))
	for _, sql := range []string{
		`CREATE TABLE outbox (id text PRIMARY KEY, aggregateid text, payload text,
			seq bigint GENERATED ALWAYS AS IDENTITY, published_at timestamptz, attempts integer NOT NULL DEFAULT 0, last_error text)`,
		// r1..r6 of 1,000 bytes of payload each, then r7 of 5,000.
		`INSERT INTO outbox (id, aggregateid, payload) SELECT 'r' || i, 'k' || (i % 2), repeat('x', CASE WHEN i = 7 THEN 5000 ELSE 1000 END) FROM generate_series(1, 8) i`,
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	if err := migrations.ApplyPoll(ctx, conn, migrations.PollParams{Table: "public.outbox"}); err != nil {
		t.Fatal(err)
	}
	tb, err := NewTable("public.outbox", "aggregateid", "id")
	if err != nil {
		t.Fatal(err)
	}
	if err := tb.Check(ctx, conn); err != nil {
		t.Fatal(err)
	}
	claimer := NewClaimer(conn, tb, DefaultConfig())
	// claim takes a batch with budget bytes, publishes what it kept and
	// returns its ids.
	claim := func(budget int64) ([]string, bool, int) {
		t.Helper()
		b, err := claimer.Claim(ctx, nil, nil, 100, budget)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		var published []int
		for i, r := range b.Rows {
			ids = append(ids, string(r.Values[0]))
			published = append(published, i)
		}
		cut, bytes := b.Cut, b.Bytes
		if err := b.Finish(ctx, published, nil); err != nil {
			t.Fatal(err)
		}
		return ids, cut, bytes
	}
	// Each row's values: its id, key, payload, seq and attempts.
	ids, cut, bytes := claim(3500)
	if !slices.Equal(ids, []string{"r1", "r2", "r3"}) || !cut || bytes > 3500 {
		t.Fatalf("budget 3500: kept %v (cut %v, %d bytes), want r1..r3, cut", ids, cut, bytes)
	}
	ids, cut, _ = claim(3500)
	if !slices.Equal(ids, []string{"r4", "r5", "r6"}) || !cut {
		t.Fatalf("then: kept %v (cut %v), want r4..r6, cut", ids, cut)
	}
	// r7 alone is over the budget: kept all the same, or nothing would
	// ever move.
	ids, cut, bytes = claim(3500)
	if !slices.Equal(ids, []string{"r7"}) || !cut || bytes < 5000 {
		t.Fatalf("a row over the budget: kept %v (cut %v, %d bytes), want r7 alone, cut", ids, cut, bytes)
	}
	ids, cut, _ = claim(3500)
	if !slices.Equal(ids, []string{"r8"}) || cut {
		t.Fatalf("the last: kept %v (cut %v), want r8, not cut", ids, cut)
	}
}
